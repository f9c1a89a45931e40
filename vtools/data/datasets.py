"""Sample stores and the datasets that decode them.

A *store* gives random access to raw samples (a path or the encoded bytes, a label);
every reader in ``vtools.data.readers`` returns one. :class:`DecodedImages` turns any
store into decoded, transformed ``(image, label, index)`` items, so decoding, the
bad-image policy and keeping decoded images for later epochs are written once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from vtools.data.decode import BadSample, RawSample, open_image, refusal
from vtools.data.label_sets import LabelSets
from vtools.data.readers.path_table import PathTable
from vtools.data.step_errors import bad_sample_from
from vtools.data.train_augment import FusedTrainAugment
from vtools.errors import UsageError


class SampleStore(Protocol):
    """Random access to raw samples; what every data source (folders, shards, tables, torchvision sets)
    provides. Every store names this class as its base, so the answers below have their defaults here
    and a caller asks the store instead of probing for attributes."""

    labels: Sequence[int] | None = None  # every label, when known before any sample is read (class folders)
    paths: Sequence[str] = ()  # the image files, when the store is files
    own_names: bool = True  # name() gives a sample's own name (file, shard key, row), not only its position
    label_sets: LabelSets | None = None  # multi-label data: each sample's classes (its label is a multi-hot row)

    def __len__(self) -> int: ...

    def locate(self, index: int) -> RawSample | BadSample: ...

    def name(self, index: int) -> str: ...


class FileSamples(SampleStore):
    """Image files with their labels; ``unreadable`` gives, by index, why an entry known to be unreadable
    (a dangling link, a folder that cannot be listed) cannot be read: it is never opened. Paths and labels
    are kept in arrays (:class:`PathTable`, int32), so a million files cost megabytes, not an object
    each, and forked loader workers share them instead of copying."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike],
        labels: Sequence[int] | None = None,
        unreadable: Mapping[int, str] | None = None,
    ) -> None:
        self.paths = paths if isinstance(paths, PathTable) else PathTable.of(paths)
        self.labels = np.full(len(self.paths), -1, np.int32) if labels is None else np.asarray(labels, np.int32)
        self.unreadable = dict(unreadable or {})

    def __len__(self) -> int:
        return len(self.paths)

    def locate(self, index: int) -> RawSample | BadSample:
        if index in self.unreadable:
            return BadSample(self.paths[index], self.unreadable[index])
        path = self.paths[index]
        return RawSample(path, int(self.labels[index]), path)

    def known_bad(self) -> list[BadSample]:
        """The entries known to be unreadable before any is read."""
        return [BadSample(self.paths[index], reason) for index, reason in sorted(self.unreadable.items())]

    def name(self, index: int) -> str:
        return self.paths[index]


def refuse_known_bad(samples: Any, policy: str) -> None:
    """Under --on-bad-image error, stop now on the entries a reader knows to be unreadable before any is
    read (a dangling link, a folder that cannot be listed), naming the first: not after a model is built
    and a loader has reached it. Under skip they are counted and named as the loader meets them."""
    known = samples.known_bad() if isinstance(samples, FileSamples) else []
    if known and policy == "error":
        raise UsageError(refusal(known[0], more=len(known) - 1))


class DecodedImages(Dataset):
    """Decoded, transformed ``(image, label, index)`` items from any :class:`SampleStore`; an image that
    cannot be read comes through as a :class:`BadSample` for the main process to report or skip.

    With ``keep_bytes``, each process keeps the images it decoded (before the random transform) while
    they fit in that many bytes, and later epochs transform the kept image instead of reading and
    decoding the file again. A set that does not fit is not kept at all: random access would hit a
    partial store too rarely to pay for its memory. The fused training augmentation
    (:class:`~vtools.data.train_augment.FusedTrainAugment`) decodes only what its crop needs when
    nothing is kept.
    """

    def __init__(self, samples: SampleStore, transform: Callable, mode: str, keep_bytes: int = 0) -> None:
        self.samples = samples
        self.transform = transform
        self.mode = mode
        self.keep_bytes = keep_bytes
        self._kept: dict[int, tuple[Image.Image, int]] = {}
        self._kept_bytes = 0

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int, int]:
        try:
            return self._item(index)
        except Exception as err:  # anything a reader, decoder or transform raises: one bad sample, named
            return bad_sample_from(err, sample_name(self.samples, index)), -1, index

    def _item(self, index: int) -> tuple[Any, int, int]:
        if index in self._kept:
            image, label = self._kept[index]
            return self.transform(image), label, index
        raw = self.samples.locate(index)
        if isinstance(raw, BadSample):
            return raw, -1, index
        fused = self.transform if isinstance(self.transform, FusedTrainAugment) else None
        if fused is not None and not self.keep_bytes:  # nothing to keep: decode only what the crop needs
            return fused.from_source(raw.image, raw.name), raw.label, index
        image = fused.decode(raw.image, raw.name) if fused else open_image(raw.image, self.mode, raw.name)
        if isinstance(image, BadSample):
            return image, raw.label, index
        self._keep(index, image, raw.label)
        return self.transform(image), raw.label, index

    def _keep(self, index: int, image: Image.Image, label: int) -> None:
        if not self.keep_bytes:
            return
        self._kept_bytes += image.width * image.height * len(image.getbands()) + _IMAGE_OVERHEAD_BYTES
        if self._kept_bytes > self.keep_bytes:  # the set does not fit: keep nothing
            self.keep_bytes, self._kept = 0, {}
            return
        self._kept[index] = (image, label)


def sample_name(samples: SampleStore, index: int) -> str:
    """The name messages use for sample ``index``, even when the store cannot say."""
    try:
        return samples.name(index)
    except Exception:
        return f"sample {index}"


_IMAGE_OVERHEAD_BYTES = 1024  # a PIL image's objects besides its pixels, roughly


class ImageFiles(DecodedImages):
    """Images from a list of paths, each with a label (-1 when unlabelled)."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int] | None, transform: Callable, mode: str) -> None:
        super().__init__(FileSamples(paths, labels), transform, mode)

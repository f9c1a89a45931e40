"""One registry of data sources, named as timm's scripts name them.

``--dataset`` picks the kind by its prefix: empty for class folders,
``torch/<name>`` for torchvision sets, ``wds/<name>`` for tar shards,
``hfds/<name>`` for a local copy of a Hugging Face dataset. Every kind answers
the same questions (samples with labels, class names, length, random access),
so training order, per-rank shards, exact resume, bad-image handling and
decoding are the same code for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from vtools.data.datasets import DecodedImages, FileSamples, SampleStore
from vtools.data.readers.folder import labelled_images, resolve_split_dir
from vtools.data.readers.label_file import find_label_file, read_label_file
from vtools.data.readers.torchvision import TorchvisionImages, TorchvisionSamples, torchvision_dataset
from vtools.errors import UsageError
from vtools.options.shared import SourceFlags
from vtools.options.train_job import DataOptions


@dataclass(frozen=True)
class SourceRequest:
    """What a script asks for: ``--dataset``, the data folder, a split, and the per-kind options."""

    dataset: str
    root: str
    split: str
    download: bool = False
    input_key: str | None = None  # hfds: image column; wds: image extensions (timm's --input-key)
    target_key: str | None = None  # hfds: label column; wds: label extension (timm's --target-key)
    class_map: dict[str, int] | None = None  # folders: class folder name -> label

    @classmethod
    def for_split(
        cls, flags: SourceFlags | DataOptions, root: str, split: str, class_map: dict[str, int] | None = None
    ) -> SourceRequest:
        """The request the scripts' shared data flags make for ``split`` of ``root`` (each script decides
        which of DIR and --data-dir is its root)."""
        return cls(flags.dataset, root, split, flags.dataset_download, flags.input_key, flags.target_key, class_map)


@dataclass
class Source:
    """A labelled image collection, whatever stores it."""

    samples: SampleStore
    classes: list[str] | None  # names by label; None when the store does not say
    description: str

    def __len__(self) -> int:
        return len(self.samples)

    def images(self, transform: Callable, mode: str, keep_bytes: int = 0) -> Dataset:
        """Decoded, transformed ``(image, label, index)`` items; with ``keep_bytes``, decoded images
        are kept for later epochs when they fit (a torchvision set holds its images in memory already)."""
        if isinstance(self.samples, TorchvisionSamples):
            return TorchvisionImages(self.samples.dataset, transform, mode)
        return DecodedImages(self.samples, transform, mode, keep_bytes)

    def sample_names(self) -> Callable[[int], str] | None:
        """Each sample's own name (file, shard key, row) by index; None where the store knows only
        positions (a torchvision set), so reports and ReaL labels do not take a position for a name."""
        return self.samples.name if self.samples.own_names else None

    def highest_label(self, classes: Sequence[str] | None = None) -> int:
        """The highest label the data may hold: the largest stored one when labels are known before any
        image is read (class folders), else the last of ``classes`` (default: the source's own names)."""
        labels = self.samples.labels
        if labels is not None and len(labels):
            return int(np.max(labels))  # one pass in C: a Python max walks 1.28 M numpy scalars
        return len((self.classes if classes is None else classes) or []) - 1


def _folders(request: SourceRequest, name: str) -> Source:
    split_dir = resolve_split_dir(request.root, request.split)
    label_file = find_label_file(split_dir)
    if label_file is not None:  # a multi-label split: the images the file lists, with their class sets
        listed, classes = read_label_file(label_file, request.class_map)
        return Source(
            listed,
            classes,
            f"{split_dir} ({len(listed)} images, multi-label: {listed.label_sets.num_classes} classes "
            f"from {label_file.name})",
        )
    found = labelled_images(split_dir, request.class_map)
    samples = FileSamples(found.entries.paths, found.labels, found.entries.unreadable)
    return Source(samples, found.classes, f"{split_dir} ({len(samples)} images)")


def _torchvision(request: SourceRequest, name: str) -> Source:
    dataset = torchvision_dataset(request.dataset, request.root or "data", request.split, request.download)
    classes = [str(c) for c in getattr(dataset, "classes", [])] or None
    samples = TorchvisionSamples(dataset, request.dataset)
    return Source(samples, classes, f"{request.dataset} {request.split} ({len(dataset)} images)")


class StreamSource(Source):
    """Shards streamed from a server (``readers/wds_stream.py``): training reads them in stream order
    (``vtools.data.stream_batches``); nothing can read them by index."""

    def images(self, transform: Callable, mode: str, keep_bytes: int = 0) -> Dataset:
        raise UsageError(
            f"{self.description}: shards from a server are read as a stream, which only train.py does; "
            "validate.py and inference.py read shards by index: download them (or use a local copy) and "
            "pass its folder"
        )


def _shards(request: SourceRequest, name: str) -> Source:
    from vtools.data.readers import wds as shard_source

    shard_source.require_wids(f"--dataset {request.dataset}")
    keys = tuple(k.strip().lstrip(".").lower() for k in (request.input_key or "").split(";") if k.strip())
    if shard_source_is_stream(request):
        return _streamed_shards(request, name, keys or shard_source.IMAGE_EXTENSIONS)
    root = Path(request.root)
    samples = shard_source.open_shard_samples(
        root, request.split, keys or shard_source.IMAGE_EXTENSIONS, (request.target_key or "cls").lstrip(".")
    )
    info = shard_source.read_split_info(root)
    classes = info.get("classes") or _imagenet_classes(name, str(info.get("name", "")))
    if classes:  # a label outside them is then a bad sample, named when it is read
        samples.num_classes = len(classes)
        info_file = next((root / f for f in shard_source.INFO_FILES if (root / f).is_file()), None)
        samples.classes_from = str(info_file) if info.get("classes") else f"ImageNet ({name})"
    return Source(
        samples,
        classes,
        f"{request.dataset} {request.split}: {len(samples.shards)} shards, {len(samples)} samples"
        + multi_label_note(samples),
    )


def shard_source_is_stream(request: SourceRequest) -> bool:
    """Whether the shards come from a server (an http(s) URL or a pipe: command as folder or split)."""
    from vtools.data.readers.wds_stream import is_stream

    return is_stream(request.root) or is_stream(request.split)


def _streamed_shards(request: SourceRequest, name: str, image_keys: tuple[str, ...]) -> Source:
    from vtools.data.readers.wds_stream import StreamedShards, open_stream_split

    split = open_stream_split(request.root, request.split)
    store = StreamedShards(
        split.urls, split.counts, image_keys, (request.target_key or "cls").lstrip("."), exact_counts=split.exact_counts
    )
    classes = split.classes or _imagenet_classes(name)
    if classes:  # a label outside them is then a bad sample, named when it is read
        store.num_classes = len(classes)
        store.classes_from = f"{request.root} (_info.json)" if split.classes else f"ImageNet ({name})"
    counted = "" if split.exact_counts else " (|num_samples: shards taken as equal)"
    return StreamSource(
        store,
        classes,
        f"{request.dataset} {request.split}: {len(split.urls)} shards streamed, {len(store)} samples{counted}",
    )


def multi_label_note(samples: SampleStore) -> str:
    """What a description adds for a multi-label store: its class count."""
    sets = samples.label_sets
    return "" if sets is None else f", multi-label: {sets.num_classes} classes"


def _imagenet_classes(*names: str) -> list[str] | None:
    """ImageNet synsets (from timm) when the dataset is named as an ImageNet subset timm knows."""
    from timm.data import ImageNetInfo

    for name in names:
        subset = name.lower().removesuffix("-wds")
        try:
            return list(ImageNetInfo(subset).label_names())
        except AssertionError:
            continue
    return None


def _table(request: SourceRequest, name: str) -> Source:
    from vtools.data.readers.hfds import open_table_samples

    samples, classes = open_table_samples(
        request.dataset,
        name,
        Path(request.root or "."),
        request.split,
        request.input_key or "image",
        request.target_key or "label",
        request.download,
    )
    return Source(
        samples, classes, f"{request.dataset} {request.split} ({len(samples)} samples{multi_label_note(samples)})"
    )


def _streaming(request: SourceRequest, name: str) -> Source:
    raise UsageError(
        f"--dataset {request.dataset}: streaming datasets are not supported: they cannot be read by "
        f"index, which exact resume and exact-once validation need; use hfds/{name} (a local copy)"
    )


KINDS: dict[str, Callable[[SourceRequest, str], Source]] = {
    "": _folders,
    "torch": _torchvision,
    "wds": _shards,
    "hfds": _table,
    "hfids": _streaming,
}


def open_source(request: SourceRequest) -> Source:
    """Open the split that ``request`` names, whatever kind of store holds it."""
    prefix, _, name = request.dataset.partition("/") if "/" in request.dataset else ("", "", request.dataset)
    if prefix not in KINDS or (not prefix and request.dataset):
        raise UsageError(
            f"--dataset {request.dataset}: unknown kind (empty for image folders, or "
            f"{', '.join(k + '/<name>' for k in KINDS if k)})"
        )
    if prefix not in ("torch",) and not request.root:
        raise UsageError(f"give the data folder (DIR or --data-dir) for --dataset {request.dataset or '(folders)'}")
    return KINDS[prefix](request, name)

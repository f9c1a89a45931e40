"""Tar shards in the WebDataset layout (timm's ``wds/`` datasets), read by index.

Each sample is a group of tar members sharing a key: an image (``.jpg``,
``.png``, ``.webp``...) and its label (``.cls``, or ``"label"`` in ``.json``).
Training needs random access (a seeded order that a resumed run repeats, one
shard of the samples per rank), so shards are read the way ``wids`` reads them:
wids' memory-mapped tar index finds each member's offset, and a sample is one
seek and one read. Each process indexes a shard the first time it touches it
and keeps only a compact table (offsets, sizes, labels), so a random order over
a thousand shards costs one header scan per shard and process, not one per
sample.

Which shards make a split, and how many samples each holds, comes from the
split-info file timm publishes with its shards (``_info.json``/``_info.yaml``:
``splits.<name>.filenames`` and ``shard_lengths``), or from a brace pattern
(``train-{000000..000127}.tar``), or from the ``*<split>*.tar`` files in the
folder, which are then indexed up front to count them.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from vtools.data.datasets import SampleStore
from vtools.data.decode import BadSample, RawSample
from vtools.data.readers.path_table import PathTable
from vtools.errors import UsageError
from vtools.optional import SHARDS, optional_module

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff")
INFO_FILES = ("_info.json", "_info.yaml", "info.json")
NO_LABEL = np.iinfo(np.int64).min  # a sample without a label: -1 is a label (out of range), not a mark


def require_wids(purpose: str) -> None:
    """wids (and the braceexpand it brings) reads the shards; one line naming what to install without it."""
    optional_module("wids", purpose, SHARDS)


@dataclass
class ShardTable:
    """Where each sample of one shard lies: image offset and size (-1: no image), label (:data:`NO_LABEL`:
    none), key (in a :class:`PathTable`: one buffer, not an object per sample that every loader worker
    would copy)."""

    offsets: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray
    keys: Sequence[str]
    file_size: int


def _label_of(member: str, data: bytes) -> int:
    if member == "cls":
        return int(data.decode("utf-8").strip())
    meta = json.loads(data.decode("utf-8"))
    return int(meta["label"])


def index_shard(path: str, image_keys: tuple[str, ...] = IMAGE_EXTENSIONS, label_key: str = "cls") -> ShardTable:
    """Scan one shard's headers (through wids) into a :class:`ShardTable`. Raises what a damaged tar
    raises; the caller turns it into a message naming the shard."""
    from wids.wids import splitname
    from wids.wids_mmtar import MMIndexedTar  # wids: the field's indexed tar reader

    tar = MMIndexedTar(path)
    try:
        groups: dict[str, dict[str, tuple[int, int]]] = {}
        for member_name, offset, size in tar.by_index:
            if "." not in os.path.basename(member_name):
                continue  # not part of a sample (wids skips these too)
            key, extension = splitname(member_name)
            groups.setdefault(key, {})[extension[1:].lower()] = (offset + 512, size)
        count = len(groups)
        offsets = np.full(count, -1, dtype=np.int64)
        sizes = np.zeros(count, dtype=np.int64)
        labels = np.full(count, NO_LABEL, dtype=np.int64)
        for row, members in enumerate(groups.values()):
            image = next((members[k] for k in image_keys if k in members), None)
            if image is not None:
                offsets[row], sizes[row] = image
            for member in (label_key, "json") if label_key == "cls" else (label_key,):
                if member in members:
                    start, size = members[member]
                    try:
                        labels[row] = _label_of(member, bytes(tar.mmapped_file[start : start + size]))
                        break
                    except (ValueError, KeyError, TypeError):
                        continue
        return ShardTable(offsets, sizes, labels, PathTable.of(list(groups)), len(tar.mmapped_file))
    finally:
        tar.close()


@dataclass
class ShardSamples(SampleStore):
    """The samples of a list of shards, by global index."""

    shards: list[str]
    counts: list[int]
    image_keys: tuple[str, ...] = IMAGE_EXTENSIONS
    label_key: str = "cls"
    tables: dict[int, ShardTable | str] = field(default_factory=dict)  # built per process, on first use
    num_classes: int | None = None  # labels must lie in 0..num_classes-1 (when the split names its classes)
    classes_from: str = ""  # where the class names come from, for messages

    def __post_init__(self) -> None:
        self.ends = np.cumsum(self.counts).tolist()

    def __len__(self) -> int:
        return int(self.ends[-1]) if self.ends else 0

    def table(self, shard: int) -> ShardTable | str:
        """The shard's table, or the reason it cannot be read."""
        if shard not in self.tables:
            require_wids(f"tar shard {self.shards[shard]}")  # outside the try: not a damaged shard
            try:
                self.tables[shard] = index_shard(self.shards[shard], self.image_keys, self.label_key)
            except Exception as err:  # a damaged tar raises anything from struct to mmap errors
                self.tables[shard] = f"damaged tar shard ({type(err).__name__}: {err})".splitlines()[0]
        return self.tables[shard]

    def _where(self, index: int) -> tuple[int, int]:
        shard = bisect.bisect_right(self.ends, index)
        return shard, index - (self.ends[shard - 1] if shard else 0)

    def name(self, index: int) -> str:
        shard, inner = self._where(index)
        table = self.table(shard)
        key = table.keys[inner] if not isinstance(table, str) and inner < len(table.keys) else f"#{inner}"
        return f"{self.shards[shard]}:{key}"

    def locate(self, index: int) -> RawSample | BadSample:
        shard, inner = self._where(index)
        path = self.shards[shard]
        table = self.table(shard)
        if isinstance(table, str):
            return BadSample(f"{path} sample {inner}", table)
        if inner >= len(table.keys):
            return BadSample(
                f"{path} sample {inner}",
                f"the shard holds {len(table.keys)} samples but the split info says {self.counts[shard]} (truncated?)",
            )
        name = f"{path}:{table.keys[inner]}"
        if table.offsets[inner] < 0:
            return BadSample(name, f"no image ({', '.join('.' + k for k in self.image_keys[:4])}...) in the sample")
        label = int(table.labels[inner])
        if label == NO_LABEL:
            return BadSample(name, f"no label (.{self.label_key}) in the sample")
        outside = label_out_of_range(label, self.label_key, self.num_classes, self.classes_from)
        if outside:
            return BadSample(name, outside)
        start, size = int(table.offsets[inner]), int(table.sizes[inner])
        if start + size > table.file_size:
            return BadSample(name, "the shard ends inside this sample (truncated tar)")
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read(size)
        return RawSample(data, label, name)


def label_out_of_range(label: int, label_key: str, num_classes: int | None, classes_from: str) -> str:
    """Why ``label`` cannot be a class index ('' when it can): negative, or beyond the split's classes."""
    if label >= 0 and (num_classes is None or label < num_classes):
        return ""
    known = f"the {num_classes} classes of {classes_from}" if num_classes is not None else ""
    return (
        f"label {label} (.{label_key}) is out of range: labels are class indices 0.."
        + (f"{num_classes - 1} for {known}" if known else "N-1")
        + "; fix the sample's label"
        + (" or the class list" if known else "")
    )


def read_split_info(root: Path) -> dict[str, Any]:
    """timm's split-info file (or ours, which adds ``classes``), empty when the folder has none."""
    for name in INFO_FILES:
        path = root / name
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8")
                info = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
            except (ValueError, yaml.YAMLError, UnicodeDecodeError) as err:
                raise UsageError(f"{path}: not a readable split-info file ({err})".splitlines()[0]) from None
            if not isinstance(info, dict):
                raise UsageError(f"{path}: not a split-info file (expected a mapping with 'splits')")
            return info
    return {}


def _expand(pattern: str) -> list[str]:
    require_wids(f"the shard pattern {pattern}")
    import braceexpand  # comes with wids, the same expansion webdataset uses

    return list(braceexpand.braceexpand(pattern))


def split_shards(root: Path, split: str, info: dict[str, Any]) -> tuple[list[str], list[int] | None]:
    """The shard files of ``split`` and, when the split info gives them, their sample counts."""
    splits = info.get("splits") or {}
    if ".tar" in split or "{" in split:  # a brace pattern, timm's spelling, optionally "|num_samples"
        names = _expand(split.split("|", 1)[0])
        known = splits.get(_split_name_in(names[0], splits), {}) if splits else {}
        lengths = dict(zip(known.get("filenames", []), known.get("shard_lengths", [])))
        counts = [lengths[n] for n in names] if names and all(n in lengths for n in names) else None
    elif split in splits:
        entry = splits[split]
        names = list(entry.get("filenames") or [])
        lengths = entry.get("shard_lengths") or []
        counts = list(lengths) if len(lengths) == len(names) else None
    else:
        names = sorted(p.name for p in root.glob(f"*{split}*.tar"))
        counts = None
        if not names:
            known = f" (the split info names {', '.join(splits)})" if splits else ""
            raise UsageError(f"{root}: no tar shards for split {split!r}{known}")
    paths = [str(root / name) for name in names]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise UsageError(f"{len(missing)} of {len(paths)} shards of split {split!r} are missing, e.g. {missing[0]}")
    return paths, counts


def _split_name_in(filename: str, splits: dict[str, Any]) -> str:
    for name in splits:
        if f"-{name}-" in filename or filename.startswith(f"{name}-"):
            return name
    return ""


def open_shard_samples(root: Path, split: str, image_keys: tuple[str, ...], label_key: str) -> ShardSamples:
    """The split's samples; shards without a count in the split info are indexed now to count them."""
    if not root.is_dir():
        raise UsageError(f"--data-dir {root}: the shard folder does not exist")
    paths, counts = split_shards(root, split, read_split_info(root))
    if counts is not None:
        return ShardSamples(paths, counts, image_keys, label_key)
    samples = ShardSamples(paths, [0] * len(paths), image_keys, label_key)
    for shard, path in enumerate(paths):
        table = samples.table(shard)
        if isinstance(table, str):
            raise UsageError(f"{path}: {table}")
    return ShardSamples(
        paths, [len(t.keys) for t in samples.tables.values()], image_keys, label_key, dict(samples.tables)
    )

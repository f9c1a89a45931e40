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

A list-valued label makes the split multi-label: a ``.cls`` member holding
``1,3``, ``1 3`` or ``[1, 3]`` (``[]``: no class), or a JSON label member
whose content (or whose ``"label"``) is a list. Shards found by name are all
indexed when the split is opened, so any list label decides. Shards counted by
the split info are indexed lazily, so their first shard decides: when it holds
a list label, every shard is indexed at once (one header scan each, which a
multi-label split needs anyway to know its classes); when it holds single
labels the split stays single-label (it costs that one shard's index, early)
and a list label met later is a bad sample saying so. In a multi-label split
single integers count as one-class lists and each sample's label is its
multi-hot row. The number of classes is the split's class list when it has one
(``classes`` in the split info, or ImageNet's), else the largest class index +
1 (a split missing its last class then gets fewer: give a class list).
Streamed shards (``wds_stream.py``) read single labels only.
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
from vtools.data.label_sets import LabelSets
from vtools.data.readers.path_table import PathTable
from vtools.errors import UsageError
from vtools.optional import SHARDS, optional_module

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff")
INFO_FILES = ("_info.json", "_info.yaml", "info.json")
NO_LABEL = np.iinfo(np.int64).min  # a sample without a label: -1 is a label (out of range), not a mark
LISTED = NO_LABEL + 1  # a sample whose label is a list of classes (in its table's class lists)


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
    class_lists: LabelSets | None = None  # when a label is a list: every row's classes (unchecked), else None


def _label_of(member: str, data: bytes) -> int | list[int]:
    """A class index, or a list of them (multi-label); raises ValueError, KeyError or TypeError when the
    member holds neither."""
    if member == "cls":
        text = data.decode("utf-8").strip()
        try:
            return int(text)
        except ValueError:
            return _listed_classes(text)
    meta = json.loads(data.decode("utf-8"))
    label = meta if isinstance(meta, list) else meta["label"]
    return _class_list(label) if isinstance(label, list) else int(label)


def _listed_classes(text: str) -> list[int]:
    """A ``.cls`` text's classes: ``1,3``, ``1 3`` or ``[1, 3]`` (``[]``: none; an empty text is no label)."""
    if text.startswith("["):
        return _class_list(json.loads(text))
    classes = text.replace(",", " ").split()
    if not classes:
        raise ValueError("no label")
    return sorted({int(c) for c in classes})


def _class_list(values: list[Any]) -> list[int]:
    if not isinstance(values, list) or any(not isinstance(v, int) or isinstance(v, bool) for v in values):
        raise ValueError(f"not a list of class indices: {values!r}")
    return sorted(set(values))


def _class_table(labels: np.ndarray, lists: dict[int, list[int]]) -> LabelSets:
    """Every row's classes, CSR, unchecked: a list label as listed, an integer as one class, none as none."""
    rows = [lists[r] if r in lists else [] if labels[r] == NO_LABEL else [int(labels[r])] for r in range(len(labels))]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(row) for row in rows], out=offsets[1:])
    indices = np.fromiter((c for row in rows for c in row), dtype=np.int64, count=int(offsets[-1]))
    return LabelSets(offsets, indices, int(indices.max()) + 1 if len(indices) else 0)


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
        lists: dict[int, list[int]] = {}
        for row, members in enumerate(groups.values()):
            image = next((members[k] for k in image_keys if k in members), None)
            if image is not None:
                offsets[row], sizes[row] = image
            for member in (label_key, "json") if label_key == "cls" else (label_key,):
                if member in members:
                    start, size = members[member]
                    try:
                        label = _label_of(member, bytes(tar.mmapped_file[start : start + size]))
                    except (ValueError, KeyError, TypeError):
                        continue
                    if type(label) is list:
                        lists[row], labels[row] = label, LISTED
                    else:
                        labels[row] = label
                    break
        class_lists = _class_table(labels, lists) if lists else None
        return ShardTable(offsets, sizes, labels, PathTable.of(list(groups)), len(tar.mmapped_file), class_lists)
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
    class_lists: LabelSets | None = None  # a multi-label split: every sample's classes, as stored (unchecked)

    def __post_init__(self) -> None:
        self.ends = np.cumsum(self.counts).tolist()
        self._checked_sets: LabelSets | None = None

    @property
    def label_sets(self) -> LabelSets | None:
        """A multi-label split's classes per sample, over ``num_classes`` (set once the split's class list is
        known; else the largest class index + 1); indices outside them are left out here, and their samples
        are bad samples when read."""
        if self.class_lists is None:
            return None
        count = self.num_classes if self.num_classes is not None else self.class_lists.num_classes
        if self._checked_sets is None or self._checked_sets.num_classes != count:
            self._checked_sets = _within(self.class_lists, count)
        return self._checked_sets

    def find_class_lists(self) -> None:
        """Make the split multi-label when a shard indexed already (else the first) holds a list label:
        index every shard now and gather their classes (see the module's docstring)."""
        seen = list(self.tables.values()) if self.tables else [self.table(0)] if self.shards else []
        if not any(not isinstance(table, str) and table.class_lists is not None for table in seen):
            return
        parts = [_shard_classes(self.table(shard), count) for shard, count in enumerate(self.counts)]
        lengths = np.concatenate([part[0] for part in parts])
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        indices = np.concatenate([part[1] for part in parts])
        self.class_lists = LabelSets(offsets, indices, int(indices.max()) + 1 if len(indices) else 0)

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
        label: int | np.ndarray = int(table.labels[inner])
        if label == NO_LABEL:
            return BadSample(name, f"no label (.{self.label_key}) in the sample")
        if self.class_lists is not None:
            label, outside = self._multi_hot(index)
        elif label == LISTED:
            outside = (
                f"a list of classes (.{self.label_key}) in a split read as single-label (its first shard holds "
                "single labels only); give every multi-label sample a list label, or put one in the first shard"
            )
        else:
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

    def _multi_hot(self, index: int) -> tuple[np.ndarray, str]:
        """Sample ``index``'s multi-hot row, or why one of its classes is out of range."""
        assert self.class_lists is not None
        sets = self.label_sets
        assert sets is not None
        classes = self.class_lists.classes_of(index)
        outside = classes[(classes < 0) | (classes >= sets.num_classes)]
        if len(outside):
            return np.zeros(0, dtype=np.float32), label_out_of_range(
                int(outside[0]), self.label_key, self.num_classes, self.classes_from
            )
        row = np.zeros(sets.num_classes, dtype=np.float32)
        row[classes] = 1.0
        return row, ""


def _shard_classes(table: ShardTable | str, count: int) -> tuple[np.ndarray, np.ndarray]:
    """One shard's class count per sample and classes, for its ``count`` samples of the split (a damaged
    shard's, or those beyond its end, hold none: reading them says why)."""
    if isinstance(table, str):
        return np.zeros(count, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if table.class_lists is not None:
        sets = table.class_lists
        rows = min(count, len(sets))
        lengths = np.diff(sets.offsets[: rows + 1])
        indices = sets.indices[: sets.offsets[rows]]
    else:
        labels = table.labels[:count]
        known = labels != NO_LABEL
        lengths, indices = known.astype(np.int64), labels[known]
    return np.pad(lengths, (0, count - len(lengths))), indices


def _within(sets: LabelSets, num_classes: int) -> LabelSets:
    """``sets`` without the indices outside 0..num_classes-1 (vectorised)."""
    keep = (sets.indices >= 0) & (sets.indices < num_classes)
    if keep.all():
        return LabelSets(sets.offsets, sets.indices.astype(np.int32), num_classes)
    rows = np.repeat(np.arange(len(sets), dtype=np.int64), np.diff(sets.offsets))[keep]
    offsets = np.zeros_like(sets.offsets)
    np.cumsum(np.bincount(rows, minlength=len(sets)), out=offsets[1:])
    return LabelSets(offsets, sets.indices[keep].astype(np.int32), num_classes)


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
        samples = ShardSamples(paths, counts, image_keys, label_key)
        samples.find_class_lists()
        return samples
    samples = ShardSamples(paths, [0] * len(paths), image_keys, label_key)
    for shard, path in enumerate(paths):
        table = samples.table(shard)
        if isinstance(table, str):
            raise UsageError(f"{path}: {table}")
    samples = ShardSamples(
        paths, [len(t.keys) for t in samples.tables.values()], image_keys, label_key, dict(samples.tables)
    )
    samples.find_class_lists()
    return samples

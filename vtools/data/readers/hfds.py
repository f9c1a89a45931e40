"""Hugging Face datasets (timm's ``hfds/`` datasets) from a local copy, read by index.

A local copy is a folder of parquet or arrow files as the Hub serves them
(``data/train-00000-of-00294.parquet``... : ImageNet-1k's download works as
is), or a ``save_to_disk`` folder. Images stay encoded until a worker decodes
them, as the folder and shard readers do, so every source shares one decoding
path and one bad-image policy. Class names come from the label column's
``ClassLabel`` feature when it has one.

The ``datasets`` package is optional (requirements-hf.txt): it is large,
and only this source needs it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from vtools.data.decode import BadSample, RawSample
from vtools.errors import UsageError
from vtools.optional import HF, optional_module


def datasets_module(purpose: str) -> Any:
    """The ``datasets`` package (optional); its progress bars, like ours, only on terminals."""
    datasets = optional_module("datasets", purpose, HF)
    if not sys.stderr.isatty():
        datasets.disable_progress_bars()
    return datasets


def _local_copy(root: Path, name: str) -> Path | None:
    """``root/name`` or ``root`` when it holds a saved dataset or parquet/arrow files."""
    for folder in (root / name, root):
        if not folder.is_dir():
            continue
        if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
            return folder
        if next(folder.rglob("*.parquet"), None) or next(folder.rglob("*.arrow"), None):
            return folder
    return None


def _load_split(datasets: Any, spec: str, folder: Path, split: str) -> Any:
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        loaded = datasets.load_from_disk(str(folder))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise UsageError(f"--dataset {spec}: {folder} has no split {split!r} (it has {', '.join(loaded)})")
            return loaded[split]
        return loaded
    try:
        return datasets.load_dataset(str(folder), split=split)
    except ValueError as err:  # datasets names the splits it found
        raise UsageError(f"--dataset {spec}: {folder}: {str(err).splitlines()[0]}") from None


class TableSamples:
    """One split of a Hugging Face dataset (a :class:`~vtools.data.SampleStore`)."""

    def __init__(self, table: Any, image_key: str, label_key: str | None, split: str) -> None:
        self.table = table
        self.image_key = image_key
        self.label_key = label_key
        self.split = split

    def __len__(self) -> int:
        return len(self.table)

    def name(self, index: int) -> str:
        return f"{self.split}[{index}]"

    def locate(self, index: int) -> RawSample | BadSample:
        row = self.table[index]
        name = self.name(index)
        image = row[self.image_key] or {}
        label = row[self.label_key] if self.label_key else -1
        if label is None:
            return BadSample(name, f"no label in column {self.label_key!r}")
        if image.get("bytes"):
            return RawSample(bytes(image["bytes"]), int(label), name)
        if image.get("path"):
            return RawSample(str(image["path"]), int(label), str(image["path"]))
        return BadSample(name, f"no image in column {self.image_key!r}")


def open_table_samples(
    spec: str, name: str, root: Path, split: str, image_key: str, label_key: str | None, download: bool
) -> tuple[TableSamples, list[str] | None]:
    """The split's samples and, from the label feature, the class names."""
    datasets = datasets_module(f"--dataset {spec}")
    folder = _local_copy(root, name)
    if folder is not None:
        table = _load_split(datasets, spec, folder, split)
    elif download:
        try:
            table = datasets.load_dataset(name, split=split, cache_dir=str(root))
        except Exception as err:  # offline, unknown name, gated dataset...: datasets raises many kinds
            raise UsageError(
                f"--dataset {spec}: could not get {name} from the Hub into {root} "
                f"({type(err).__name__}: {err})".splitlines()[0]
            ) from None
    else:
        raise UsageError(
            f"--dataset {spec}: no local copy under {root} (expected parquet or arrow files, or a "
            "save_to_disk folder, in it or in its subfolder "
            f"{name}); "
            "--dataset-download fetches it from the Hub"
        )
    columns = list(table.column_names)
    for role, key in (("--input-key", image_key), ("--target-key", label_key)):
        if key and key not in columns:
            raise UsageError(
                f"--dataset {spec}: {role} {key!r} is not a column of split {split!r} (columns: {', '.join(columns)})"
            )
    table = table.cast_column(image_key, datasets.Image(decode=False))
    feature = table.features.get(label_key) if label_key else None
    classes = list(feature.names) if getattr(feature, "names", None) else None
    return TableSamples(table, image_key, label_key, split), classes

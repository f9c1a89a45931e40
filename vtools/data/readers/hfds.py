"""Hugging Face datasets (timm's ``hfds/`` datasets) from a local copy, read by index.

A local copy is a folder of parquet or arrow files as the Hub serves them
(``data/train-00000-of-00294.parquet``... : ImageNet-1k's download works as
is), or a ``save_to_disk`` folder. Images stay encoded until a worker decodes
them, as the folder and shard readers do, so every source shares one decoding
path and one bad-image policy. Class names come from the label column's
``ClassLabel`` feature when it has one.

A label column of class lists (``Sequence(ClassLabel(names=...))``, spelled
``List(ClassLabel(...))`` from datasets 4) makes the split multi-label: its
class lists become a :class:`LabelSets` read from the Arrow column in one pass
(no Python loop per row), and each sample's label is its multi-hot row. A list
of plain integers is refused: without the ClassLabel's names the number of
classes is a guess (the largest index seen), which a validation split missing
the last class would get wrong.

The ``datasets`` package is optional (requirements-hf.txt): it is large,
and only this source needs it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from vtools.data.datasets import SampleStore
from vtools.data.decode import BadSample, RawSample
from vtools.data.label_sets import LabelSets
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


def _read_json(path: Path, spec: str, what: str) -> dict[str, Any]:
    """One of a save_to_disk folder's JSON files, or one line naming it (``what`` says what it should hold)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        problem = f"is not readable JSON ({err})"
    else:
        if isinstance(value, dict):
            return value
        problem = f"holds a JSON {type(value).__name__}, not an object"
    raise UsageError(
        f"--dataset {spec}: {path} {problem}; it should hold {what}: save the dataset again with save_to_disk"
    )


def _check_saved_folder(spec: str, folder: Path) -> None:
    """The JSON files ``datasets.load_from_disk`` reads, checked first so that a damaged one is named."""
    dict_file = folder / "dataset_dict.json"
    folders = [folder]
    if dict_file.is_file():
        splits = _read_json(dict_file, spec, 'the split names ({"splits": ["train", ...]})').get("splits")
        if not isinstance(splits, list) or not all(isinstance(name, str) for name in splits):
            raise UsageError(
                f"--dataset {spec}: {dict_file} has no list of split names under 'splits'; it should hold "
                '{"splits": ["train", ...]}: save the dataset again with save_to_disk'
            )
        folders = [folder / name for name in splits]
    for split_folder in folders:
        for name, what in (("state.json", "the split's arrow files"), ("dataset_info.json", "the split's features")):
            if not (split_folder / name).is_file():
                raise UsageError(
                    f"--dataset {spec}: {split_folder / name} is missing (save_to_disk writes one for each split); "
                    "save the dataset again with save_to_disk"
                )
            _read_json(split_folder / name, spec, what)


def _load_split(datasets: Any, spec: str, folder: Path, split: str) -> Any:
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        _check_saved_folder(spec, folder)
        try:
            loaded = datasets.load_from_disk(str(folder))
        except (OSError, ValueError, KeyError, TypeError) as err:  # what its JSON check above cannot see
            raise UsageError(
                f"--dataset {spec}: {folder} is not a readable save_to_disk folder "
                f"({type(err).__name__}: {err})".splitlines()[0]
                + "; save the dataset again with save_to_disk"
            ) from None
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise UsageError(f"--dataset {spec}: {folder} has no split {split!r} (it has {', '.join(loaded)})")
            return loaded[split]
        return loaded
    try:
        return datasets.load_dataset(str(folder), split=split)
    except ValueError as err:  # datasets names the splits it found
        raise UsageError(f"--dataset {spec}: {folder}: {str(err).splitlines()[0]}") from None
    except RuntimeError as err:
        scripts = sorted(path.name for path in folder.glob("*.py"))
        if not scripts or "scripts are no longer supported" not in str(err):
            raise
        raise UsageError(
            f"--dataset {spec}: {folder} holds a dataset loading script ({scripts[0]}) beside its data files; "
            "datasets no longer runs loading scripts and refuses such a folder: move "
            f"{', '.join(scripts)} out of it (its parquet or arrow files are then read as they are)"
        ) from None


def _refuse_loading_script(spec: str, root: Path, name: str) -> None:
    """A folder with a dataset loading script (``NAME.py``) but no data: say so, and how to get data."""
    for folder in (root / name, root):
        scripts = sorted(folder.glob("*.py")) if folder.is_dir() else []
        if scripts:
            raise UsageError(
                f"--dataset {spec}: {folder} holds a dataset loading script ({scripts[0].name}), not data: "
                "datasets no longer runs loading scripts; get the dataset as parquet files (the Hub's parquet "
                "conversion, or run the script once with datasets<4 and save_to_disk) and point --data-dir at them"
            )


class TableSamples(SampleStore):
    """One split of a Hugging Face dataset."""

    def __init__(self, table: Any, image_key: str, label_key: str | None, split: str) -> None:
        self.table = table
        self.image_key = image_key
        self.label_key = label_key
        self.split = split
        self.label_range: tuple[int, int] | None = None  # the smallest and largest label, when known
        self.label_sets: LabelSets | None = None  # a column of class lists: each row's classes

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
        if self.label_sets is not None:
            label = self.label_sets.multi_hot(index)
        else:
            label = int(label)
        if image.get("bytes"):
            return RawSample(bytes(image["bytes"]), label, name)
        if image.get("path"):
            return RawSample(str(image["path"]), label, str(image["path"]))
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
        _refuse_loading_script(spec, root, name)
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
    where = f"split {split!r} of {folder}" if folder is not None else f"split {split!r} of {name} (from the Hub)"
    try:
        table = table.cast_column(image_key, datasets.Image(decode=False))
    except (TypeError, ValueError, NotImplementedError, KeyError) as err:  # pyarrow's cast errors among them
        raise UsageError(
            f"--dataset {spec}: column {image_key!r} of {where} holds {_kind(table.features[image_key])}, not "
            f"images (encoded bytes or file paths) ({type(err).__name__}); name the image column with "
            f"--input-key (columns: {', '.join(columns)})"
        ) from None
    feature = table.features.get(label_key) if label_key else None
    samples = TableSamples(table, image_key, label_key, split)
    inner = _list_item(feature)
    if label_key and inner is not None:
        classes = _list_classes(spec, where, label_key, inner)
        samples.label_sets = label_sets_of(spec, where, table, label_key, classes)
        return samples, classes
    classes = list(feature.names) if getattr(feature, "names", None) else None
    if label_key:
        samples.label_range = _check_labels(spec, where, table, label_key, feature, classes, columns)
    return samples, classes


def _kind(feature: Any) -> str:
    """How a column's feature reads in a message: its arrow type (``int64``, ``string``) or feature kind."""
    return str(getattr(feature, "dtype", None) or type(feature).__name__)


def _check_labels(
    spec: str, where: str, table: Any, label_key: str, feature: Any, classes: list[str] | None, columns: list[str]
) -> tuple[int, int] | None:
    """Labels must be class indices: integers, and within the class names when the dataset names its
    classes (a ClassLabel feature). -1 is datasets' mark for an unlabelled sample and passes as such.
    Returns the smallest and largest label (None when the column holds none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table.data.column(label_key)
    if classes is None and not (pa.types.is_integer(column.type) or pa.types.is_null(column.type)):
        example = next((value for value in column.slice(0, 100).to_pylist() if value is not None), None)
        raise UsageError(
            f"--dataset {spec}: the label column {label_key!r} of {where} holds {_kind(feature)} values "
            f"(e.g. {example!r}), not class indices; store integer labels (datasets: "
            f"dataset.class_encode_column({label_key!r}) turns names into indices) or name the label column "
            f"with --target-key (columns: {', '.join(columns)})"
        )
    if not pa.types.is_integer(column.type) or column.null_count == len(column):
        return None
    low, high = (value.as_py() for value in pc.min_max(column).values())
    bad = low if low < -1 else high if classes is not None and high >= len(classes) else None
    if bad is None:
        return low, high
    row = pc.index(column, bad).as_py()
    if classes is None:
        raise UsageError(
            f"--dataset {spec}: {where} has label {bad} in column {label_key!r} (row {row}); labels are class "
            "indices from 0 (-1 marks an unlabelled sample): fix the labels"
        )
    shown = ", ".join(classes[:3]) + (", ..." if len(classes) > 3 else "")
    raise UsageError(
        f"--dataset {spec}: {where} has label {bad} in column {label_key!r} (row {row}), out of range for its "
        f"{len(classes)} class names (0..{len(classes) - 1}: {shown}); fix the labels, or the class names of "
        f"the column's ClassLabel feature"
    )


def _list_item(feature: Any) -> Any:
    """The item feature of a list column (datasets' ``Sequence``, ``List``, ``LargeList``, or ``[feature]``
    in datasets < 4), or None for any other column."""
    if isinstance(feature, list):
        return feature[0] if len(feature) == 1 else None
    if type(feature).__name__ in ("Sequence", "List", "LargeList"):
        return getattr(feature, "feature", None)
    return None


def _list_classes(spec: str, where: str, label_key: str, inner: Any) -> list[str]:
    """The class names of a column of class lists: its ClassLabel's. Plain integers are refused, since
    the class count would be a guess (a split missing the last class would give fewer outputs)."""
    if getattr(inner, "names", None):
        return list(inner.names)
    what = "integer" if str(getattr(inner, "dtype", "")).startswith(("int", "uint")) else _kind(inner)
    raise UsageError(
        f"--dataset {spec}: the label column {label_key!r} of {where} holds lists of {what} values without "
        f"class names; multi-label data needs them to know the number of classes: cast the column to "
        f"Sequence(ClassLabel(names=[...])) (dataset.cast_column({label_key!r}, ...)) and save it again"
    )


def label_sets_of(spec: str, where: str, table: Any, label_key: str, classes: list[str]) -> LabelSets:
    """Each row's classes from a column of class lists, read as Arrow buffers (offsets and values as
    numpy: a million rows take milliseconds). A null row holds no classes here and is a bad sample when
    read; a class index outside the names stops with one line naming the row."""
    import pyarrow.compute as pc

    column = table.data.column(label_key)
    if getattr(table, "_indices", None) is not None:  # a selected or shuffled view: rows in its order
        column = column.take(table._indices.column(0))
    lengths, values = [], []
    for chunk in column.chunks:
        lengths.append(pc.fill_null(pc.list_value_length(chunk), 0).to_numpy(zero_copy_only=False))
        flat = chunk.flatten()
        if flat.null_count:
            values.append(pc.fill_null(flat, -1).to_numpy(zero_copy_only=False))  # reported below
        else:
            values.append(flat.to_numpy(zero_copy_only=False))
    offsets = np.zeros(len(column) + 1, dtype=np.int64)
    if lengths:
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    indices = np.concatenate(values).astype(np.int64) if values else np.zeros(0, np.int64)
    bad = np.flatnonzero((indices < 0) | (indices >= len(classes)))
    if len(bad):
        row = int(np.searchsorted(offsets, bad[0], side="right")) - 1
        value = column[row].as_py()[int(bad[0] - offsets[row])]
        shown = ", ".join(classes[:3]) + (", ..." if len(classes) > 3 else "")
        raise UsageError(
            f"--dataset {spec}: {where} has class {value} in the label list of column {label_key!r} (row {row}), "
            f"out of range for its {len(classes)} class names (0..{len(classes) - 1}: {shown}); fix the labels, "
            "or the class names of the column's ClassLabel feature"
        )
    return _sorted_sets(offsets, indices.astype(np.int32), len(classes))


def _sorted_sets(offsets: np.ndarray, indices: np.ndarray, num_classes: int) -> LabelSets:
    """Rows as :class:`LabelSets` keeps them (each row's classes ascending, repeats once), vectorised."""
    follows = np.ones(len(indices), dtype=bool)  # an index after another of the same row
    follows[offsets[:-1][np.diff(offsets) > 0]] = False
    if len(indices) == 0 or bool(np.all(np.diff(indices)[follows[1:]] > 0)):  # ascending already: as stored
        return LabelSets(offsets, indices, num_classes)
    rows = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
    order = np.lexsort((indices, rows))
    rows, indices = rows[order], indices[order]
    keep = np.ones(len(indices), dtype=bool)
    keep[1:] = (rows[1:] != rows[:-1]) | (indices[1:] != indices[:-1])
    if not keep.all():
        rows, indices = rows[keep], indices[keep]
        offsets = np.zeros_like(offsets)
        np.cumsum(np.bincount(rows, minlength=len(offsets) - 1), out=offsets[1:])
    return LabelSets(offsets, np.ascontiguousarray(indices), num_classes)

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

import json
import sys
from pathlib import Path
from typing import Any

from vtools.data.datasets import SampleStore
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
    classes = list(feature.names) if getattr(feature, "names", None) else None
    samples = TableSamples(table, image_key, label_key, split)
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

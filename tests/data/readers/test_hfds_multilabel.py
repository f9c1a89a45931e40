"""Multi-label Hugging Face tables: a label column of class lists (``Sequence(ClassLabel)``, datasets 4's
``List``) written with datasets' own writer, read back through ``open_source`` as train.py opens it: the
inner ClassLabel's names, each row's classes, multi-hot rows from ``locate`` and the loader, N x K float32
targets from ``collate``. Class indices outside the names, and lists without names, stop in one line."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vtools.data.decode import BadSample
from vtools.data.loaders import collate
from vtools.data.readers.registry import SourceRequest, open_source
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="readers run on the host")

NAMES = ["cat", "dog", "fox", "owl"]
LISTS = [[0, 2], [], [3], [1, 0, 3], [2, 2], [0, 1, 2, 3]]  # unordered and repeated on purpose
EXPECTED = [sorted(set(row)) for row in LISTS]


def png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), (value * 40, 10, 20)).save(buffer, format="PNG")
    return buffer.getvalue()


def write_table(root: Path, lists: list, inner=None, spelling: str = "Sequence", saved: bool = False) -> Path:
    datasets = pytest.importorskip("datasets")
    item = inner if inner is not None else datasets.ClassLabel(names=NAMES)
    label = getattr(datasets, spelling)(item) if spelling != "[]" else [item]
    features = datasets.Features({"image": datasets.Image(), "labels": label})
    table = datasets.Dataset.from_dict(
        {"image": [{"bytes": png(i), "path": f"{i}.png"} for i in range(len(lists))], "labels": lists},
        features=features,
    )
    if saved:
        datasets.DatasetDict({"validation": table}).save_to_disk(str(root))
    else:
        (root / "data").mkdir(parents=True)
        table.to_parquet(str(root / "data" / "validation-00000-of-00001.parquet"))
    return root


def open_table(root: Path):
    return open_source(SourceRequest("hfds/set", str(root), "validation", target_key="labels"))


def multi_hot(rows: list[list[int]]) -> np.ndarray:
    out = np.zeros((len(rows), len(NAMES)), dtype=np.float32)
    for i, row in enumerate(rows):
        out[i, row] = 1.0
    return out


@pytest.mark.parametrize(("spelling", "saved"), [("Sequence", False), ("List", True), ("[]", False)])
def test_class_lists_make_a_multi_label_split(spelling: str, saved: bool, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    assert spelling == "[]" or hasattr(datasets, spelling), f"datasets {datasets.__version__} has no {spelling}"
    source = open_table(write_table(tmp_path / "set", LISTS, spelling=spelling, saved=saved))
    sets = source.samples.label_sets
    assert source.classes == NAMES
    assert source.samples.labels is None
    assert sets is not None and len(sets) == len(LISTS) and sets.num_classes == len(NAMES)
    assert [sets.classes_of(i).tolist() for i in range(len(LISTS))] == EXPECTED
    assert sets.positives().tolist() == [3, 2, 3, 3]  # repeats count once
    labels = []
    for index in range(len(source)):
        sample = source.samples.locate(index)
        assert not isinstance(sample, BadSample), sample
        labels.append(sample.label)
    np.testing.assert_array_equal(np.stack(labels), multi_hot(EXPECTED))


def test_loader_items_collate_to_float_targets(tmp_path: Path) -> None:
    source = open_table(write_table(tmp_path / "set", LISTS))
    images = source.images(lambda image: torch.zeros(3, 4, 4), "RGB")
    batch = collate([images[i] for i in range(len(images))])
    assert batch.targets.dtype == torch.float32 and tuple(batch.targets.shape) == (len(LISTS), len(NAMES))
    np.testing.assert_array_equal(batch.targets.numpy(), multi_hot(EXPECTED))


def test_null_list_is_a_bad_sample(tmp_path: Path) -> None:
    source = open_table(write_table(tmp_path / "set", [[1], None, [2]]))
    assert [source.samples.label_sets.classes_of(i).tolist() for i in range(3)] == [[1], [], [2]]
    bad = source.samples.locate(1)
    assert isinstance(bad, BadSample) and "no label in column 'labels'" in bad.reason
    np.testing.assert_array_equal(source.samples.locate(2).label, multi_hot([[2]])[0])


def test_class_index_beyond_the_names_stops_in_one_line(tmp_path: Path) -> None:
    """datasets refuses to write such a ClassLabel list, so the names are narrowed after writing."""
    datasets = pytest.importorskip("datasets")
    root = write_table(tmp_path / "set", [[0], [1, 2], [0, 3], [1]], inner=datasets.Value("int64"))
    parquet = root / "data" / "validation-00000-of-00001.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow = pq.read_table(parquet)
    schema = datasets.Features(
        {"image": datasets.Image(), "labels": datasets.Sequence(datasets.ClassLabel(names=NAMES[:3]))}
    ).arrow_schema
    pq.write_table(pa.Table.from_arrays(arrow.columns, schema=schema), parquet)
    with pytest.raises(UsageError) as error:
        open_table(root)
    message = str(error.value)
    assert all(part in message for part in ("class 3", "row 2", "'labels'", "3 class names")), message
    assert "\n" not in message


def test_lists_of_plain_integers_are_refused_in_one_line(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    root = write_table(tmp_path / "set", LISTS, inner=datasets.Value("int64"))
    with pytest.raises(UsageError) as error:
        open_table(root)
    assert all(part in str(error.value) for part in ("lists of integer values", "ClassLabel(names="))
    assert "\n" not in str(error.value)


def test_a_million_rows_open_without_a_python_step_per_row(tmp_path: Path) -> None:
    """Label lists are read from Arrow buffers, not row by row: the calls Python makes while reading a million
    rows (functions and builtins, counted by a profile hook) stay a few thousand, where a loop over the rows
    makes a million or more. Counted, not timed: a loaded machine slows both alike."""
    datasets = pytest.importorskip("datasets")
    import pyarrow as pa

    from vtools.data.readers.hfds import label_sets_of

    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 4, 1_000_000)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(rng.integers(0, len(NAMES), int(offsets[-1])), type=pa.int64())
    column = pa.ListArray.from_arrays(pa.array(offsets), values)
    table = datasets.Dataset(pa.table({"labels": column}))
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += 1

    sys.setprofile(count)
    try:
        sets = label_sets_of("hfds/set", "split", table, "labels", NAMES)
    finally:
        sys.setprofile(None)
    assert len(sets) == len(lengths)
    for row in (0, 1, 777_777, 999_999):
        assert sets.classes_of(row).tolist() == sorted(set(column[row].as_py()))
    assert calls < 20_000, f"{calls} Python calls for a million rows: read row by row"

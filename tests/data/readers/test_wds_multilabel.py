"""Multi-label tar shards: list labels (``.cls`` as ``1,3``, ``1 3`` or ``[1, 3]``; a JSON label member
holding a list, or ``{"label": [...]}``) written with webdataset's own writer, read back through
``open_source`` as train.py opens them: each sample's classes, multi-hot rows from ``locate`` and the
loader, N x K float32 targets from ``collate``. Single integers in such a split count as one class; an
index outside the classes is a bad sample naming it; single-label shards stay as they were."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.data.readers.test_registry_labels import labels_read
from vtools.data.decode import BadSample
from vtools.data.loaders import collate
from vtools.data.readers.registry import SourceRequest, open_source

pytestmark = pytest.mark.cpu_only(reason="readers run on the host")

# what each sample's label member holds, and the classes it means; two shards of four and three
CLS = [b"0,2", b"1 3", b"[3, 0]", b"[]", b"2", b" 1, 1 \n", b"[0,1,2,3]"]
CLASSES = [[0, 2], [1, 3], [0, 3], [], [2], [1], [0, 1, 2, 3]]


def png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), (value * 30, 10, 20)).save(buffer, format="PNG")
    return buffer.getvalue()


def write_shards(root: Path, labels: list[bytes], member: str = "cls", info: bool = True, classes=None) -> Path:
    """Shards of four samples each in timm's layout, ``labels`` as the ``member`` of each sample; with
    ``info`` a split-info file gives their lengths (and ``classes``), else they are found by name."""
    from webdataset import TarWriter

    root.mkdir(parents=True)
    filenames, lengths = [], []
    for shard, start in enumerate(range(0, len(labels), 4)):
        chunk = labels[start : start + 4]
        filenames.append(f"set-validation-{shard:02d}.tar")
        lengths.append(len(chunk))
        with TarWriter(str(root / filenames[-1])) as writer:
            for offset, label in enumerate(chunk):
                writer.write({"__key__": f"s{start + offset:03d}", "png": png(start + offset), member: label})
    if info:
        split = {"name": "validation", "num_samples": len(labels), "filenames": filenames, "shard_lengths": lengths}
        described = {"name": "set", "splits": {"validation": split}}
        if classes:
            described["classes"] = classes
        (root / "_info.json").write_text(json.dumps(described))
    return root


def open_shards(root: Path, target_key: str | None = None):
    return open_source(SourceRequest("wds/set", str(root), "validation", target_key=target_key))


def multi_hot(rows: list[list[int]], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        out[i, row] = 1.0
    return out


@pytest.mark.parametrize("info", [True, False], ids=["split-info", "found-by-name"])
def test_list_labels_make_a_multi_label_split(info: bool, tmp_path: Path) -> None:
    source = open_shards(write_shards(tmp_path / "set", CLS, info=info))
    sets = source.samples.label_sets
    assert sets is not None and len(sets) == len(CLS) and sets.num_classes == 4  # largest index + 1
    assert [sets.classes_of(i).tolist() for i in range(len(CLS))] == CLASSES
    np.testing.assert_array_equal(np.stack(labels_read(source)), multi_hot(CLASSES, 4))


def test_the_split_class_list_sets_the_width(tmp_path: Path) -> None:
    names = ["a", "b", "c", "d", "e", "f"]
    source = open_shards(write_shards(tmp_path / "set", CLS, classes=names))
    assert source.classes == names and source.samples.label_sets.num_classes == 6
    np.testing.assert_array_equal(np.stack(labels_read(source)), multi_hot(CLASSES, 6))
    images = source.images(lambda image: torch.zeros(3, 4, 4), "RGB")
    batch = collate([images[i] for i in range(len(images))])
    assert batch.targets.dtype == torch.float32 and tuple(batch.targets.shape) == (len(CLS), 6)
    np.testing.assert_array_equal(batch.targets.numpy(), multi_hot(CLASSES, 6))


@pytest.mark.parametrize(
    ("member", "encode"),
    [("json", lambda row: {"label": row}), ("labels.json", lambda row: row)],
    ids=["json-label", "json-list"],
)
def test_json_list_labels(member: str, encode, tmp_path: Path) -> None:
    root = write_shards(tmp_path / "set", [json.dumps(encode(row)).encode() for row in CLASSES], member)
    source = open_shards(root, None if member == "json" else member)
    assert [source.samples.label_sets.classes_of(i).tolist() for i in range(len(CLASSES))] == CLASSES
    np.testing.assert_array_equal(np.stack(labels_read(source)), multi_hot(CLASSES, 4))


def test_class_outside_the_class_list_is_a_bad_sample(tmp_path: Path) -> None:
    labels = [b"0,1", b"2", b"1,5", b"-1 0", b"2,0"]
    source = open_shards(write_shards(tmp_path / "set", labels, classes=["a", "b", "c"]))
    found = [source.samples.locate(i) for i in range(len(labels))]
    assert [isinstance(sample, BadSample) for sample in found] == [False, False, True, True, False]
    assert "label 5 (.cls) is out of range" in found[2].reason and "0..2 for the 3 classes" in found[2].reason
    assert "label -1 (.cls) is out of range" in found[3].reason
    sets = source.samples.label_sets  # the out-of-range classes left out, the rest kept
    assert [sets.classes_of(i).tolist() for i in range(len(labels))] == [[0, 1], [2], [1], [0], [0, 2]]
    np.testing.assert_array_equal(found[4].label, multi_hot([[0, 2]], 3)[0])


def test_missing_or_empty_label_is_still_no_label(tmp_path: Path) -> None:
    source = open_shards(write_shards(tmp_path / "set", [b"0,1", b"", b"x,y", b"1"]))
    found = [source.samples.locate(i) for i in range(4)]
    assert [isinstance(sample, BadSample) for sample in found] == [False, True, True, False]
    assert "no label (.cls)" in found[1].reason and "no label (.cls)" in found[2].reason
    np.testing.assert_array_equal(found[3].label, multi_hot([[1]], 2)[0])


def test_single_labels_stay_single(tmp_path: Path) -> None:
    source = open_shards(write_shards(tmp_path / "set", [b"2", b"0", b"1", b"1", b"2"]))
    assert source.samples.label_sets is None
    assert labels_read(source) == [2, 0, 1, 1, 2]


def test_lists_after_single_labels_make_shards_found_by_name_multi_label(tmp_path: Path) -> None:
    """Shards found by name are all indexed on opening: a list in the last one makes the split multi-label."""
    source = open_shards(write_shards(tmp_path / "set", [b"2", b"0", b"1", b"1", b"2,0"], info=False))
    rows = [[2], [0], [1], [1], [0, 2]]
    assert [source.samples.label_sets.classes_of(i).tolist() for i in range(5)] == rows
    np.testing.assert_array_equal(np.stack(labels_read(source)), multi_hot(rows, 3))


def test_list_after_a_single_label_first_shard_is_a_bad_sample_saying_so(tmp_path: Path) -> None:
    """Shards counted by the split info are indexed lazily: the first decides."""
    source = open_shards(write_shards(tmp_path / "set", [b"2", b"0", b"1", b"1", b"2,0"]))
    assert source.samples.label_sets is None
    bad = source.samples.locate(4)
    assert isinstance(bad, BadSample) and "read as single-label" in bad.reason and "first shard" in bad.reason
    assert source.samples.locate(3).label == 1

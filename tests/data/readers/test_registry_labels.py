"""The label each reader hands the loader, in process: tar shards (a .cls member, or only a .json one) and
parquet tables (a ClassLabel column) written here with webdataset's and datasets' own writers, read back
through ``open_source`` as train.py and validate.py open them, sample by sample, against the labels written.
Out-of-range labels stop with one line naming the row; -1 (unlabelled) passes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from vtools.data.decode import BadSample
from vtools.data.readers.registry import SourceRequest, open_source
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="readers run on the host")

LABELS = [2, 0, 1, 1, 2, 0, 2]  # every class, out of order, across two shards
NAMES = ["cat", "dog", "fox"]


def png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), (value * 40, 10, 20)).save(buffer, format="PNG")
    return buffer.getvalue()


def write_shards(root: Path, members: str) -> Path:
    """Two shards of LABELS in timm's layout; ``members`` "cls" writes .cls, "json" only .json labels."""
    from webdataset import TarWriter

    root.mkdir(parents=True)
    filenames, lengths = [], []
    for shard, start in enumerate((0, 4)):
        chunk = LABELS[start : start + 4]
        filenames.append(f"set-validation-{shard:02d}.tar")
        lengths.append(len(chunk))
        with TarWriter(str(root / filenames[-1])) as writer:
            for offset, label in enumerate(chunk):
                sample = {"__key__": f"s{start + offset:03d}", "png": png(start + offset)}
                if members == "cls":
                    sample["cls"] = str(label).encode()
                else:
                    sample["json"] = json.dumps({"label": label}).encode()
                writer.write(sample)
    split = {"name": "validation", "num_samples": len(LABELS), "filenames": filenames, "shard_lengths": lengths}
    (root / "_info.json").write_text(json.dumps({"name": "set", "splits": {"validation": split}}))
    return root


def labels_read(source) -> list:
    """Each sample's label as the store locates it (an int, or a multi-label sample's multi-hot row)."""
    found = []
    for index in range(len(source)):
        sample = source.samples.locate(index)
        assert not isinstance(sample, BadSample), sample
        found.append(sample.label)
    return found


@pytest.mark.parametrize("members", ["cls", "json"])
def test_shard_labels_are_the_labels_written(members: str, tmp_path: Path) -> None:
    root = write_shards(tmp_path / "set", members)
    source = open_source(SourceRequest("wds/set", str(root), "validation"))
    assert len(source) == len(LABELS)
    assert labels_read(source) == LABELS
    assert [source.samples.name(i).rsplit(":", 1)[1] for i in (0, 4, 6)] == ["s000", "s004", "s006"]


def write_table(root: Path, labels: list[int], names: list[str] | None = NAMES) -> Path:
    datasets = pytest.importorskip("datasets")
    label = datasets.ClassLabel(names=names) if names else datasets.Value("int64")
    features = datasets.Features({"image": datasets.Image(), "label": label})
    (root / "data").mkdir(parents=True)
    table = datasets.Dataset.from_dict(
        {"image": [{"bytes": png(i), "path": f"{i}.png"} for i in range(len(labels))], "label": labels},
        features=features,
    )
    table.to_parquet(str(root / "data" / "validation-00000-of-00001.parquet"))
    return root


def test_table_labels_are_the_labels_written(tmp_path: Path) -> None:
    root = write_table(tmp_path / "set", LABELS)
    source = open_source(SourceRequest("hfds/set", str(root), "validation"))
    assert source.classes == NAMES
    assert labels_read(source) == LABELS


def test_table_labels_below_minus_one_stop_in_one_line(tmp_path: Path) -> None:
    """(datasets itself refuses to write a ClassLabel beyond its names, so that case cannot be stored.)"""
    write_table(tmp_path / "set", [0, 1, -2, 1], None)
    with pytest.raises(UsageError) as error:
        open_source(SourceRequest("hfds/set", str(tmp_path / "set"), "validation"))
    assert all(word in str(error.value) for word in ("label -2", "row 2", "class indices from 0"))
    assert "\n" not in str(error.value)


def test_unlabelled_table_rows_pass_as_minus_one(tmp_path: Path) -> None:
    root = write_table(tmp_path / "set", [0, -1, 2], None)
    assert labels_read(open_source(SourceRequest("hfds/set", str(root), "validation"))) == [0, -1, 2]


def test_synset_folders_map_to_imagenet_indices_only_for_1000_outputs() -> None:
    from timm.data import ImageNetInfo

    from vtools.data.readers.folder import imagenet_class_map

    synsets = list(ImageNetInfo().label_names())
    chosen = [synsets[417], synsets[0], synsets[999]]
    assert imagenet_class_map(chosen, 1000) == {chosen[0]: 417, chosen[1]: 0, chosen[2]: 999}
    assert imagenet_class_map(chosen, 10) is None  # another label space: folder order applies
    assert imagenet_class_map([*chosen, "cat"], 1000) is None  # not all synsets
    assert imagenet_class_map([], 1000) is None


def test_class_map_file_gives_line_numbers(tmp_path: Path) -> None:
    from vtools.data.readers.folder import read_class_map

    path = tmp_path / "classes.txt"
    path.write_text("dog\n\ncat  extra words\nfox\n", encoding="utf-8")
    assert read_class_map(path) == {"dog": 0, "cat": 1, "fox": 2}
    with pytest.raises(UsageError, match="--class-map .*nope.txt does not exist"):
        read_class_map(tmp_path / "nope.txt")


def test_table_rows_without_label_or_image_come_as_bad_samples_and_paths_as_paths(tmp_path: Path) -> None:
    """A row whose label is missing or whose image is empty is a bad sample naming the column (the loader
    skips or stops on it, --on-bad-image); an image stored as a path is read from that path."""
    datasets = pytest.importorskip("datasets")

    picture = tmp_path / "picture.png"
    picture.write_bytes(png(1))
    features = datasets.Features({"image": datasets.Image(decode=False), "label": datasets.Value("int64")})
    rows = {
        "image": [
            {"bytes": png(0), "path": None},
            {"bytes": None, "path": str(picture)},
            None,
            {"bytes": png(2), "path": None},
        ],
        "label": [1, 2, 0, None],
    }
    (tmp_path / "set" / "data").mkdir(parents=True)
    datasets.Dataset.from_dict(rows, features=features).to_parquet(
        str(tmp_path / "set" / "data" / "validation-00000-of-00001.parquet")
    )
    source = open_source(SourceRequest("hfds/set", str(tmp_path / "set"), "validation"))
    first, second, third, fourth = (source.samples.locate(i) for i in range(4))
    assert first.label == 1 and first.image == png(0) and first.name == source.samples.name(0)
    assert second.label == 2 and second.image == str(picture) and second.name == str(picture)
    assert third == BadSample(source.samples.name(2), "no image in column 'image'")
    assert fourth == BadSample(source.samples.name(3), "no label in column 'label'")


def write_raw_table(root: Path, labels: list, label_feature: object) -> Path:
    """A parquet split written with pyarrow, its features declared in the schema as datasets declares them:
    what datasets' own writer refuses (a ClassLabel value beyond its names) can be stored this way."""
    datasets = pytest.importorskip("datasets")
    import pyarrow as pa
    import pyarrow.parquet as pq

    features = datasets.Features({"image": datasets.Image(), "label": label_feature})
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": png(i), "path": None} for i in range(len(labels))], image_type)
    table = pa.table({"image": images, "label": pa.array(labels)})
    metadata = {"huggingface": json.dumps({"info": {"features": features.to_dict()}})}
    (root / "data").mkdir(parents=True)
    pq.write_table(table.replace_schema_metadata(metadata), str(root / "data" / "validation-00000-of-00001.parquet"))
    return root


@pytest.mark.parametrize("names", [["a", "b", "c", "d"], ["a", "b", "c"]], ids=["four-names", "three-names"])
def test_a_class_label_beyond_its_names_stops_in_one_line(tmp_path: Path, names: list[str]) -> None:
    datasets = pytest.importorskip("datasets")
    root = write_raw_table(tmp_path / "set", [0, len(names), 1], datasets.ClassLabel(names=names))
    with pytest.raises(UsageError) as error:
        open_source(SourceRequest("hfds/set", str(root), "validation"))
    shown = "a, b, c, ..." if len(names) > 3 else "a, b, c"
    assert str(error.value) == (
        f"--dataset hfds/set: split 'validation' of {root} has label {len(names)} in column 'label' (row 1), "
        f"out of range for its {len(names)} class names (0..{len(names) - 1}: {shown}); fix the labels, or the "
        "class names of the column's ClassLabel feature"
    )


def test_a_label_column_of_names_stops_in_one_line_with_an_example(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    root = write_raw_table(tmp_path / "set", [None, "dog", "cat"], datasets.Value("string"))
    with pytest.raises(UsageError) as error:
        open_source(SourceRequest("hfds/set", str(root), "validation"))
    assert str(error.value) == (
        f"--dataset hfds/set: the label column 'label' of split 'validation' of {root} holds string values "
        "(e.g. 'dog'), not class indices; store integer labels (datasets: dataset.class_encode_column('label') "
        "turns names into indices) or name the label column with --target-key (columns: image, label)"
    )


def test_a_table_opened_without_a_label_column_reads_unlabelled(tmp_path: Path) -> None:
    """open_table_samples without a label column (the API, for tables that carry none): -1 for every row."""
    from vtools.data.readers.hfds import open_table_samples

    root = write_table(tmp_path / "set", [0, 2, 1])
    samples, classes = open_table_samples("hfds/set", "set", root, "validation", "image", None, False)
    assert classes is None
    assert [samples.locate(index).label for index in range(3)] == [-1, -1, -1]


def write_odd_shards(root: Path, classes: list[str] | None, counts: list[int]) -> Path:
    """Shard 0 holds six samples, each wrong in one way or right; shard 1 is not a tar. ``counts`` are the
    split info's sample counts per shard; ``classes`` its class list."""
    from webdataset import TarWriter

    root.mkdir(parents=True)
    samples = [
        {"__key__": "good", "png": png(1), "cls": b"2"},
        {"__key__": "no-image", "txt": b"words", "cls": b"1"},
        {"__key__": "no-label", "png": png(2)},
        {"__key__": "bad-label", "png": png(3), "cls": b"two"},
        {"__key__": "negative", "png": png(4), "cls": b"-3"},
        {"__key__": "too-large", "png": png(5), "cls": b"3"},
        {"__key__": "json-label", "png": png(6), "json": json.dumps({"label": 1, "w": 8}).encode()},
    ]
    with TarWriter(str(root / "odd-validation-00.tar")) as writer:
        for sample in samples:
            writer.write(sample)
    (root / "odd-validation-01.tar").write_bytes(b"not a tar file at all" * 40)
    split = {"name": "validation", "filenames": ["odd-validation-00.tar", "odd-validation-01.tar"]}
    info = {"name": "odd", "splits": {"validation": {**split, "shard_lengths": counts}}}
    if classes:
        info["classes"] = classes
    (root / "_info.json").write_text(json.dumps(info))
    return root


def outcomes(source) -> list[object]:
    """Each sample's label, or its BadSample's reason, by index."""
    found = [source.samples.locate(index) for index in range(len(source))]
    return [sample.reason if isinstance(sample, BadSample) else sample.label for sample in found]


def test_shard_samples_that_cannot_train_come_as_bad_samples_naming_why(tmp_path: Path) -> None:
    """Each bad sample of a shard is named with its reason (no image, no or unreadable label, a label
    outside the split info's classes, a shard shorter than the split info says, a damaged tar) and the
    good ones keep their labels: the loader skips or replaces the bad ones and reports each by name."""
    root = write_odd_shards(tmp_path / "odd", ["cat", "dog", "fox"], [8, 1])
    source = open_source(SourceRequest("wds/odd", str(root), "validation"))
    assert len(source) == 9 and source.classes == ["cat", "dog", "fox"]
    good, no_image, no_label, bad_label, negative, too_large, json_label, beyond, damaged = outcomes(source)
    assert (good, json_label) == (2, 1)
    assert no_image == "no image (.jpg, .jpeg, .png, .webp...) in the sample"
    assert no_label == bad_label == "no label (.cls) in the sample"  # a label that is not a number: none
    assert negative == (
        f"label -3 (.cls) is out of range: labels are class indices 0..2 for the 3 classes of {root / '_info.json'}; "
        "fix the sample's label or the class list"
    )
    assert too_large == negative.replace("label -3", "label 3")
    assert beyond == "the shard holds 7 samples but the split info says 8 (truncated?)"
    assert damaged.startswith("damaged tar shard (") and "\n" not in damaged, damaged
    located = [source.samples.locate(index) for index in range(len(source))]
    names = [sample.path if isinstance(sample, BadSample) else sample.name for sample in located]
    shard = f"{root}/odd-validation-00.tar"
    keys = ["good", "no-image", "no-label", "bad-label", "negative", "too-large", "json-label"]
    assert names == [f"{shard}:{key}" for key in keys] + [f"{shard} sample 7", f"{root}/odd-validation-01.tar sample 0"]


def test_shard_labels_without_a_class_list_only_need_to_be_non_negative(tmp_path: Path) -> None:
    root = write_odd_shards(tmp_path / "odd", None, [7, 1])
    found = outcomes(open_source(SourceRequest("wds/odd", str(root), "validation")))
    assert found[5] == 3
    assert found[4] == ("label -3 (.cls) is out of range: labels are class indices 0..N-1; fix the sample's label")


def test_a_shard_cut_inside_an_image_is_a_bad_sample(tmp_path: Path) -> None:
    """A tar cut inside its last image (a copy still being written): that sample is named, not read as
    a short image; the samples before it read whole."""
    import tarfile

    root = write_shards(tmp_path / "set", "cls")
    shard = root / "set-validation-00.tar"
    with tarfile.open(shard) as tar:
        last = [member for member in tar.getmembers() if member.name.endswith(".png")][-1]
    shard.write_bytes(shard.read_bytes()[: last.offset_data + 10])
    samples = open_source(SourceRequest("wds/set", str(root), "validation")).samples
    assert samples.locate(3) == BadSample(f"{shard}:s003", "the shard ends inside this sample (truncated tar)")
    assert [samples.locate(index).image for index in range(3)] == [png(index) for index in range(3)]

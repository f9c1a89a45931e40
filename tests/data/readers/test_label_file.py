"""A labels file beside an image folder makes the split multi-label: labels.csv (class names in columns of
their own, or several in one field) and labels.json written here, read back through ``open_source`` as
train.py opens a folder split: the images listed, each one's classes, the class order, the training split's
classes for the validation split, multi-hot rows from the loader and float32 N x K targets from ``collate``.
A missing listed image is a bad sample named by its path; every malformed file stops in one line naming the
file and the row."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import CLASSES, REPO, fashion_pairs
from vtools.data.decode import BadSample, RawSample
from vtools.data.loaders import collate
from vtools.data.readers.folder import labelled_images
from vtools.data.readers.label_file import LabelledFiles, read_label_file
from vtools.data.readers.path_table import PathTable
from vtools.data.readers.registry import Source, SourceRequest, open_source
from vtools.data.readers.split_scan import find_class_folders
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="readers run on the host")

# image -> its classes, as every form below writes them; c.png has none
LISTED = {"a.png": ["dog", "cat"], "sub/b.png": ["owl"], "c.png": [], "d.png": ["fox", "cat", "owl"]}
NAMES = ["cat", "dog", "fox", "owl"]
CSV_FORMS = {
    "columns": ["a.png,dog,cat", "sub/b.png,owl", "c.png", "d.png,fox,cat,owl"],
    "spaces": ["a.png,dog cat", "sub/b.png,owl", "c.png,", "d.png,fox  cat owl"],
    "semicolons": ["a.png,dog;cat", "sub/b.png,owl", "c.png,", "d.png,fox;cat;owl"],
    "pipes": ['a.png,"dog|cat"', "sub/b.png,owl", "c.png,", "d.png, fox | cat | owl"],
    "mixed": ["a.png,dog;cat", "./sub/b.png,owl", "", "c.png,,", "d.png,fox cat,owl;owl"],
    "quoted commas": ['a.png,"dog, cat"', "sub/b.png,owl", "c.png,", 'd.png,"fox,cat, owl"'],
}


def png(path: Path, value: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), (value * 40, 10, 20)).save(path)


def split(root: Path, name: str = "train", images: bool = True) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    if images:
        for value, path in enumerate(LISTED):
            png(folder / path, value)
    return folder


def write_csv(folder: Path, lines: list[str], header: str | None = None) -> Path:
    file = folder / "labels.csv"
    file.write_text("\n".join(([header] if header else []) + lines) + "\n", encoding="utf-8")
    return file


def open_split(root: Path, name: str = "train", class_map: dict[str, int] | None = None) -> Source:
    return open_source(SourceRequest("", str(root), name, class_map=class_map))


def class_sets(source: Source) -> dict[str, list[str]]:
    """Each listed path (relative to the split folder) with its class names, as the store holds them."""
    sets, names = source.samples.label_sets, source.classes
    root = Path(source.description.split(" (")[0])
    return {
        Path(source.samples.paths[i]).relative_to(root).as_posix(): [names[c] for c in sets.classes_of(i)]
        for i in range(len(source))
    }


def expected(listed: dict[str, list[str]] = LISTED) -> dict[str, list[str]]:
    return {path: sorted(set(names)) for path, names in listed.items()}


def one_line_error(root: Path, name: str = "train", class_map: dict[str, int] | None = None) -> str:
    with pytest.raises(UsageError) as error:
        open_split(root, name, class_map)
    message = str(error.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("form", sorted(CSV_FORMS))
@pytest.mark.parametrize("header", [None, "image,labels", "path,tags", "file,l1,l2", "Filename,labels"])
def test_csv_rows_list_the_images_and_their_classes(form: str, header: str | None, tmp_path: Path) -> None:
    write_csv(split(tmp_path), CSV_FORMS[form], header)
    source = open_split(tmp_path)
    assert source.classes == NAMES
    assert class_sets(source) == expected()
    assert source.samples.labels is None and source.samples.label_sets.num_classes == len(NAMES)
    assert source.description == f"{tmp_path / 'train'} (4 images, multi-label: 4 classes from labels.csv)"
    assert source.highest_label() == len(NAMES) - 1


def test_json_lists_the_images_and_their_classes(tmp_path: Path) -> None:
    folder = split(tmp_path)
    listed = {**LISTED, "sub/b.png": "owl"}  # a string is one class
    (folder / "labels.json").write_text(json.dumps(listed), encoding="utf-8")
    source = open_split(tmp_path)
    assert source.classes == NAMES
    assert class_sets(source) == expected()
    assert source.description.endswith("(4 images, multi-label: 4 classes from labels.json)")


def test_locate_gives_each_image_its_multi_hot_row(tmp_path: Path) -> None:
    write_csv(split(tmp_path), CSV_FORMS["columns"])
    samples = open_split(tmp_path).samples
    assert isinstance(samples, LabelledFiles)
    rows = []
    for index, path in enumerate(LISTED):
        sample = samples.locate(index)
        assert isinstance(sample, RawSample) and sample.image == sample.name == str(tmp_path / "train" / path)
        assert sample.label.dtype == np.float32
        rows.append(sample.label)
    np.testing.assert_array_equal(np.stack(rows), multi_hot(expected()))


def multi_hot(sets: dict[str, list[str]]) -> np.ndarray:
    out = np.zeros((len(sets), len(NAMES)), dtype=np.float32)
    for row, names in enumerate(sets.values()):
        out[row, [NAMES.index(name) for name in names]] = 1.0
    return out


def test_classes_are_sorted_as_class_folders_are(tmp_path: Path) -> None:
    names = ["zebra", "Zebra", "apple", "b_2", "b-1", "10", "9", "Äpfel"]
    folder = split(tmp_path, images=False)
    png(folder / "x.png")
    write_csv(folder, [f"x.png,{' '.join(names)}"])
    as_folders = tmp_path / "folders"
    for name in names:
        png(as_folders / name / "x.png")
    assert open_split(tmp_path).classes == find_class_folders(as_folders) == labelled_images(as_folders).classes


def test_the_validation_split_takes_the_training_classes(tmp_path: Path) -> None:
    write_csv(split(tmp_path, "train"), CSV_FORMS["columns"])
    val = split(tmp_path, "val", images=False)
    for value, path in enumerate(("v1.png", "v2.png", "v3.png")):
        png(val / path, value)
    write_csv(val, ["v1.png,owl", "v2.png,", "v3.png,owl dog"])  # two of the four classes, out of order
    train = open_split(tmp_path, "train")
    class_map = {name: index for index, name in enumerate(train.classes)}
    source = open_split(tmp_path, "validation", class_map)
    assert source.classes == NAMES and source.samples.label_sets.num_classes == len(NAMES)
    assert class_sets(source) == {"v1.png": ["owl"], "v2.png": [], "v3.png": ["dog", "owl"]}
    assert source.highest_label() == len(NAMES) - 1

    write_csv(val, ["v1.png,owl", "v2.png,", "v3.png,owl emu"])
    message = one_line_error(tmp_path, "validation", class_map)
    assert all(part in message for part in (str(val / "labels.csv"), "line 3", "'emu'", "cat, dog")), message


def test_a_missing_listed_image_is_a_bad_sample_named_by_its_path(tmp_path: Path) -> None:
    folder = split(tmp_path)
    write_csv(folder, [*CSV_FORMS["columns"], "gone.png,cat"])
    source = open_split(tmp_path)  # opening stats nothing: the missing file is found when it is read
    assert len(source) == 5
    items = source.images(lambda image: np.array(image), "RGB")
    bad, label, index = items[4]
    assert isinstance(bad, BadSample) and index == 4
    assert bad.path == str(folder / "gone.png") and bad.step == "reading" and "FileNotFoundError" in bad.reason
    np.testing.assert_array_equal(label, np.array([1, 0, 0, 0], dtype=np.float32))
    batch = collate([items[i] for i in range(5)])
    assert [sample.path for sample in batch.bad] == [str(folder / "gone.png")]
    assert tuple(batch.targets.shape) == (4, len(NAMES))


def test_collate_stacks_multi_hot_rows_into_float_targets(tmp_path: Path) -> None:
    write_csv(split(tmp_path), CSV_FORMS["spaces"], "image,labels")
    source = open_split(tmp_path)
    items = source.images(lambda image: torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1), "RGB")
    batch = collate([items[i] for i in range(len(items))])
    assert batch.targets.dtype == torch.float32 and tuple(batch.targets.shape) == (len(LISTED), len(NAMES))
    np.testing.assert_array_equal(batch.targets.numpy(), multi_hot(expected()))
    assert batch.indices.tolist() == [0, 1, 2, 3] and tuple(batch.images.shape) == (4, 3, 6, 8)


def test_paths_may_be_absolute_in_subfolders_or_outside_the_split(tmp_path: Path) -> None:
    """Decided: a labels file says what its split holds, wherever the images lie (a shared image store, a
    folder beside the split): absolute paths and ``../`` are read as written."""
    folder = split(tmp_path)
    elsewhere = tmp_path / "elsewhere" / "e.png"
    png(elsewhere)
    png(tmp_path / "shared" / "s.png")
    write_csv(folder, ["sub/b.png,owl", f"{elsewhere},cat", "./a.png,dog", "../shared/s.png,fox"])
    source = open_split(tmp_path)
    expected = [str(folder / "sub/b.png"), str(elsewhere), str(folder / "a.png"), str(folder / "../shared/s.png")]
    assert [os.path.normpath(path) for path in source.samples.paths] == [os.path.normpath(p) for p in expected]
    assert all(isinstance(source.samples.locate(i), RawSample) for i in range(4))
    images = source.images(lambda image: np.array(image), "RGB")
    assert not any(isinstance(images[i][0], BadSample) for i in range(4))


def test_a_labels_file_wins_over_class_folders_and_without_one_folders_are_read(tmp_path: Path) -> None:
    folder = split(tmp_path)  # sub/ holds an image: as a class folder it would be a class
    png(folder / "cat" / "x.png")
    assert open_split(tmp_path).classes == ["cat", "sub"]  # no labels file: class folders, single labels
    write_csv(folder, ["cat/x.png,cat dog"])
    source = open_split(tmp_path)
    assert source.classes == ["cat", "dog"] and len(source) == 1 and source.samples.labels is None


def test_labels_are_held_in_arrays(tmp_path: Path) -> None:
    folder = split(tmp_path, images=False)
    count = 20_000
    lines = [f"img/{i:06d}.png,c{i % 7} c{(i * 3) % 11}" for i in range(count)]
    write_csv(folder, lines)
    source = open_split(tmp_path)
    samples = source.samples
    sets = samples.label_sets
    assert isinstance(samples.paths, PathTable) and samples.labels is None and not samples.unreadable
    assert isinstance(sets.offsets, np.ndarray) and sets.offsets.dtype == np.int64 and len(sets.offsets) == count + 1
    assert isinstance(sets.indices, np.ndarray) and sets.indices.dtype == np.int32
    assert samples.paths.nbytes < count * 20  # 'img/000000.png' (14 bytes) and its 4-byte end
    assert sets.offsets.nbytes + sets.indices.nbytes <= count * (8 + 2 * 4) + 8
    assert sorted(vars(samples)) == ["label_sets", "labels", "labels_file", "paths", "unreadable"]
    assert [source.classes[c] for c in sets.classes_of(12)] == ["c3", "c5"]
    assert source.classes[:4] == ["c0", "c1", "c10", "c2"]  # sorted as names, as class folders are


def test_both_kinds_of_labels_file_are_refused(tmp_path: Path) -> None:
    folder = split(tmp_path)
    write_csv(folder, CSV_FORMS["columns"])
    (folder / "labels.json").write_text(json.dumps(LISTED))
    message = one_line_error(tmp_path)
    assert all(part in message for part in (str(folder), "labels.csv and labels.json", "keep one")), message


CSV_ERRORS = {
    "no path": (["a.png,cat", ",dog"], ("line 2", "no image path")),
    "listed twice": (["a.png,cat", "d.png,owl", "./a.png,dog"], ("line 3", "a.png is listed twice", "line 1")),
    "bad quoting": (["a.png,cat", '"d.png,owl'], ("line 2", "not valid CSV")),
    "no rows": ([], ("no rows",)),
    "header only": (["image,labels"], ("no rows",)),
    "no class at all": (["a.png,", "d.png"], ("no row names a class",)),
}


@pytest.mark.parametrize("case", sorted(CSV_ERRORS))
def test_a_malformed_csv_stops_in_one_line_naming_file_and_row(case: str, tmp_path: Path) -> None:
    lines, parts = CSV_ERRORS[case]
    file = write_csv(split(tmp_path), lines)
    message = one_line_error(tmp_path)
    assert all(part in message for part in (str(file), *parts)), message


def test_a_csv_that_is_not_text_names_its_line(tmp_path: Path) -> None:
    file = split(tmp_path) / "labels.csv"
    file.write_bytes(b"a.png,cat\nd.png,owl\nc.png,\xff\xfe\n")
    message = one_line_error(tmp_path)
    assert all(part in message for part in (str(file), "line 3", "not UTF-8")), message


def test_a_labels_file_that_cannot_be_read_is_refused(tmp_path: Path) -> None:
    folder = split(tmp_path)
    (folder / "labels.csv").mkdir()
    message = one_line_error(tmp_path)
    assert str(folder / "labels.csv") in message and "cannot be read" in message, message


JSON_ERRORS = {
    "not JSON": ('{"a.png": ["cat"],\n "d.png": [owl]}', ("line 2", "not valid JSON")),
    "not an object": ('[["a.png", "cat"]]', ("not an object",)),
    "a number": ('{"a.png": ["cat"], "d.png": 3}', ("entry 2", "'d.png'", "not a class name")),
    "a nested object": ('{"a.png": {"cat": 1}}', ("entry 1", "'a.png'", "not a class name")),
    "a null": ('{"a.png": null}', ("entry 1", "not a class name")),
    "listed twice": ('{"a.png": ["cat"], "d.png": [], "a.png": ["dog"]}', ("entry 3", "listed twice", "entry 1")),
    "no path": ('{"a.png": ["cat"], "": ["dog"]}', ("entry 2", "no image path")),
    "empty": ("{}", ("no rows",)),
    "two names in one string": (
        '{"a.png": "cat dog"}',
        ("entry 1", '"cat dog" is one string holding several names', '["cat", "dog"]'),
    ),
    "a comma in a listed name": ('{"a.png": ["owl", "cat, dog"]}', ("entry 1", '"cat, dog"', '["cat", "dog"]')),
}


@pytest.mark.parametrize("case", sorted(JSON_ERRORS))
def test_a_malformed_json_stops_in_one_line_naming_file_and_entry(case: str, tmp_path: Path) -> None:
    text, parts = JSON_ERRORS[case]
    file = split(tmp_path) / "labels.json"
    file.write_text(text, encoding="utf-8")
    message = one_line_error(tmp_path)
    assert all(part in message for part in (str(file), *parts)), message


def test_read_label_file_without_a_class_map_numbers_the_file_s_names(tmp_path: Path) -> None:
    file = write_csv(split(tmp_path), ["a.png,owl", "d.png,cat owl"])
    samples, classes = read_label_file(file)
    assert classes == ["cat", "owl"] and samples.label_sets.positives().tolist() == [1, 2]
    samples, classes = read_label_file(file, {"owl": 0, "cat": 1, "dog": 2})
    assert classes == ["owl", "cat", "dog"] and samples.label_sets.positives().tolist() == [2, 1, 0]


def test_fashion_pairs_builds_a_seeded_two_image_multi_label_set(tmp_path: Path) -> None:
    root = fashion_pairs(tmp_path / "one", 8, 5, seed=3)
    again = fashion_pairs(tmp_path / "two", 8, 5, seed=3)
    other = fashion_pairs(tmp_path / "three", 8, 5, seed=4)
    files = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    assert [p.as_posix() for p in files if p.name == "labels.csv"] == ["train/labels.csv", "val/labels.csv"]
    assert all((root / p).read_bytes() == (again / p).read_bytes() for p in files)
    assert any((root / p).read_bytes() != (other / p).read_bytes() for p in files)
    train = open_split(root, "train")
    assert train.classes == CLASSES and len(train) == 8
    val = open_split(root, "validation", {name: index for index, name in enumerate(train.classes)})
    assert len(val) == 5 and val.classes == CLASSES
    for name, source in (("train", train), ("val", val)):
        class_of = {
            np.asarray(Image.open(file).convert("L")).tobytes(): index
            for index, folder in enumerate(CLASSES)
            for file in (REPO / "data/fashion-mnist-mini" / name / folder).glob("*.png")
        }
        sets = source.samples.label_sets
        for index in range(len(source)):
            image = Image.open(source.samples.paths[index])
            assert image.size == (56, 28) and image.mode == "L"
            pixels = np.asarray(image)
            halves = {class_of[np.ascontiguousarray(pixels[:, x : x + 28]).tobytes()] for x in (0, 28)}
            assert sets.classes_of(index).tolist() == sorted(halves)
            assert CLASSES.index(CLASSES[index % 4]) in halves  # the left image's class goes round
        assert all(sets.positives() > 0)

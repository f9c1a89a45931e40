"""The compact path store: every path back as it went in, at about the bytes of its name."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from vtools.data.readers.path_table import PathTable, PathTableBuilder

pytestmark = pytest.mark.cpu_only(reason="host-side storage of file names")

NAMES = ["a.png", "dir/b c.jpg", "ünïcode/é.png", os.fsdecode(b"raw\xff\xfe.png"), "x" * 300 + ".png"]


def test_paths_come_back_as_they_went_in_with_and_without_a_root() -> None:
    table = PathTable.of(NAMES)
    assert list(table) == NAMES and len(table) == len(NAMES)
    rooted = PathTable.of(NAMES, "/data/train")
    assert list(rooted) == [os.path.join("/data/train", name) for name in NAMES]
    assert rooted[-1] == rooted[len(NAMES) - 1] and rooted[1:3] == [rooted[1], rooted[2]]
    with pytest.raises(IndexError):
        rooted[len(NAMES)]
    with pytest.raises(IndexError):
        rooted[-len(NAMES) - 1]
    assert list(PathTable.of([])) == [] and PathTable.of([], "/r")[0:5] == []


def test_folders_are_stored_once_and_their_paths_join_in_order() -> None:
    builder = PathTableBuilder("/data/train")
    for folder, names in (("cat", ["1.png", "sub/2.png"]), ("dog", []), ("eel", ["3.png"])):
        builder.add_folder(folder, PathTable.of(names, f"/data/train/{folder}"))
    table = builder.table()
    assert list(table) == ["/data/train/cat/1.png", "/data/train/cat/sub/2.png", "/data/train/eel/3.png"]
    assert table.folders == ["cat", "dog", "eel"] and table.folder_ends.tolist() == [2, 2, 3]
    with pytest.raises(ValueError, match="folders of its own"):
        builder.add_folder("again", table)


def test_an_empty_name_is_the_folder_itself() -> None:
    """A folder that cannot be listed is an entry of its own, named by its path."""
    builder = PathTableBuilder("/data")
    builder.add_folder("locked", PathTable.of([""], "/data/locked"))
    assert list(builder.table()) == ["/data/locked"]
    assert list(PathTable.of(["", "a.png"], "/data")) == ["/data", "/data/a.png"]


def test_a_table_pickles_to_itself() -> None:
    builder = PathTableBuilder("/r")
    builder.add_folder("c", PathTable.of(NAMES, "/r/c"))
    for table in (PathTable.of(NAMES, "/r"), builder.table()):
        copy = pickle.loads(pickle.dumps(table))
        assert list(copy) == list(table) and copy.folders == table.folders


def test_a_path_costs_its_name_and_four_bytes() -> None:
    names = [f"n{index // 300:08d}_{index}.JPEG" for index in range(30_000)]
    builder = PathTableBuilder("/imagenet/train")
    for start in range(0, len(names), 300):
        builder.add_folder(f"n{start // 300:08d}", PathTable.of(names[start : start + 300], "/x"))
    table = builder.table()
    assert table.ends.dtype == np.uint32
    name_bytes = sum(len(name) for name in names)
    assert table.nbytes <= name_bytes + 4 * len(names) + 100 * 9 + 8 * 100
    assert table[29_999] == "/imagenet/train/n00000099/" + names[-1]


def test_an_index_out_of_range_says_which_of_how_many() -> None:
    table = PathTable.of(NAMES, "/r")
    for index in (len(NAMES), -len(NAMES) - 1):
        with pytest.raises(IndexError, match=rf"^path {index if index >= 0 else -1} of {len(NAMES)}$"):
            table[index]
    with pytest.raises(IndexError, match=r"^path 0 of 0$"):
        PathTable.of([])[0]
    with pytest.raises(ValueError, match=r"^a table with folders of its own cannot be added as one folder$"):
        builder = PathTableBuilder("/r")
        builder.add_folder("c", PathTable.of(["a.png"], "/r/c"))
        PathTableBuilder("/").add_folder("r", builder.table())


def test_a_table_made_from_its_arrays_alone_has_no_folders() -> None:
    table = PathTable("/r", b"a.pngbb.png", np.array([5, 11], np.uint32))
    assert list(table) == ["/r/a.png", "/r/bb.png"]
    assert table.folder_ends.tolist() == [] and table.nbytes == 11 + 8


def test_a_builder_without_a_root_keeps_the_paths_as_given() -> None:
    builder = PathTableBuilder()
    builder.add([b"a.png", b"sub/b.png"])
    builder.add([b"/abs/c.png"])
    assert list(builder.table()) == ["a.png", "sub/b.png", "/abs/c.png"]
    empty = PathTableBuilder("/r").table()  # nothing added
    assert len(empty) == 0 and list(empty) == [] and empty.nbytes == 0


def test_offsets_past_4_gib_are_kept_in_64_bits() -> None:
    """ImageNet's names fill 40 MB; a tree whose names pass 4 GiB needs wider offsets, not wrapped ones."""

    class PastFourGiB(bytearray):  # the length of 4 GiB of names, without the memory
        def __len__(self) -> int:
            return 2**32 + super().__len__()

    builder = PathTableBuilder("/r")
    builder._blob = PastFourGiB()
    builder.add([b"a.png", b"bb.png"])
    ends = builder.table().ends
    assert ends.dtype == np.int64 and ends.tolist() == [2**32 + 5, 2**32 + 11]

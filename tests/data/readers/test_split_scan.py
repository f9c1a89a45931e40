"""A split's listing: kept while the tree is unchanged, listed again when it changes, in the order it always had."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from vtools.data.readers import split_scan
from vtools.data.readers.folder import labelled_images

pytestmark = pytest.mark.cpu_only(reason="listing folders is host-side")

HOUR_AGO = time.time() - 3600


def _tree(root: Path, files: dict[str, list[str]]) -> Path:
    for folder, names in files.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name in names:
            (root / folder / name).write_bytes(b"")
    return root


def _age(root: Path) -> None:
    """Every folder's time an hour back: a tree nobody wrote to lately, as a dataset is."""
    for folder, _, _ in os.walk(root):
        os.utime(folder, (HOUR_AGO, HOUR_AGO))


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders os.scandir lists from here on."""
    seen: list[str] = []
    listing = os.scandir

    def counted(path: str | bytes = ".") -> os.ScandirIterator:  # type: ignore[name-defined]
        seen.append(os.fsdecode(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", counted)
    monkeypatch.setattr(split_scan, "_kept", type(split_scan._kept)())
    return seen


def test_an_unchanged_tree_is_listed_once(tmp_path: Path, listings: list[str]) -> None:
    root = _tree(tmp_path / "train", {"cat": ["1.png", "2.png"], "dog/sub": ["3.png"], "dog": ["4.png"]})
    _age(root)
    listings.clear()
    first = labelled_images(root)
    assert len(listings) == 4  # the split, cat, dog, dog/sub
    again = labelled_images(root, {"cat": 1, "dog": 0})  # another labelling of the same listing
    assert len(listings) == 4
    assert list(again.entries.paths) == list(first.entries.paths) and again.labels.tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize(
    "change",
    [
        lambda root: (root / "cat" / "0.png").write_bytes(b""),
        lambda root: (root / "dog" / "sub" / "3.png").unlink(),
        lambda root: (root / "dog" / "sub" / "3.png").rename(root / "dog" / "sub" / "5.png"),
        lambda root: _tree(root, {"eel": ["6.png"]}),
        lambda root: (root / "cat").rename(root / "cow"),
    ],
    ids=["added", "removed-in-a-sub-folder", "renamed", "new-class", "class-renamed"],
)
def test_a_changed_tree_is_listed_again(tmp_path: Path, listings: list[str], change) -> None:  # type: ignore[no-untyped-def]
    root = _tree(tmp_path / "train", {"cat": ["1.png", "2.png"], "dog/sub": ["3.png"], "dog": ["4.png"]})
    _age(root)
    labelled_images(root)
    listings.clear()
    change(root)
    found = labelled_images(root)
    expected = sorted(str(p) for p in root.rglob("*.png"))
    assert list(found.entries.paths) == expected
    assert len(listings) >= 3


def test_a_tree_written_just_before_its_scan_is_not_trusted(tmp_path: Path, listings: list[str]) -> None:
    """A folder's time may tick too coarsely to show a second change in the same instant: not reused."""
    root = _tree(tmp_path / "train", {"cat": ["1.png"], "dog": ["2.png"]})
    labelled_images(root)
    labelled_images(root)
    assert len(listings) == 6


def test_order_is_sorted_rglobs_for_any_names(tmp_path: Path, listings: list[str]) -> None:
    """Names listed as bytes sort as their decoded text did: undecodable and non-ASCII names side by side."""
    names = ["b.png", "a.png", "é.png", "z.png", os.fsdecode(b"\xff.png"), os.fsdecode(b"\x80x.png"), "日.png"]
    root = _tree(tmp_path / "train", {"cls": names, "cls/é-sub": ["q.png"], "cls/a-sub": ["r.png"]})
    found = labelled_images(root)
    assert list(found.entries.paths) == sorted(str(p) for p in root.rglob("*.png"))


def test_many_class_folders_keep_their_order_whatever_the_threads_timing(tmp_path: Path, listings: list[str]) -> None:
    classes = {f"c{index:03d}": [f"{index}_{k}.png" for k in range(1 + index % 4)] for index in range(60)}
    root = _tree(tmp_path / "train", classes)
    found = labelled_images(root)
    expected = [str(root / c / n) for c in sorted(classes) for n in sorted(classes[c])]
    assert list(found.entries.paths) == expected
    assert found.labels.tolist() == [i for i, c in enumerate(sorted(classes)) for _ in classes[c]]

"""benchmarks/file_tree.py: the scale task's trees hold what they say, are reused, and are made again
when a build was interrupted."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from benchmarks.file_tree import MARKER, classes_for, ensure_tree, tree_path

pytestmark = pytest.mark.cpu_only(reason="writes files; runs nothing on a device")


def _counts(split: Path) -> list[int]:
    return [len(list(folder.iterdir())) for folder in sorted(split.iterdir())]


def test_classes_follow_imagenet_for_big_trees_and_100_files_each_below() -> None:
    assert [classes_for(n) for n in (10, 200, 10_000, 100_000, 300_000, 1_281_167)] == [1, 2, 100, 1000, 1000, 1000]


def test_a_tree_holds_its_files_in_its_classes_and_is_reused(tmp_path: Path) -> None:
    tree = ensure_tree(tmp_path, 250, 3)
    assert tree == tree_path(tmp_path, 250, 3)
    assert _counts(tree / "train") == [84, 83, 83] and _counts(tree / "validation") == [1, 1, 1]
    image = next((tree / "train" / "class0002").iterdir())
    with Image.open(image) as opened:
        assert opened.format == "PNG" and opened.size == (8, 8)
    files = list((tree / "train").rglob("*.png"))
    stamps = {path: path.stat().st_mtime_ns for path in [*files, tree / MARKER]}
    planted = tree / "train" / "planted.txt"  # gone if the tree were deleted and made again
    planted.write_text("kept")
    assert ensure_tree(tmp_path, 250, 3) == tree
    assert planted.exists() and {path: path.stat().st_mtime_ns for path in stamps} == stamps


def test_an_interrupted_tree_is_made_again(tmp_path: Path) -> None:
    tree = ensure_tree(tmp_path, 120, 2)
    (tree / MARKER).unlink()  # as a build stopped before its end leaves it
    for image in list((tree / "train" / "class0001").iterdir())[:30]:
        image.unlink()
    (tree / "train" / "planted.txt").write_text("stale")
    assert ensure_tree(tmp_path, 120, 2) == tree
    assert _counts(tree / "train") == [60, 60] and (tree / MARKER).is_file()
    assert not (tree / "train" / "planted.txt").exists()

"""Synthetic class-folder trees of N tiny PNGs, made once and reused: the scale task's data sets.

What the scale task measures grows with the number of files, not their contents, so every file holds
the same 8x8 PNG (a valid image: train.py and validate.py can decode it). A tree is
``<cache>/files-<N>-classes-<C>/`` holding ``train/`` (N files in C class folders, as evenly as they
divide) and ``validation/`` (one file per class, so that train.py has a validation split to build
without it costing anything that grows with N). Trees are kept between runs: a marker file, written
last, says a tree is complete; a tree without it (an interrupted build) is deleted and made again.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

MARKER = ".vtools-tree-complete"

MAX_CLASSES = 1000  # ImageNet's: the big trees have as many class folders
FILES_PER_CLASS = 100  # below 100 000 files, fewer folders of this many files each


def classes_for(files: int) -> int:
    """Class folders for a tree of ``files``: ImageNet's 1000 from 100 000 files up (300 files each at
    300 000, 1280 at 1 280 000), one per 100 files below (100 folders at 10 000), at least one."""
    return max(1, min(MAX_CLASSES, files // FILES_PER_CLASS))


def tiny_png() -> bytes:
    """The bytes every file of a tree holds: an 8x8 RGB PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (90, 120, 150)).save(buffer, format="PNG")
    return buffer.getvalue()


def tree_path(cache: Path, files: int, classes: int | None = None) -> Path:
    """Where the tree of ``files`` files lives in ``cache``."""
    return Path(cache) / f"files-{files}-classes-{classes or classes_for(files)}"


def is_complete(tree: Path) -> bool:
    """Whether ``tree`` was built to the end (its marker, written last, is there)."""
    return (tree / MARKER).is_file()


def ensure_tree(cache: Path, files: int, classes: int | None = None) -> Path:
    """The tree of ``files`` files (``classes`` folders; default :func:`classes_for`) in ``cache``: reused
    when complete, else (missing, or an interrupted build) made from scratch."""
    if files < 1:
        raise ValueError(f"a tree needs at least one file, not {files}")
    classes = min(classes or classes_for(files), files)
    tree = tree_path(cache, files, classes)
    if is_complete(tree):
        return tree
    if tree.exists():
        shutil.rmtree(tree)
    data = tiny_png()
    for split, counts in (("train", _split_evenly(files, classes)), ("validation", [1] * classes)):
        for label, count in enumerate(counts):
            _write_folder(tree / split / f"class{label:04d}", count, data)
    marker = {"files": files, "classes": classes, "validation_files": classes}
    (tree / MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
    return tree


def _split_evenly(files: int, classes: int) -> list[int]:
    """``files`` spread over ``classes`` folders, the first ones one more when they do not divide."""
    share, rest = divmod(files, classes)
    return [share + (label < rest) for label in range(classes)]


def _write_folder(folder: Path, count: int, data: bytes) -> None:
    """``count`` files holding ``data``, written with one open/write/close each (no Python file objects:
    300 000 of them take seconds, not minutes)."""
    folder.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for index in range(count):
        handle = os.open(folder / f"img{index:07d}.png", flags, 0o644)
        try:
            os.write(handle, data)
        finally:
            os.close(handle)

"""Walking an image folder: its images, and the entries that look like images but cannot be read.

A dangling link, a FIFO named like an image or a sub-folder that cannot be listed is not dropped: it is
returned with the reason it cannot be read, so that --on-bad-image counts and names it as it does a
corrupt file. Entry types come from the folder listing itself (``os.scandir``), so a regular file costs
no stat of its own; only links are followed (one stat each). Links to folders are not followed, as
``Path.rglob`` does not (a link back up the tree would never end).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from vtools.data.decode import IMAGE_EXTENSIONS, not_a_file_reason


def is_image_name(name: str) -> bool:
    """An image by its extension; macOS's ``._name`` resource forks (copied along by archivers) are not."""
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith("._")


@dataclass
class ImageEntries:
    """Paths in sorted order (as ``sorted(rglob)`` gives them), and the reason each unreadable one (by
    its index in ``paths``) cannot be read."""

    paths: list[Path] = field(default_factory=list)
    unreadable: dict[int, str] = field(default_factory=dict)

    def add(self, path: Path, reason: str | None = None) -> None:
        if reason is not None:
            self.unreadable[len(self.paths)] = reason
        self.paths.append(path)

    def extend(self, other: ImageEntries) -> None:
        for index, path in enumerate(other.paths):
            self.add(path, other.unreadable.get(index))


def scan_folder(folder: Path) -> ImageEntries:
    """Every image entry under ``folder`` (recursively), readable or not."""
    found = ImageEntries()
    _walk(folder, found)
    return found


def has_image_entries(folder: Path) -> bool:
    """Whether ``folder`` holds any image entry, readable or not (an empty class folder does not)."""
    return bool(scan_folder(folder).paths)


def _walk(folder: Path, found: ImageEntries) -> None:
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except OSError as err:  # permission denied, or gone since it was listed: its images are unknown
        found.add(folder, f"{type(err).__name__}: the folder cannot be listed ({err.strerror})")
        return
    for entry in entries:
        if _is_folder(entry):
            _walk(folder / entry.name, found)
        elif is_image_name(entry.name):
            found.add(folder / entry.name, None if _is_file(entry) else not_a_file_reason(entry.path))


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False

"""Walking an image folder: its images, and the entries that look like images but cannot be read.

A dangling link, a FIFO named like an image or a sub-folder that cannot be listed is not dropped: it is
returned with the reason it cannot be read, so that --on-bad-image counts and names it as it does a
corrupt file. Entry types come from the folder listing itself (``os.scandir``), so a regular file costs
no stat of its own; only links are followed (one stat each). Links to folders are not followed, as
``Path.rglob`` does not (a link back up the tree would never end). What a walk finds is kept in a
:class:`~vtools.data.readers.path_table.PathTable`: its cost is the bytes of the names, not an object
per file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

from vtools.data.decode import IMAGE_EXTENSIONS, not_a_file_reason
from vtools.data.readers.path_table import PathTable


def is_image_name(name: str) -> bool:
    """An image by its extension; macOS's ``._name`` resource forks (copied along by archivers) are not."""
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith("._")


@dataclass
class ImageEntries:
    """Paths in sorted order (as ``sorted(rglob)`` gives them), and the reason each unreadable one (by
    its index in ``paths``) cannot be read."""

    paths: PathTable = field(default_factory=lambda: PathTable.of([]))
    unreadable: dict[int, str] = field(default_factory=dict)


@dataclass
class EntryList:
    """Entries as a walk meets them (paths, or their bytes as the filesystem gives them), relative to
    the walk's root, until they are packed in a table."""

    names: list[str | bytes] = field(default_factory=list)
    unreadable: dict[int, str] = field(default_factory=dict)

    def add(self, name: str | bytes, reason: str | None = None) -> None:
        if reason is not None:
            self.unreadable[len(self.names)] = reason
        self.names.append(name)

    def packed(self, root: str = "") -> ImageEntries:
        """The entries in a :class:`PathTable` (relative to ``root``), their reasons kept by index."""
        return ImageEntries(PathTable.of(self.names, root), self.unreadable)


def scan_folder(folder: str | os.PathLike, folder_times: dict[str, int] | None = None) -> ImageEntries:
    """Every image entry under ``folder`` (recursively), readable or not, relative to ``folder``. With
    ``folder_times``, each folder's modification time, read before it is listed, is noted there by
    its path."""
    found = EntryList()
    _walk(os.fsencode(folder), b"", found, folder_times)
    return found.packed(os.fspath(folder))


def has_image_entries(folder: Path) -> bool:
    """Whether ``folder`` holds any image entry, readable or not (an empty class folder does not)."""
    return bool(scan_folder(folder).paths)


_by_name = attrgetter("name")
_IMAGE_SUFFIXES = tuple(os.fsencode(extension) for extension in IMAGE_EXTENSIONS)


def _walk(folder: bytes, prefix: bytes, found: EntryList, folder_times: dict[str, int] | None) -> None:
    """Lists in bytes, as the filesystem stores names: no name is decoded, or encoded again for the table."""
    try:
        if folder_times is not None:
            folder_times[os.fsdecode(folder)] = os.stat(folder).st_mtime_ns
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=_by_name)
    except OSError as err:  # permission denied, or gone since it was listed: its images are unknown
        found.add(prefix[:-1], f"{type(err).__name__}: the folder cannot be listed ({err.strerror})")
        return
    if not all(entry.name.isascii() for entry in entries):  # the order of the decoded names, as before
        entries.sort(key=lambda entry: os.fsdecode(entry.name))
    for entry in entries:
        name = entry.name
        if _is_folder(entry):
            _walk(entry.path, prefix + name + _SEP, found, folder_times)
        elif name.lower().endswith(_IMAGE_SUFFIXES) and not name.startswith(b"._"):
            found.add(prefix + name, None if _is_file(entry) else not_a_file_reason(os.fsdecode(entry.path)))


_SEP = os.fsencode(os.sep)


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

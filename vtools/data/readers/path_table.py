"""Many file paths in a few arrays: one bytes buffer of names and the offsets where each name ends.

A list of a million ``str`` (or ``Path``) objects costs 100-400 bytes per path, and every loader
worker that reads one copies the memory pages it lives on (reading an object writes its reference
count). Here the names are encoded back to back in a single buffer and located by a numpy array of
end offsets; the folders they sit in (a split's class folders) are stored once each, with the index
where each folder's names end. A path costs about the bytes of its file name plus 4, and a read
touches only a few objects' headers, so forked workers share the pages instead of copying them. A
path is decoded when it is asked for, as ``os.fsdecode`` would (undecodable bytes survive).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np


class PathTable(Sequence[str]):
    """File paths by index: ``root``, the path's folder (when the table has folders) and its stored
    name, joined (``root`` empty: the stored path as it is)."""

    __slots__ = ("_prefixes", "blob", "ends", "folder_ends", "folders", "root")

    def __init__(
        self,
        root: str,
        blob: bytes | bytearray,
        ends: np.ndarray,
        folders: Sequence[str] = (),
        folder_ends: np.ndarray | None = None,
    ) -> None:
        self.root = root
        self.blob = blob
        self.ends = ends
        self.folders = list(folders)
        self.folder_ends = np.zeros(0, np.int64) if folder_ends is None else folder_ends
        base = [os.path.join(root, folder) for folder in self.folders] or [root]
        self._prefixes = [(os.path.join(path, "") if path else "", path) for path in base]

    @classmethod
    def of(cls, paths: Iterable[str | bytes | os.PathLike], root: str = "") -> PathTable:
        """The table of ``paths`` (relative to ``root`` when it is given; bytes as the filesystem gives them)."""
        builder = PathTableBuilder(root)
        builder.add([os.fsencode(path) for path in paths])
        return builder.table()

    def __len__(self) -> int:
        return len(self.ends)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"path {index} of {len(self)}")
        start = int(self.ends[index - 1]) if index else 0
        name = self.blob[start : int(self.ends[index])].decode(_ENCODING, _ERRORS)
        folder = int(np.searchsorted(self.folder_ends, index, side="right")) if self.folders else 0
        prefix, whole = self._prefixes[folder]
        return prefix + name if name else whole  # no name: the folder itself (one that cannot be listed)

    def __iter__(self) -> Iterator[str]:
        return (self[index] for index in range(len(self)))

    @property
    def nbytes(self) -> int:
        """What the table holds in memory, its object headers aside."""
        return len(self.blob) + self.ends.nbytes + self.folder_ends.nbytes + sum(map(len, self.folders))

    def __reduce__(self) -> tuple[type, tuple]:
        return PathTable, (self.root, self.blob, self.ends, self.folders, self.folder_ends)


class PathTableBuilder:
    """A table grown in pieces (a class folder at a time): each piece is copied into one growing
    buffer and can be freed at once, so building costs the table and one piece, not twice the table."""

    def __init__(self, root: str = "") -> None:
        self.root = root
        self._blob = bytearray()
        self._ends: list[np.ndarray] = []
        self._count = 0
        self._folders: list[str] = []
        self._folder_ends: list[int] = []

    def add(self, encoded: Sequence[bytes]) -> None:
        """Append paths already encoded (``os.fsencode``), relative to the root."""
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        self._append(np.cumsum(lengths), b"".join(encoded))

    def add_folder(self, folder: str, table: PathTable) -> None:
        """Append the paths of ``table``, whose root is the folder ``folder`` of this table's root."""
        if table.folders:
            raise ValueError("a table with folders of its own cannot be added as one folder")
        self._append(table.ends.astype(np.int64), table.blob)
        self._folders.append(folder)
        self._folder_ends.append(self._count)

    def _append(self, ends: np.ndarray, blob: bytes | bytearray) -> None:
        self._ends.append(len(self._blob) + ends)
        self._blob += blob
        self._count += len(ends)

    def table(self) -> PathTable:
        ends = np.concatenate(self._ends) if self._ends else np.zeros(0, np.int64)
        wide = len(self._blob) > np.iinfo(np.uint32).max  # 32-bit offsets while the names fit in 4 GiB
        folder_ends = np.array(self._folder_ends, dtype=np.int64)
        ends = ends.astype(np.int64 if wide else np.uint32)
        return PathTable(self.root, self._blob, ends, self._folders, folder_ends)


_ENCODING, _ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()  # as os.fsdecode decodes

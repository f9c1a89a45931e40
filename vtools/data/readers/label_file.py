"""A labels file beside an image folder: a multi-label split (``labels.csv`` or ``labels.json``).

A split folder holding ``labels.csv`` or ``labels.json`` is read from that file instead of from class
subfolders, since an image with several classes (or none) cannot sit in one class folder:

- ``labels.csv``: rows ``path,labels...``; the path is relative to the split folder (or absolute), the
  class names follow in columns of their own or several in one field separated by whitespace, ``,``,
  ``;`` or ``|``; an empty label field is an image of no class. A first row whose first cell is ``image``,
  ``path``, ``file`` or ``filename`` is a header.
- ``labels.json``: ``{"relative/path.png": ["cat", "dog"], ...}``; a string is one class, ``[]`` none.

So a class name holds none of those separators: in a JSON file one that does (``"cat dog"``, most likely
two classes written as one string) is refused, naming the list to write instead.

Classes are the training split's (a class map) or else the file's sorted names. Paths go into a
:class:`PathTable` and labels into a :class:`LabelSets` as they are parsed, so a million rows cost a few
bytes each once read; listed files are not stat'ed (that would make opening a large list slow): a
missing one is a bad sample, named when the loader reaches it, as a missing image is in class folders.
"""

from __future__ import annotations

import csv
import gc
import json
import os
import posixpath
import sys
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from vtools.data.datasets import FileSamples
from vtools.data.decode import BadSample, RawSample
from vtools.data.label_sets import LabelSets
from vtools.data.readers.path_table import PathTable, PathTableBuilder
from vtools.errors import UsageError

LABEL_FILES = ("labels.csv", "labels.json")
_SEPARATORS_TO_SPACE = str.maketrans({",": " ", ";": " ", "|": " "})  # between class names, besides whitespace
HEADER_FIRST_CELLS = ("image", "path", "file", "filename")
_CHUNK = 1 << 16  # paths encoded and copied into the table this many at a time
_ENCODING, _ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


class LabelledFiles(FileSamples):
    """Image files listed by a labels file, each with its set of classes (a multi-hot row when read).

    ``labels`` is None: no single label exists, so class weights, the balanced sampler and label range
    checks (which read single labels) see none rather than a -1 each."""

    def __init__(self, paths: PathTable, label_sets: LabelSets, labels_file: str) -> None:
        super().__init__(paths)
        self.labels = None
        self.label_sets = label_sets
        self.labels_file = labels_file

    def locate(self, index: int) -> RawSample | BadSample:
        path = self.paths[index]
        return RawSample(path, self.label_sets.multi_hot(index), path)


def find_label_file(split_dir: Path) -> Path | None:
    """The split's labels file, when it has one (a dangling link counts: it is refused when read, not
    passed over for class folders); both kinds at once are refused."""
    present = [split_dir / name for name in LABEL_FILES if os.path.lexists(split_dir / name)]
    if len(present) > 1:
        raise UsageError(
            f"{split_dir} holds both {' and '.join(LABEL_FILES)}: keep one of them (they would both say each "
            "image's classes)"
        )
    return present[0] if present else None


def read_label_file(file: Path, class_map: dict[str, int] | None = None) -> tuple[LabelledFiles, list[str]]:
    """The images ``file`` lists with their classes, and the class names by index: ``class_map``'s (a
    name not in it is refused) or, without one, the file's names sorted as class folders are."""
    json_file = file.suffix == ".json"
    table = _Table(file, class_map, "entry" if json_file else "line")
    with _collector_paused():
        for number, path, names in _json_rows(file) if json_file else _csv_rows(file):
            table.add(number, path, names)
    return table.finish()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Parsing makes millions of short-lived lists and none that refer to each other; left on, Python's
    cycle collector walks every object alive (torch's among them) again and again meanwhile: parsing a
    1.28 M-entry labels.json took 7.6 s with it, 4.2 s without."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


class _Table:
    """Rows as they are parsed, kept as arrays: encoded paths in a growing table, each row's class ids
    in one flat array, and a hash and a line (or entry) number per path to find one listed twice."""

    def __init__(self, file: Path, class_map: dict[str, int] | None, row_word: str) -> None:
        self.file = file
        self.class_map = class_map
        self.row_word = row_word
        self.ids: dict[str, int] = {} if class_map is None else dict(class_map)
        self.builder = PathTableBuilder(str(file.parent))
        self.chunk: list[bytes] = []
        self.absolute = False
        self.counts = array("i")
        self.flat = array("i")
        self.hashes = array("q")
        self.numbers = array("q")

    def where(self, number: int) -> str:
        return f"{self.row_word} {number}"

    def add(self, number: int, path: str, names: Iterable[str]) -> None:
        if not path:
            raise UsageError(f"{self.file}, {self.where(number)}: no image path (each row starts with one)")
        if "/." in path or "//" in path or path.startswith("."):  # ./a.png and a.png are one image
            path = posixpath.normpath(path)
        self.absolute = self.absolute or path.startswith("/")
        self.chunk.append(path.encode(_ENCODING, _ERRORS))  # as os.fsencode, without its checks per path
        if len(self.chunk) >= _CHUNK:
            self.builder.add(self.chunk)
            self.chunk = []
        self.hashes.append(hash(path))
        known = self.ids
        ids = {known[name] if name in known else self._id(number, path, name) for name in names}
        self.counts.append(len(ids))
        self.flat.extend(ids)
        self.numbers.append(number)

    def _id(self, number: int, path: str, name: str) -> int:
        """A name met for the first time: a new class, or refused when the classes are given."""
        if self.class_map is not None:
            known = ", ".join(sorted(self.class_map, key=self.class_map.get)[:5])
            raise UsageError(
                f"{self.file}, {self.where(number)}: class {name!r} of {path} is not among the "
                f"{len(self.class_map)} classes given (the training split's, or --class-map's: "
                f"{known}{', ...' if len(self.class_map) > 5 else ''})"
            )
        self.ids[name] = len(self.ids)
        return self.ids[name]

    def finish(self) -> tuple[LabelledFiles, list[str]]:
        if self.chunk:
            self.builder.add(self.chunk)
        paths = self.builder.table()
        if not len(paths):
            raise UsageError(f"{self.file}: no rows (each row is an image path and its class names)")
        self._refuse_duplicates(paths)
        if self.absolute:  # a stored name is joined to the table's root as text: keep whole paths instead
            paths = _whole_paths(paths)
        classes, num_classes, remap = self._classes()
        offsets = np.zeros(len(self.counts) + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(self.counts, dtype=np.int32), out=offsets[1:])
        indices = np.frombuffer(self.flat, dtype=np.int32) if len(self.flat) else np.zeros(0, np.int32)
        label_sets = _ascending(offsets, indices if remap is None else remap[indices], num_classes)
        return LabelledFiles(paths, label_sets, str(self.file)), classes

    def _classes(self) -> tuple[list[str], int, np.ndarray | None]:
        """Names by index, their number, and how ids given while parsing become indices (None: as given)."""
        if self.class_map is not None:
            num_classes = max(self.class_map.values(), default=-1) + 1
            return sorted(self.class_map, key=self.class_map.get), num_classes, None
        if not self.ids:
            raise UsageError(
                f"{self.file}: no row names a class, so there are no classes to learn; add each image's class "
                "names after its path"
            )
        classes = sorted(self.ids)
        remap = np.empty(len(self.ids), dtype=np.int32)
        for index, name in enumerate(classes):
            remap[self.ids[name]] = index
        return classes, len(classes), remap

    def _refuse_duplicates(self, paths: PathTable) -> None:
        hashes = np.frombuffer(self.hashes, dtype=np.int64)
        order = np.argsort(hashes, kind="stable")
        same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
        pairs = sorted((int(order[i + 1]), int(order[i])) for i in same)  # (later row, earlier row)
        for later, earlier in pairs:
            if paths[earlier] == paths[later]:
                raise UsageError(
                    f"{self.file}, {self.where(self.numbers[later])}: {paths[later]} is listed twice (first at "
                    f"{self.where(self.numbers[earlier])}); list each image once, with all its classes"
                )


def _whole_paths(paths: PathTable) -> PathTable:
    """The table's paths joined to its root as paths join (an absolute one stays as it is), root-less."""
    root, start, builder, chunk = os.fsencode(paths.root), 0, PathTableBuilder(), []
    for end in paths.ends.tolist():
        chunk.append(os.path.join(root, bytes(paths.blob[start:end])))
        start = end
        if len(chunk) >= _CHUNK:
            builder.add(chunk)
            chunk = []
    builder.add(chunk)
    return builder.table()


def _ascending(offsets: np.ndarray, indices: np.ndarray, num_classes: int) -> LabelSets:
    """Each row's class indices ascending, as :class:`LabelSets` keeps them (rows hold no repeats here)."""
    rows = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
    order = np.lexsort((indices, rows))
    return LabelSets(offsets, np.ascontiguousarray(indices[order], dtype=np.int32), num_classes)


def _csv_rows(file: Path) -> Iterator[tuple[int, str, list[str]]]:
    """``(line number, path, class names)`` per row; blank lines and a header row are passed over."""
    handle = _open(file)
    reader = csv.reader(handle, strict=True)
    first = True
    try:
        with handle:
            for row in reader:
                path = row[0].strip() if row else ""
                if not path and not any(cell.strip() for cell in row):
                    continue  # a blank line
                if first and path.lower() in HEADER_FIRST_CELLS:
                    first = False
                    continue
                first = False
                labels = " ".join(row[1:]).translate(_SEPARATORS_TO_SPACE)
                yield reader.line_num, path, labels.split()  # split() at any whitespace
    except csv.Error as err:
        raise UsageError(
            f"{file}, line {reader.line_num}: not valid CSV ({err}); each row is an image path and its class "
            "names, a field with a comma or a quote in it is quoted"
        ) from None
    except UnicodeDecodeError as err:
        raise UsageError(f"{file}, line {_undecodable_line(file)}: not UTF-8 text ({_why(err)})") from None
    except OSError as err:
        raise UsageError(f"{file}, after line {reader.line_num}: cannot be read ({_why(err)})") from None


def _undecodable_line(file: Path) -> int:
    """The first line of ``file`` that is not UTF-8 (text is decoded a block at a time, so the reader's
    place is not the line); read again only on that error."""
    with open(file, "rb") as handle:
        for number, line in enumerate(handle, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


def _json_rows(file: Path) -> Iterator[tuple[int, str, list[str]]]:
    """``(entry number, path, class names)`` per entry of the file's one object."""
    handle = _open(file)
    try:
        with handle:
            entries = json.load(handle, object_pairs_hook=_Entries)
    except json.JSONDecodeError as err:
        raise UsageError(f"{file}, line {err.lineno}: not valid JSON ({err.msg})") from None
    except UnicodeDecodeError as err:
        raise UsageError(f"{file}, line {_undecodable_line(file)}: not UTF-8 text ({_why(err)})") from None
    except OSError as err:
        raise UsageError(f"{file}: cannot be read ({_why(err)})") from None
    if not isinstance(entries, _Entries):
        raise UsageError(
            f"{file}: holds a JSON {type(entries).__name__}, not an object of image path -> class names "
            '({"a.png": ["cat", "dog"], ...})'
        )
    for number, (path, value) in enumerate(entries, 1):
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or isinstance(names, _Entries) or not all(isinstance(n, str) for n in names):
            raise UsageError(
                f"{file}, entry {number} ({path!r}): {json.dumps(_plain(value))[:60]} is not a class name or a "
                "list of class names"
            )
        names = [name.strip() for name in names if name.strip()]
        joined = next((name for name in names if len(name.translate(_SEPARATORS_TO_SPACE).split()) > 1), None)
        if joined is not None:
            parts = json.dumps(joined.translate(_SEPARATORS_TO_SPACE).split())
            raise UsageError(
                f"{file}, entry {number} ({path!r}): {json.dumps(joined)} is one string holding several names; a "
                f"class name has no whitespace, ',', ';' or '|': write the classes as a list, {parts}"
            )
        yield number, path.strip(), names


class _Entries(list):
    """A JSON object's (key, value) pairs in file order, repeated keys kept (json's dict would drop one)."""


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, _Entries) else value


def _open(file: Path) -> Any:
    try:
        return open(file, encoding="utf-8-sig", newline="")  # noqa: SIM115 - closed by the reader
    except OSError as err:
        raise UsageError(f"{file}: cannot be read ({_why(err)})") from None


def _why(err: Exception) -> str:
    text = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    return f"{type(err).__name__}: {text}".splitlines()[0]

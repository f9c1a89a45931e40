"""Where a command writes, checked against what it reads before it does any work.

Every command hands :func:`check_outputs` the paths it reads and the paths it will write. An output that
is one of the inputs, that lies inside an input folder (the data being read: a report folder inside a
split would become a class), or that another output also names (two models' results in one file) stops
the command in one line naming both. Paths are compared as the real paths they resolve to, so a symlink
or a ``..`` does not hide a clash.

Then each output's folder is proven writable by writing a file there and removing it: ``os.access``
answers yes to root everywhere, even under /proc. Folders made for the proof are removed again, so a
refused command leaves nothing behind; the results themselves are written atomically (vtools/atomic.py).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vtools.errors import UsageError

Input = tuple[str, "str | os.PathLike | None"]  # (what it is, e.g. "the data"; its path): None is skipped


@dataclass(frozen=True)
class Output:
    """A file a command writes, named as the user named it (``what``: the flag); with ``files``, a folder
    that the command writes those files into (its other contents are left alone)."""

    what: str
    path: Path
    files: tuple[str, ...] | None = None

    @property
    def folder(self) -> Path:
        return self.path if self.files is not None else self.path.parent

    def written(self) -> list[Path]:
        return [self.path / name for name in self.files] if self.files is not None else [self.path]


def check_outputs(inputs: Iterable[Input], outputs: Sequence[Output]) -> None:
    """:func:`check_apart`, then prove that every output's folder takes a file."""
    check_apart(inputs, outputs)
    for output in outputs:
        prove_writable(output)


def check_apart(inputs: Iterable[Input], outputs: Sequence[Output]) -> None:
    """Refuse an output that would write over an input, into an input folder or over another output; this
    writes nothing. An input that is a folder is read whole (a data folder): pass the files a command reads
    from a model or run folder instead, so that writing beside them stays allowed."""
    present = [(what, Path(path)) for what, path in inputs if path and Path(path).exists()]
    for output in outputs:
        _check_against_inputs(output, present)
    _check_distinct(outputs)


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _check_against_inputs(output: Output, inputs: list[tuple[str, Path]]) -> None:
    written = [_real(path) for path in output.written()]
    place = _real(output.path)
    for what, path in inputs:
        real = _real(path)
        if path.is_dir() and _within(place, real):
            where = "is" if place == real else "is inside"
            raise UsageError(
                f"{output.what} {output.path} {where} {what} {path}, which this command reads: write it elsewhere"
            )
        if real in written:
            raise UsageError(
                f"{output.what} {output.path} would write over {what} {path}, an input of this command: "
                "write it elsewhere"
            )


def _check_distinct(outputs: Sequence[Output]) -> None:
    """No two outputs name one file (or one folder)."""
    seen: dict[Path, Output] = {}
    for output in outputs:
        folder = [output.path] if output.files is not None else []
        for place in {_real(path) for path in [*folder, *output.written()]}:
            other = seen.setdefault(place, output)
            if other is not output:
                raise UsageError(
                    f"{other.what} {other.path} and {output.what} {output.path} are one path: the second would "
                    "replace the first; give them different paths"
                )


def prove_writable(output: Output) -> None:
    """Make the output's folder, write and remove a file in it, then remove the folders made for the proof."""
    if output.files is None and output.path.is_dir():
        raise UsageError(f"{output.what} {output.path} is a folder, not a file")
    if output.files is not None and output.path.exists() and not output.path.is_dir():
        raise UsageError(f"{output.what} {output.path} is a file; give a folder")
    folder = output.folder
    missing = [path for path in (folder, *folder.parents) if not path.exists()]  # innermost first
    try:
        for path in reversed(missing):
            try:
                path.mkdir()
            except OSError as err:
                raise UsageError(f"{output.what} {output.path}: cannot create folder {path} ({err.strerror})") from err
        try:
            handle, temp = tempfile.mkstemp(dir=folder, prefix=".vtools-write-test-")
        except OSError as err:
            raise UsageError(f"{output.what} {output.path}: folder {folder} is not writable ({err.strerror})") from err
        os.close(handle)
        os.unlink(temp)
    finally:
        for path in missing:
            try:
                path.rmdir()
            except OSError:  # never made, or another process wrote into it meanwhile
                pass

"""Where a command writes, checked against what it reads before it does any work.

Every command hands :func:`check_outputs` the paths it reads and the paths it will write. An output that
is one of the inputs, that lies inside an input folder (the data being read: a report folder inside a
split would become a class), or that another output also names (two models' results in one file) stops
the command in one line naming both. Paths are compared as the real paths they resolve to, so a symlink
or a ``..`` does not hide a clash.

A run folder (one that holds a training run's ledger, vtools/run_ledger.py) belongs to its run: an output
that would replace a file the ledger lists is refused (unless the output is that very file brought up to
date, as ``vtools plot`` redraws a run's curves.png), and so is any output inside a run folder that the
command does not read from. validate.py's results beside the model it validates stay allowed; its results
over another run's summary.csv do not.

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
from vtools.run_ledger import LOCK_NAME, DamagedLock, read_ledger

Input = tuple[str, "str | os.PathLike | None"]  # (what it is, e.g. "the data"; its path): None is skipped


@dataclass(frozen=True)
class Output:
    """A file a command writes, named as the user named it (``what``: the flag); with ``files``, a folder
    that the command writes those files into (its other contents are left alone)."""

    what: str
    path: Path
    files: tuple[str, ...] | None = None
    refreshes_run_file: bool = False  # the run's own file, redrawn from the run (vtools plot's curves.png)

    @property
    def folder(self) -> Path:
        return self.path if self.files is not None else self.path.parent

    def written(self) -> list[Path]:
        return [self.path / name for name in self.files] if self.files is not None else [self.path]


def check_outputs(inputs: Iterable[Input], outputs: Sequence[Output]) -> None:
    """:func:`check_apart`, :func:`check_run_folders`, then prove that every output's folder takes a file."""
    inputs = list(inputs)
    check_apart(inputs, outputs)
    check_run_folders(inputs, outputs)
    for output in outputs:
        prove_writable(output)


def check_run_folders(inputs: Iterable[Input], outputs: Sequence[Output]) -> None:
    """Refuse an output that replaces a file a run's ledger lists, or lands in a run folder the command does
    not read (see the module). Not for train.py itself, which holds its folder's lock: reading the ledger
    through another handle would drop that lock."""
    read_runs = {run for _, path in inputs if path for run in [run_folder_of(Path(path))] if run is not None}
    for output in outputs:
        if output.files is not None:  # the folder itself: its files may not be known yet (vtools shards' OUT)
            _check_foreign_run(output, run_folder_of(output.path), read_runs)
        for written in output.written():
            place = _real(written)
            run = run_folder_of(place)
            if run is None:
                continue
            _check_run_files(output, place, run)
            _check_foreign_run(output, run, read_runs)


def _check_run_files(output: Output, place: Path, run: Path) -> None:
    """Refuse an output at ``place`` that would replace a file the run in ``run`` wrote."""
    try:
        listed = set(read_ledger(run))
    except DamagedLock:
        listed = None  # which files the run wrote cannot be told: every existing one may be its
    relative = place.relative_to(run).as_posix()
    # the ledger names a folder it wrote (model, eval) whole: an existing file under it is the run's too
    replaces = place.exists() and (listed is None or any(relative.startswith(f"{n}/") for n in listed))
    replaces = replaces or (listed is not None and relative in listed)
    if replaces and not output.refreshes_run_file:
        raise UsageError(
            f"{output.what} {output.path} would replace {relative} of the run {run} (a file that run wrote "
            "and reads back): write it elsewhere"
        )


def _check_foreign_run(output: Output, run: Path | None, read_runs: set[Path]) -> None:
    """Refuse an output inside the run folder ``run`` when the command reads nothing of that run."""
    if run is not None and run not in read_runs:
        raise UsageError(
            f"{output.what} {output.path} is inside the run folder {run}, which this command does not "
            "read: a run's folder holds that run's files; write it elsewhere"
        )


def run_folder_of(path: Path) -> Path | None:
    """The innermost folder at or above ``path`` (resolved) that holds a run's ledger: a run folder."""
    path = _real(path)
    for folder in (path, *path.parents):
        if (folder / LOCK_NAME).is_file():
            return folder
    return None


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

"""A training run's claim on its folder: a lock, and a ledger of the files vtools runs wrote there.

Two runs never write checkpoints and summaries into one folder: the lock is a
POSIX record lock (``lockf``) on ``.vtools-run.lock``. The kernel drops it when
the process that took it ends, however it ends, and loader workers forked from
that process never hold it (unlike ``flock``, whose lock every forked worker
shares), so a job requeued right after a ``kill -9`` is never refused.

The same file is the folder's ledger: its first line is the holder's pid, every
further line names a file that a vtools run wrote there. Clean-up and overwriting
go by what was written, never by what a folder happens to contain: a run that
fails before its first checkpoint removes exactly the files it created (and the
folder, when it made it and nothing else is left), and a file that no run wrote,
such as a user's own ``config.yaml``, is never deleted or written over.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from vtools.atomic import remove_stale_temporaries
from vtools.errors import UsageError
from vtools.run_ledger import LOCK_NAME, PID, DamagedLock, ledger_lines, read_ledger


def reserve_new_folder(output: Path, name: str) -> Path:
    """Create ``output/name`` (or ``name-2``, ``name-3``... when taken) and return it. Creating is the
    reservation, so two runs started in the same second get different folders."""
    output.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 10_000):
        folder = output / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise UsageError(f"--output {output}: could not find a free run folder name for {name}")


def _pid_line(handle: IO[str]) -> str:
    """The holder's pid as its lock file says, or "unknown"."""
    handle.seek(0)
    first = handle.readline().strip()
    return first if PID.fullmatch(first) else "unknown"


def holds_ended_run(folder: Path) -> bool:
    """Whether an earlier vtools run left files in ``folder`` (its ledger names one that is still there)
    and no run is writing there now. A lock file with no ledger comes from a vtools release that kept
    none: such a folder is taken as an ended run whenever it holds anything else, so that nothing in it
    is written over. A damaged lock file is said in one line (:class:`DamagedLock`) unless a live run
    holds it (then :func:`owned_folder` refuses the folder as that run's): its contents prove nothing,
    the kernel's record lock does."""
    try:
        ledger = read_ledger(folder)
    except DamagedLock:
        if _live_run_holds(folder):
            return False
        raise
    legacy = (folder / LOCK_NAME).is_file() and not ledger and any(p.name != LOCK_NAME for p in folder.iterdir())
    if not legacy and not any((folder / name).exists() for name in ledger):
        return False
    return not _live_run_holds(folder)  # a live run's folder: owned_folder refuses it, in its own words


def _live_run_holds(folder: Path) -> bool:
    """Whether a running process holds the folder's record lock. A lock file this process may not open for
    writing cannot be tested: it counts as not held, and a run never writes to such a folder anyway."""
    try:
        handle = open(folder / LOCK_NAME, "a", encoding="utf-8")
    except OSError:
        return False
    with handle:
        try:
            fcntl.lockf(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when closed
        except OSError:
            return True
    return False


class FolderClaim:
    """This process's hold on a run folder: what it created there, and the folder's ledger."""

    def __init__(self, folder: Path, handle: IO[str] | None, made_folder: bool, made_lock: bool) -> None:
        self.folder = folder
        self._handle = handle
        self.made_folder = made_folder
        self.made: list[Path] = [folder / LOCK_NAME] if made_lock else []
        self.ledger = set(ledger_lines(handle, folder)) if handle is not None else set()
        self.keep = False  # set once a checkpoint is written: from then on nothing is removed
        self._guard = threading.Lock()  # the checkpoint writer records from its own thread

    def owns(self, name: str) -> bool:
        """Whether ``name`` (relative to the folder) is free, or was written by a vtools run."""
        return name in self.ledger or not (self.folder / name).exists()

    def wrote(self, path: Path, created: bool, keep: bool = False) -> None:
        """Record that this run wrote ``path`` (``created``: it did not exist before); ``keep``: the run
        now has something worth keeping (a checkpoint), so a later failure removes nothing."""
        name = Path(path).relative_to(self.folder).as_posix()
        with self._guard:
            self.keep = self.keep or keep
            if created:
                self.made.append(Path(path))
            if name not in self.ledger and self._handle is not None:
                self.ledger.add(name)
                self._handle.seek(0, os.SEEK_END)
                self._handle.write(name + "\n")
                self._handle.flush()

    def undo(self) -> None:
        """Remove what this run created (it saved no checkpoint) and its lines in the ledger."""
        for path in reversed(self.made):
            if path.is_dir():
                _remove_empty(path)
            else:
                path.unlink(missing_ok=True)
        removed = {p.relative_to(self.folder).as_posix() for p in self.made}
        if self._handle is not None and (self.folder / LOCK_NAME).exists():
            self._rewrite(sorted(self.ledger - removed))
        if self.made_folder:
            _remove_empty(self.folder)

    def _rewrite(self, ledger: list[str]) -> None:
        assert self._handle is not None
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.write("".join(f"{line}\n" for line in [str(os.getpid()), *ledger]))
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


def _remove_empty(folder: Path) -> None:
    """Remove ``folder`` if it is empty: anything another hand put there stays."""
    try:
        folder.rmdir()
    except OSError:
        pass


def _lock(folder: Path) -> tuple[IO[str], bool]:
    """Take the folder's record lock; a folder this process may not write is refused before anything in
    it changes (the lock file included)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _not_writable(folder, "the folder is read-only to this user")
    made_lock = not (folder / LOCK_NAME).exists()
    try:
        handle = open(folder / LOCK_NAME, "a+", encoding="utf-8", errors="surrogateescape")
    except OSError as err:
        raise _not_writable(folder, f"{LOCK_NAME}: {err.strerror or err}") from None
    try:
        fcntl.lockf(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        owner = _pid_line(handle)
        handle.close()
        raise UsageError(
            f"{folder} belongs to a training run that is still going (pid {owner}); wait for it "
            "to end, or give this run another --experiment"
        ) from None
    return handle, made_lock


def _not_writable(folder: Path, why: str) -> UsageError:
    return UsageError(
        f"the run folder {folder} is not writable ({why}); make it writable (chmod -R u+w {folder}), or give this "
        "run another --experiment or --output"
    )


@contextmanager
def owned_folder(folder: Path, enabled: bool = True, made: bool = False) -> Iterator[FolderClaim]:
    """Hold ``folder`` for the block (rank 0 only: ``enabled``; other ranks get a claim that records
    nothing). ``made``: the caller created the folder for this run. If the block raises before the run
    wrote a checkpoint, remove exactly what the run created. Leftover temporary files of a writer that
    was killed (never a live one: the lock is held) are removed first."""
    if not enabled:
        yield FolderClaim(folder, None, made_folder=False, made_lock=False)
        return
    made = made or not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--output: cannot create the run folder {folder} ({err.strerror or err})") from err
    handle, made_lock = _lock(folder)
    try:
        claim = FolderClaim(folder, handle, made_folder=made, made_lock=made_lock)
    except DamagedLock:
        handle.close()
        raise
    claim._rewrite(sorted(claim.ledger))  # the holder's pid on the first line
    remove_stale_temporaries(folder, claim.ledger)
    try:
        yield claim
    except BaseException:
        if not claim.keep:
            claim.undo()
        raise
    finally:
        claim.close()

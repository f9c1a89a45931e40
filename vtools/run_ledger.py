"""A run folder's ledger: the files vtools runs wrote there, as ``.vtools-run.lock`` lists them.

The training run's lock file (vtools/train/run_lock.py) doubles as its folder's ledger: its first line is
the holder's pid, every further line names a file a vtools run wrote there, relative to the folder. The
lock lives with the run; reading the ledger lives here, below every command, because the output guard
(vtools/outputs.py) asks it too: a file a run wrote is that run's, and no other command writes over it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import IO

from vtools.errors import UsageError

LOCK_NAME = ".vtools-run.lock"
PID = re.compile(r"[0-9]+", re.ASCII)


class DamagedLock(UsageError):
    """A lock file that is not the pid and file list a vtools run writes: its ledger is lost."""

    def __init__(self, folder: Path) -> None:
        super().__init__(
            f"{folder / LOCK_NAME} is damaged (not the process id and file list a vtools run writes there), so "
            f"vtools cannot tell which files in {folder} a run wrote: give this run another --experiment, or, if "
            "no training run is using that folder, delete the file and continue the run with --resume auto"
        )


def read_ledger(folder: Path) -> list[str]:
    """The files (relative to ``folder``) that vtools runs wrote there, as their ledger lists them (raises
    :class:`DamagedLock` for a lock file vtools did not write). Never call it while this process holds
    the folder's lock: closing any handle of the lock file drops a POSIX lock (the claim reads its
    ledger through the handle that holds the lock)."""
    try:
        with open(folder / LOCK_NAME, encoding="utf-8", errors="surrogateescape") as handle:
            return ledger_lines(handle, folder)
    except OSError:
        return []


def ledger_lines(handle: IO[str], folder: Path) -> list[str]:
    """The ledger after the pid line. A lock vtools wrote is empty or starts with a pid, and names files
    in printable text; anything else (random bytes, another program's file) is :class:`DamagedLock`."""
    handle.seek(0)
    lines = handle.read().splitlines()
    names = [line.strip() for line in lines[1:] if line.strip()]
    if lines and not (PID.fullmatch(lines[0].strip()) and all(name.isprintable() for name in names)):
        raise DamagedLock(folder)
    return names

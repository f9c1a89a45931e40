"""A training run owns its folder, so two runs never write checkpoints and summaries into one.

The lock is an advisory ``flock`` on a file in the folder: the kernel drops it
when the process ends, however it ends, so a crashed run never leaves a stale
lock behind. A run that fails before it has saved anything removes the folder
it made (or what it added to an empty one), so failures leave no half-made
run folders.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from vtools.errors import UsageError

LOCK_NAME = ".vtools-run.lock"
_SCAFFOLDING = {LOCK_NAME, "config.yaml"}  # what a run writes before its first checkpoint


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


def holds_ended_run(folder: Path) -> bool:
    """Whether ``folder`` holds what an earlier run left (beyond the scaffolding of one that failed
    early) and no run is writing there now."""
    if not folder.is_dir() or all(p.name in _SCAFFOLDING for p in folder.iterdir()):
        return False
    try:
        with open(folder / LOCK_NAME, "a", encoding="utf-8") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when closed
    except OSError:
        return False  # a live run holds it: owned_folder refuses it, in its own words
    return True


def _lock(folder: Path) -> IO[str]:
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / LOCK_NAME, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise UsageError(
            f"{folder} belongs to a training run that is still going (pid {owner}); wait for it "
            "to end, or give this run another --experiment"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


@contextmanager
def owned_folder(folder: Path, enabled: bool = True) -> Iterator[None]:
    """Hold ``folder`` for the block (rank 0 only: ``enabled``). If the block raises before the run
    saved anything there, remove what the run created."""
    if not enabled:
        yield
        return
    existed_with_content = folder.is_dir() and any(p.name not in _SCAFFOLDING for p in folder.iterdir())
    handle = _lock(folder)
    try:
        yield
    except BaseException:
        if not existed_with_content and all(p.name in _SCAFFOLDING for p in folder.iterdir()):
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        handle.close()

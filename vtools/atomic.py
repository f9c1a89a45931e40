"""Writing files so that a failure never leaves a half-written one.

Everything a run writes (checkpoints, results, configs, summaries) goes to a
temporary file in the target folder and is renamed into place; copies use the
kernel's ``copy_file_range`` where it can.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

from vtools.errors import RunFailed


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None], durable: bool = True) -> Path:
    """Write through a temporary file in the same folder, then rename over ``path``; ``durable``: on disk
    (fsynced) before the rename, which a note rewritten every few seconds can do without."""
    target = Path(path)
    temp = ""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            if durable:
                os.fsync(stream.fileno())
        os.chmod(temp, shared_file_mode())  # mkstemp makes 0600; results are for sharing, as open() would
        os.replace(temp, target)
    except OSError as err:  # a full disk, a quota, a folder gone read-only: the old file stays as it was
        if temp:
            Path(temp).unlink(missing_ok=True)
        kept = "the previous version is intact" if target.exists() else f"{target.name} was not created"
        raise RunFailed(f"could not write {target} ({err.strerror or err}); {kept}") from err
    except BaseException:
        if temp:
            Path(temp).unlink(missing_ok=True)
        raise
    return target


def atomic_copy(source: Path, target: Path) -> Path:
    """``target`` becomes a copy of ``source``, atomically. A copy, not a hard link: a file written
    over in place later (an interrupted ``cp`` onto it) must not damage the other names."""

    def copy(stream: IO[bytes]) -> None:
        with open(source, "rb") as original:
            copy_contents(original, stream)

    return atomic_write(target, copy)


def atomic_link(source: Path, target: Path) -> Path:
    """``target`` becomes a second name of ``source`` (a hard link, put in place by a rename), or a
    copy where the filesystem has no hard links."""
    temp = target.with_name(f".{target.name}.{os.getpid()}.link")
    try:
        temp.unlink(missing_ok=True)
        os.link(source, temp)
        os.replace(temp, target)
    except OSError:
        temp.unlink(missing_ok=True)
        return atomic_copy(source, target)
    return target


def copy_contents(source: IO[bytes], target: IO[bytes]) -> None:
    """Copy one open file into another inside the kernel where it can (``copy_file_range``: no trip
    through Python buffers, and a reflink on filesystems that share extents), else through a buffer."""
    target.flush()
    size = os.fstat(source.fileno()).st_size
    copied = 0
    try:
        while copied < size:
            count = os.copy_file_range(source.fileno(), target.fileno(), size - copied)
            if count == 0:  # the source shrank under us: what is there is copied
                return
            copied += count
    except (AttributeError, OSError) as err:  # not Linux, or files this kernel cannot copy between
        if copied or (isinstance(err, OSError) and err.errno not in _NO_KERNEL_COPY):
            raise
        shutil.copyfileobj(source, target, 1 << 22)


_NO_KERNEL_COPY = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF, errno.ETXTBSY}


def shared_file_mode() -> int:
    """The mode ``open()`` gives a new file (0666 less the umask): temporary files are made 0600, and
    results, checkpoints and model folders are for sharing."""
    current = os.umask(0)
    os.umask(current)
    return 0o666 & ~current


def atomic_write_text(path: str | os.PathLike, text: str, durable: bool = True) -> Path:
    """UTF-8 text; characters that cannot be encoded (a file name that is not UTF-8) are escaped."""
    return atomic_write(path, lambda stream: stream.write(text.encode("utf-8", errors="backslashreplace")), durable)


def temporary_names(target: Path) -> list[Path]:
    """The temporary files :func:`atomic_write` and :func:`atomic_link` leave for ``target`` when their
    process is killed mid-write (their names are ours: ``.<name>.<random>.tmp``, ``.<name>.<pid>.link``)."""
    target = Path(target)
    return [*target.parent.glob(f".{target.name}.*.tmp"), *target.parent.glob(f".{target.name}.*.link")]


def remove_stale_temporaries(folder: Path, names: Iterable[str]) -> list[Path]:
    """Remove what killed writers left for the files ``names`` (relative to ``folder``); call it only
    while no writer can be running there (a run holds the folder's lock)."""
    stale = [temp for name in names for temp in temporary_names(folder / name)]
    for temp in stale:
        if temp.is_dir():  # a staging folder (a model folder's files, written before they are renamed)
            shutil.rmtree(temp, ignore_errors=True)
        else:
            temp.unlink(missing_ok=True)
    return stale

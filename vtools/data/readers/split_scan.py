"""A split's class folders listed once per job: concurrently, kept while the tree is unchanged, shared by ranks.

Listing ImageNet's 1.28 M files takes seconds on a local disk and minutes on a network one, and a job
asks for the same split several times (validate.py checks the data before it builds the model, then
labels it; every checkpoint of a sweep validates it again) and from every rank. So:

- the class folders are listed by a pool of threads (the time is the filesystem's wait, which threads
  overlap); the order is the sorted one, whatever the threads' timing;
- a process keeps the last scans, each with the modification time of every folder it listed. A folder's
  time changes when an entry is added, removed or renamed in it, so a scan whose folders all still
  carry their times is the tree as it is now and is reused; one that does not is listed again. A
  folder changed within the last seconds of its scan is never trusted (its clock may tick too coarsely
  to show a second change), so a freshly written tree is always listed again;
- with ``VTOOLS_LISTINGS`` set, a listing is saved there for later jobs and checked the same way
  (listing.py);
- under torchrun (or srun), rank 0 lists the tree and the other ranks receive its scan (or the one-line
  error it raised) by one broadcast: N ranks cost one scan of a shared filesystem, not N.
"""

from __future__ import annotations

import os
import sys
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vtools.data.readers.listing import (
    LISTINGS_VARIABLE,
    RACY_SECONDS,
    SplitScan,
    listing_file,
    listings_folder,
    load_listing,
    save_listing,
)
from vtools.data.readers.path_table import PathTableBuilder
from vtools.data.readers.scan import ImageEntries, scan_folder
from vtools.errors import RunFailed, UsageError
from vtools.runtime.cpu_budget import return_freed_host_memory
from vtools.runtime.distributed import computed_by_main

SCAN_THREADS = 8  # class folders listed at once: the wait is the filesystem's (a network one above all)
KEPT_SCANS = 4  # a job's splits (train, validation) and a few more
__all__ = ["RACY_SECONDS", "SplitScan", "find_class_folders", "scan_split"]  # the listing's terms, named here too


_kept: OrderedDict[str, SplitScan] = OrderedDict()


def find_class_folders(root: Path) -> list[str]:
    """Class folder names of an ImageNet-style split, sorted as torchvision does."""
    if not root.is_dir():
        raise UsageError(f"{root} does not exist or is not a folder")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith("."))
    if not classes:
        raise UsageError(f"{root} has no class folders (expected one folder per class)")
    return classes


def scan_split(root: Path) -> SplitScan:
    """The class folders of ``root`` and their image entries: a kept scan while the tree is unchanged,
    else a new one; rank 0's on every rank of a distributed job."""
    outcome = computed_by_main(lambda: _scan_or_refusal(root))
    if isinstance(outcome, str):
        raise UsageError(outcome)
    return outcome


def _scan_or_refusal(root: Path) -> SplitScan | str:
    """The scan, or the refusal it raised (sent to the other ranks instead of leaving them waiting)."""
    try:
        return _kept_or_new(root)
    except UsageError as err:
        return str(err)


def _kept_or_new(root: Path) -> SplitScan:
    key = os.path.abspath(root)
    _check_listings_apart(root)
    kept = _kept.get(key) or _saved(root)
    if kept is not None and kept.is_current():  # the split folder's time says whether classes came or went
        _keep(key, kept)
        return kept
    scan = _new_scan(root)
    _keep(key, scan)
    _save(scan)
    return scan


def _keep(key: str, scan: SplitScan) -> None:
    _kept[key] = scan
    _kept.move_to_end(key)
    while len(_kept) > KEPT_SCANS:
        _kept.popitem(last=False)


def _saved(root: Path) -> SplitScan | None:
    """The listing an earlier job saved under ``VTOOLS_LISTINGS`` (checked by the caller), if any."""
    folder = listings_folder()
    return load_listing(listing_file(folder, str(root)), str(root)) if folder else None


def _check_listings_apart(root: Path) -> None:
    """A listings folder inside the split it lists would become one of its class folders (or images)."""
    folder = listings_folder()
    if folder is None:
        return
    split, place = os.path.realpath(root), os.path.realpath(folder)
    if place == split or place.startswith(split + os.sep):
        raise UsageError(
            f"{LISTINGS_VARIABLE}={folder} is inside the split {root} it would list: saved there, its listings "
            "would be read as part of the data; point it at a folder outside the data"
        )


def _save(scan: SplitScan) -> None:
    folder = listings_folder()
    if folder is None:
        return
    try:
        save_listing(listing_file(folder, scan.root), scan)
    except (OSError, RunFailed) as err:  # the listing is a saving of time, not a result: the run goes on without it
        cause = err if isinstance(err, OSError) else err.__cause__
        reason = getattr(cause, "strerror", None) or str(err)
        print(f"warning: {LISTINGS_VARIABLE}={folder}: the listing cannot be saved ({reason})", file=sys.stderr)


def _new_scan(root: Path) -> SplitScan:
    started = time.time()
    times = {str(root): _folder_time(str(root))}
    classes = find_class_folders(root)
    with ThreadPoolExecutor(max_workers=min(SCAN_THREADS, len(classes) or 1), thread_name_prefix="scan") as pool:
        parts = pool.map(lambda name: scan_folder(root / name, times), classes)
        entries, counts = _joined(str(root), classes, parts)  # each class folder's piece is freed once it is copied
    return_freed_host_memory()  # the threads' listings, freed in their own malloc pools
    return SplitScan(str(root), list(classes), entries, counts, times, started)


def _joined(root: str, classes: list[str], parts: Iterable[ImageEntries]) -> tuple[ImageEntries, list[int]]:
    """The class folders' entries one after another (each unreadable reason moved to its new index), and
    how many each holds."""
    builder, unreadable, counts = PathTableBuilder(root), {}, []
    for name, part in zip(classes, parts):
        offset = sum(counts)
        unreadable.update({offset + index: reason for index, reason in part.unreadable.items()})
        builder.add_folder(name, part.paths)
        counts.append(len(part.paths))
    return ImageEntries(builder.table(), unreadable), counts


def _folder_time(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1  # never equal to a folder's time: a scan of a folder that vanished is not reused

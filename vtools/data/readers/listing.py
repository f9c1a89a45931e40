"""A split's listing: what it found, when it may be trusted, and its copy saved between jobs.

A listing notes the modification time of every folder it listed. A folder's time changes when an entry
is added, removed or renamed in it, so a listing whose folders all still carry their times is the tree
as it is now. A folder changed within the last seconds before its listing is never trusted: its clock
may tick too coarsely to show a second change.

A job on ImageNet over a network filesystem spends its first minute listing 1.28 M files that have not
changed since the last job. With ``VTOOLS_LISTINGS=<folder>`` set, each listing is saved there (one
file per split, named by a hash of the split's path; never in the data folder unless that is the folder
named) and the next job checks it instead of listing again: one stat per folder (1 001 for ImageNet).
A file that is damaged, from another format or stale is listed over. Files are plain numpy archives,
read with ``allow_pickle=False``: nothing in them is executed.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vtools.atomic import atomic_write
from vtools.data.readers.path_table import PathTable
from vtools.data.readers.scan import ImageEntries

LISTINGS_VARIABLE = "VTOOLS_LISTINGS"
FORMAT = 1


RACY_SECONDS = 2.0  # a folder changed this close to its scan may change again without its time showing it


@dataclass
class SplitScan:
    """The class folders of one split, their image entries one folder after another, how many each
    holds, and the modification time of every folder listed, by its path."""

    root: str
    classes: list[str]
    entries: ImageEntries
    counts: list[int]
    folder_times: dict[str, int]
    scanned_at: float

    def is_current(self) -> bool:
        """Whether the tree still is what was listed: every folder carries the time it had, none had
        changed just before the scan."""
        for folder, listed in self.folder_times.items():
            if listed >= (self.scanned_at - RACY_SECONDS) * 1e9:
                return False
            try:
                if os.stat(folder).st_mtime_ns != listed:
                    return False
            except OSError:
                return False
        return True


def listings_folder() -> Path | None:
    """The folder ``VTOOLS_LISTINGS`` names, None when unset."""
    value = os.environ.get(LISTINGS_VARIABLE, "").strip()
    return Path(value).expanduser() if value else None


def listing_file(folder: Path, root: str) -> Path:
    """Where the listing of the split ``root`` is saved in ``folder``."""
    return folder / f"split-{hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:20]}.npz"


def save_listing(file: Path, scan: SplitScan) -> None:
    """Write ``scan`` to ``file`` atomically (the folder is made when missing)."""
    paths = scan.entries.paths
    about = {
        "format": FORMAT,
        "root": scan.root,
        "classes": scan.classes,
        "counts": scan.counts,
        "unreadable": {str(index): reason for index, reason in scan.entries.unreadable.items()},
        "folder_times": scan.folder_times,
        "scanned_at": scan.scanned_at,
        "folders": paths.folders,
    }
    arrays = {
        "about": np.frombuffer(json.dumps(about).encode(), dtype=np.uint8),
        "names": np.frombuffer(bytes(paths.blob), dtype=np.uint8),
        "ends": paths.ends,
        "folder_ends": paths.folder_ends,
    }
    file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(file, lambda handle: np.savez(handle, **arrays), durable=False)


def load_listing(file: Path, root: str) -> SplitScan | None:
    """The saved listing of ``root``, None when there is none or it is
    damaged, of another format or of another folder (a hash collision)."""
    try:
        with np.load(file, allow_pickle=False) as saved:
            about = json.loads(saved["about"].tobytes())
            names, ends, folder_ends = saved["names"].tobytes(), saved["ends"], saved["folder_ends"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
        return None
    if not isinstance(about, dict) or about.get("format") != FORMAT or about.get("root") != root:
        return None
    table = PathTable(root, names, ends, about["folders"], folder_ends)
    unreadable = {int(index): reason for index, reason in about["unreadable"].items()}
    entries = ImageEntries(table, unreadable)
    return SplitScan(root, about["classes"], entries, about["counts"], about["folder_times"], about["scanned_at"])

"""A split's listing saved between jobs, in a folder the user names, and trusted only while the tree holds.

A job on ImageNet over a network filesystem spends its first minute listing 1.28 M files that have not
changed since the last job. With ``VTOOLS_LISTINGS=<folder>`` set, each listing is saved there (one
file per split, named by a hash of the split's path; never in the data folder unless that is the folder
named) and the next job checks it instead of listing again: one stat per folder (1 001 for ImageNet)
against the modification times saved with it, under the same rules as a listing kept in memory
(:meth:`SplitScan.is_current`). A file that is damaged, from another format or stale is listed over.
Files are plain numpy archives, read with ``allow_pickle=False``: nothing in them is executed.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Protocol

import numpy as np

from vtools.atomic import atomic_write
from vtools.data.readers.path_table import PathTable
from vtools.data.readers.scan import ImageEntries

LISTINGS_VARIABLE = "VTOOLS_LISTINGS"
FORMAT = 1


class Listing(Protocol):
    """What a saved listing holds (``split_scan.SplitScan``'s fields, which that module builds from them)."""

    root: str
    classes: list[str]
    entries: ImageEntries
    counts: list[int]
    folder_times: dict[str, int]
    scanned_at: float


def listings_folder() -> Path | None:
    """The folder ``VTOOLS_LISTINGS`` names, None when unset."""
    value = os.environ.get(LISTINGS_VARIABLE, "").strip()
    return Path(value).expanduser() if value else None


def listing_file(folder: Path, root: str) -> Path:
    """Where the listing of the split ``root`` is saved in ``folder``."""
    return folder / f"split-{hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:20]}.npz"


def save_listing(file: Path, scan: Listing) -> None:
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


def load_listing(file: Path, root: str) -> dict | None:
    """The saved listing of ``root`` as a :class:`Listing`'s fields, None when there is none or it is
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
    return {
        "root": root,
        "classes": about["classes"],
        "entries": ImageEntries(table, unreadable),
        "counts": about["counts"],
        "folder_times": about["folder_times"],
        "scanned_at": about["scanned_at"],
    }

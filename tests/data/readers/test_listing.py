"""Listings saved between jobs under VTOOLS_LISTINGS: reused while the tree holds, never trusted beyond it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import run_script
from vtools.data.readers import split_scan
from vtools.data.readers.folder import labelled_images
from vtools.data.readers.listing import listing_file
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="listing folders is host-side")

FILES = {"cat": ["1.png", "2.png"], "dog/sub": ["3.png"], "dog": ["4.png", os.fsdecode(b"\xff.png")]}


def _tree(root: Path, files: dict[str, list[str]]) -> Path:
    for folder, names in files.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name in names:
            (root / folder / name).write_bytes(b"")
    hour_ago = time.time() - 3600
    for folder, _, _ in os.walk(root):
        os.utime(folder, (hour_ago, hour_ago))
    return root


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, folder_listings: list[str]) -> list[str]:
    """The folders listed, with VTOOLS_LISTINGS set and nothing kept in this process."""
    monkeypatch.setenv("VTOOLS_LISTINGS", str(tmp_path / "listings"))
    return folder_listings


def _a_new_process() -> None:
    split_scan._kept.clear()


def test_a_saved_listing_spares_the_next_job_its_listing(tmp_path: Path, listings: list[str]) -> None:
    root = _tree(tmp_path / "train", FILES)
    listings.clear()
    first = labelled_images(root)
    saved = listing_file(tmp_path / "listings", str(root))
    assert saved.is_file() and len(listings) == 4
    _a_new_process()
    again = labelled_images(root)
    assert len(listings) == 4  # checked by one stat per folder, not listed
    assert list(again.entries.paths) == list(first.entries.paths) == sorted(str(p) for p in root.rglob("*.png"))
    assert again.labels.tolist() == first.labels.tolist() and again.classes == first.classes


def test_a_stale_or_damaged_listing_is_listed_over(tmp_path: Path, listings: list[str]) -> None:
    root = _tree(tmp_path / "train", FILES)
    listings.clear()
    labelled_images(root)
    saved = listing_file(tmp_path / "listings", str(root))
    (root / "dog" / "sub" / "5.png").write_bytes(b"")  # the sub-folder's time moves
    _a_new_process()
    found = labelled_images(root)
    assert str(root / "dog" / "sub" / "5.png") in list(found.entries.paths) and len(listings) == 8
    for damage in (b"not a numpy archive", saved.read_bytes()[:100]):
        saved.write_bytes(damage)
        _a_new_process()
        assert list(labelled_images(root).entries.paths) == list(found.entries.paths)
    assert listing_file(tmp_path / "listings", str(root)).stat().st_size > 100  # written again


def test_a_listing_is_not_saved_in_the_data_folder_or_anywhere_unasked(
    tmp_path: Path, listings: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VTOOLS_LISTINGS")
    root = _tree(tmp_path / "train", FILES)
    before = sorted(tmp_path.rglob("*"))
    labelled_images(root)
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("where", ["below a file", "a read-only file system"])
def test_an_unwritable_listings_folder_is_a_warning_and_the_run_goes_on(tmp_path: Path, where: str) -> None:
    """A folder that cannot be made, and one that exists where nothing can be written (/proc: read-only for
    root too, as a read-only mount of the home folder is)."""
    root = _tree(tmp_path / "data" / "train", FILES)
    (tmp_path / "file").write_text("")
    folder = str(tmp_path / "file" / "below") if where == "below a file" else "/proc"
    code = (
        "from pathlib import Path; from vtools.data.readers.folder import labelled_images; "
        f"print(len(labelled_images(Path({str(root)!r})).entries.paths))"
    )
    proc = run_script(["-c", code], env={"VTOOLS_LISTINGS": folder})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["5"]
    assert proc.stderr.startswith(f"warning: VTOOLS_LISTINGS={folder}: the listing cannot be saved (")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_listings_folder_inside_the_split_is_refused(
    tmp_path: Path, listings: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path / "train", FILES)
    before = sorted(tmp_path.rglob("*"))
    for inside in (root / ".listings", root / "cat" / "x", root):
        monkeypatch.setenv("VTOOLS_LISTINGS", str(inside))
        with pytest.raises(UsageError, match=f"VTOOLS_LISTINGS={inside} is inside the split {root} it would list"):
            labelled_images(root)
    assert sorted(tmp_path.rglob("*")) == before  # nothing made in the data

"""A split's listing: kept while the tree is unchanged, listed again when it changes, in the order it always had."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from vtools.data.readers import split_scan
from vtools.data.readers.folder import labelled_images
from vtools.data.readers.scan import ImageEntries
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="listing folders is host-side")

HOUR_AGO = time.time() - 3600


def _tree(root: Path, files: dict[str, list[str]]) -> Path:
    for folder, names in files.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name in names:
            (root / folder / name).write_bytes(b"")
    return root


def _age(root: Path) -> None:
    """Every folder's time an hour back: a tree nobody wrote to lately, as a dataset is."""
    for folder, _, _ in os.walk(root):
        os.utime(folder, (HOUR_AGO, HOUR_AGO))


@pytest.fixture
def listings(folder_listings: list[str]) -> list[str]:
    return folder_listings


def test_an_unchanged_tree_is_listed_once(tmp_path: Path, listings: list[str]) -> None:
    root = _tree(tmp_path / "train", {"cat": ["1.png", "2.png"], "dog/sub": ["3.png"], "dog": ["4.png"]})
    _age(root)
    listings.clear()
    first = labelled_images(root)
    assert len(listings) == 4  # the split, cat, dog, dog/sub
    again = labelled_images(root, {"cat": 1, "dog": 0})  # another labelling of the same listing
    assert len(listings) == 4
    assert list(again.entries.paths) == list(first.entries.paths) and again.labels.tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize(
    "change",
    [
        lambda root: (root / "cat" / "0.png").write_bytes(b""),
        lambda root: (root / "dog" / "sub" / "3.png").unlink(),
        lambda root: (root / "dog" / "sub" / "3.png").rename(root / "dog" / "sub" / "5.png"),
        lambda root: _tree(root, {"eel": ["6.png"]}),
        lambda root: (root / "cat").rename(root / "cow"),
    ],
    ids=["added", "removed-in-a-sub-folder", "renamed", "new-class", "class-renamed"],
)
def test_a_changed_tree_is_listed_again(tmp_path: Path, listings: list[str], change) -> None:  # type: ignore[no-untyped-def]
    root = _tree(tmp_path / "train", {"cat": ["1.png", "2.png"], "dog/sub": ["3.png"], "dog": ["4.png"]})
    _age(root)
    labelled_images(root)
    listings.clear()
    change(root)
    found = labelled_images(root)
    expected = sorted(str(p) for p in root.rglob("*.png"))
    assert list(found.entries.paths) == expected
    assert len(listings) >= 3


def test_a_tree_written_just_before_its_scan_is_not_trusted(tmp_path: Path, listings: list[str]) -> None:
    """A folder's time may tick too coarsely to show a second change in the same instant: not reused."""
    root = _tree(tmp_path / "train", {"cat": ["1.png"], "dog": ["2.png"]})
    labelled_images(root)
    labelled_images(root)
    assert len(listings) == 6


def test_order_is_sorted_rglobs_for_any_names(tmp_path: Path, listings: list[str]) -> None:
    """Names listed as bytes sort as their decoded text did: undecodable and non-ASCII names side by side."""
    names = ["b.png", "a.png", "é.png", "z.png", os.fsdecode(b"\xff.png"), os.fsdecode(b"\x80x.png"), "日.png"]
    root = _tree(tmp_path / "train", {"cls": names, "cls/é-sub": ["q.png"], "cls/a-sub": ["r.png"]})
    found = labelled_images(root)
    assert list(found.entries.paths) == sorted(str(p) for p in root.rglob("*.png"))


def test_many_class_folders_keep_their_order_whatever_the_threads_timing(tmp_path: Path, listings: list[str]) -> None:
    classes = {f"c{index:03d}": [f"{index}_{k}.png" for k in range(1 + index % 4)] for index in range(60)}
    root = _tree(tmp_path / "train", classes)
    found = labelled_images(root)
    expected = [str(root / c / n) for c in sorted(classes) for n in sorted(classes[c])]
    assert list(found.entries.paths) == expected
    assert found.labels.tolist() == [i for i, c in enumerate(sorted(classes)) for _ in classes[c]]


def test_class_folders_are_the_visible_folders_sorted_and_a_split_without_them_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path / "train", {"b": ["1.png"], "a": ["2.png"], ".cache": ["3.png"]})
    (root / "notes.txt").write_text("a file beside the class folders is not a class")
    assert split_scan.find_class_folders(root) == ["a", "b"]
    with pytest.raises(UsageError, match=r"missing does not exist or is not a folder$"):
        split_scan.find_class_folders(tmp_path / "missing")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "1.png").write_bytes(b"")
    with pytest.raises(UsageError, match=r"flat has no class folders \(expected one folder per class\)$"):
        split_scan.find_class_folders(tmp_path / "flat")


def _scan_of(folder: Path, changed_before_scan: float) -> split_scan.SplitScan:
    """A scan of ``folder`` taken ``changed_before_scan`` seconds after the folder last changed."""
    listed = os.stat(folder).st_mtime_ns
    return split_scan.SplitScan(
        root=str(folder),
        classes=[],
        entries=ImageEntries(),
        counts=[],
        folder_times={str(folder): listed},
        scanned_at=listed / 1e9 + changed_before_scan,
    )


def test_a_folder_is_trusted_only_when_it_changed_more_than_the_racy_seconds_before_its_scan(tmp_path: Path) -> None:
    folder = tmp_path / "cls"
    folder.mkdir()
    os.utime(folder, ns=(0, 1_700_000_000 * 10**9))  # whole seconds: the bound is exact in floating point
    racy = split_scan.RACY_SECONDS
    assert _scan_of(folder, racy + 0.5).is_current()
    assert not _scan_of(folder, racy).is_current()  # exactly on the bound: not trusted
    assert not _scan_of(folder, racy - 0.5).is_current()
    assert not _scan_of(folder, 0).is_current()


def test_a_scan_whose_folder_changed_or_is_gone_is_not_current(tmp_path: Path) -> None:
    folder = tmp_path / "cls"
    folder.mkdir()
    _age(folder)
    scan = _scan_of(folder, 3600)
    assert scan.is_current()
    os.utime(folder, (HOUR_AGO + 1, HOUR_AGO + 1))
    assert not scan.is_current()
    scan = _scan_of(folder, 3600)
    folder.rmdir()
    assert not scan.is_current()


def test_the_last_scans_are_kept_by_root_and_the_least_recently_used_one_dropped(
    tmp_path: Path, listings: list[str]
) -> None:
    kept = split_scan.KEPT_SCANS
    roots = [_tree(tmp_path / f"split{index}", {"cls": [f"{index}.png"]}) for index in range(kept + 1)]
    _age(tmp_path)
    listings.clear()

    def label(index: int) -> int:
        """Labels split ``index``, checks that its own images came back, says how often it was listed."""
        assert list(labelled_images(roots[index]).entries.paths) == [str(roots[index] / "cls" / f"{index}.png")]
        return listings.count(str(roots[index] / "cls"))

    assert [label(index) for index in range(kept)] == [1] * kept
    assert [label(0), label(0)] == [1, 1]  # reused, and kept again for the next time
    assert label(kept) == 1  # one scan too many: the least recently used one (split 1) is dropped
    assert [label(0), label(1)] == [1, 2]


def test_class_folders_are_listed_by_scan_threads_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SCAN_THREADS folders in flight together (the filesystem's waits overlap), never more."""
    threads = split_scan.SCAN_THREADS
    root = _tree(tmp_path / "train", {f"c{index:02d}": ["1.png"] for index in range(2 * threads)})
    together = threading.Barrier(threads, timeout=5)  # broken unless `threads` listings run at once
    lock, active, peak = threading.Lock(), [0], [0]
    scan_folder = split_scan.scan_folder

    def one_of_many(folder: Path, times: dict[str, int]) -> split_scan.ImageEntries:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        together.wait()
        found = scan_folder(folder, times)
        with lock:
            active[0] -= 1
        return found

    monkeypatch.setattr(split_scan, "scan_folder", one_of_many)
    monkeypatch.setattr(split_scan, "_kept", type(split_scan._kept)())
    assert len(labelled_images(root).entries.paths) == 2 * threads
    assert peak[0] == threads


def test_unreadable_entries_keep_their_reason_at_their_index_across_class_folders(tmp_path: Path) -> None:
    root = _tree(tmp_path / "train", {"ant": ["1.png", "2.png"], "bee": ["3.png", "4.png"]})
    (root / "ant" / "0.png").symlink_to(tmp_path / "nowhere.png")
    (root / "bee" / "5.png").symlink_to(tmp_path / "nowhere.png")
    found = labelled_images(root)
    assert [Path(path).name for path in found.entries.paths] == ["0.png", "1.png", "2.png", "3.png", "4.png", "5.png"]
    reason = f"a link to {tmp_path / 'nowhere.png'}, which does not exist"
    assert found.entries.unreadable == {0: reason, 5: reason}

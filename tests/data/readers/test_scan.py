"""Entries of a data folder that look like images but cannot be read (a dangling link, a FIFO, a file or a
sub-folder one may not read), and class folders with no images, as a user meets them.

Unreadable entries are counted and named like a corrupt image in every reader (class folders, inference's
folders, globs and ``.txt`` lists), and --on-bad-image decides: the runs that go on (skip) are here, the
one-line stops (error) are rows of tests/scripts/test_one_line_errors.py (block "unreadable entries"). An empty
class folder is refused where labels follow the sorted folder names and a warning where they are matched
by name.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, file_permissions_can_apply, run_script, write_model_folder

pytestmark = pytest.mark.cpu_only(reason="reading folders is host-side; the same loaders run on every device")

DATA = REPO / "data" / "fashion-mnist-mini"


def _stderr_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


def test_the_folder_walk_keeps_rglobs_order_and_finds_unreadable_entries(tmp_path: Path) -> None:
    from vtools.data.readers.scan import scan_folder

    for name in ("a/b.png", "a b.png", "a.png", "z/y/x.jpg", "c.txt", "._d.png", ".hidden/e.png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (tmp_path / "loop").symlink_to(tmp_path)  # a link to a folder is not followed
    os.mkfifo(tmp_path / "pipe.jpg")
    found = scan_folder(tmp_path)
    expected = sorted(p for p in tmp_path.rglob("*") if p.suffix in (".png", ".jpg") and not p.name.startswith("._"))
    assert [Path(path) for path in found.paths] == expected
    reasons = {Path(found.paths[i]).name: reason for i, reason in found.unreadable.items()}
    assert reasons == {
        "gone.png": f"a link to {tmp_path / 'nowhere.png'}, which does not exist",
        "pipe.jpg": "it is a FIFO",
    }


def test_a_dangling_link_in_a_class_folder_is_counted_and_named(tmp_path: Path) -> None:
    """The shipped validation set with one image replaced by a link to nothing: 300 images, 1 unreadable."""
    val = tmp_path / "val"
    shutil.copytree(DATA / "val", val)
    link = val / "bag" / "bag_0003.png"
    link.unlink()
    link.symlink_to(tmp_path / "gone.png")
    model = write_model_folder(tmp_path / "model", 10, sorted(os.listdir(val)))
    proc = run_script(["validate.py", str(val), "--model", str(model), "--device", "cpu", "--on-bad-image", "skip"])
    assert proc.returncode == 0, proc.stderr
    assert "10 class folders, 300 images" in proc.stdout
    assert "on 299 images (300 found, 1 unreadable skipped)" in proc.stdout
    assert _stderr_lines(proc) == [
        f"warning: skipped unreadable image {link}: reading failed (a link to {tmp_path / 'gone.png'}, which does "
        "not exist) at batch 0"
    ]


def test_a_fifo_named_like_an_image_is_skipped_not_waited_on(
    custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "imgs"
    shutil.copytree(custom_images, root)
    os.mkfifo(root / "cat" / "pipe.png")  # opening it to read would wait for a writer forever
    proc = run_script(
        ["validate.py", str(root), "--model", str(custom_model_dir), "--device", "cpu", "--on-bad-image", "skip"],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"skipped unreadable image {root / 'cat' / 'pipe.png'}: reading failed (it is a FIFO)" in proc.stderr
    assert "(13 found, 1 unreadable skipped)" in proc.stdout


@pytest.mark.skipif(not file_permissions_can_apply(), reason="root here, and no setpriv to drop its override")
def test_files_and_sub_folders_one_may_not_read_are_counted_and_named(
    custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "imgs"
    shutil.copytree(custom_images, root)
    private = root / "dog" / "private"
    private.mkdir()
    shutil.copy(root / "dog" / "dog_0.jpg", private / "hidden.jpg")
    private.chmod(0)
    (root / "cat" / "cat_1.png").chmod(0)
    proc = run_script(
        ["validate.py", str(root), "--model", str(custom_model_dir), "--device", "cpu", "--on-bad-image", "skip"],
        file_permissions_apply=True,
    )
    private.chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    assert "(13 found, 2 unreadable skipped)" in proc.stdout
    warnings = "\n".join(_stderr_lines(proc))
    assert f"{root / 'cat' / 'cat_1.png'}: reading failed (PermissionError" in warnings
    assert f"{private}: reading failed (PermissionError: the folder cannot be listed (Permission denied))" in warnings


def test_inference_counts_what_a_list_or_a_glob_names_but_cannot_read(
    custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "imgs"
    shutil.copytree(custom_images, root)
    (root / "cat" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    listing = tmp_path / "list.txt"
    listing.write_text("imgs/cat/cat_0.jpg\nimgs/cat/missing.png\nimgs/cat/gone.jpg\n")
    for source, classified, reason in (
        (listing, 1, f"listed in {listing}, but it does not exist"),
        (f"{root}/cat/*", 4, f"a link to {tmp_path / 'nowhere.jpg'}, which does not exist"),
    ):
        proc = run_script(
            ["inference.py", str(source), "--model", str(custom_model_dir), "--device", "cpu"]
            + ["--on-bad-image", "skip", "--results-dir", str(tmp_path / "out")]
        )
        assert proc.returncode == 0, proc.stderr
        assert reason in proc.stderr
        unreadable = 2 if source == listing else 1
        assert f"{classified} images classified on cpu, {unreadable} unreadable skipped" in proc.stdout


def test_an_empty_folder_where_labels_are_matched_by_name_is_a_warning(
    custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "imgs"
    shutil.copytree(custom_images, root)
    (root / "aardvark").mkdir()  # not among the model's class names, and empty: nothing to label
    (root / "dog_copy").mkdir()
    class_map = tmp_path / "classes.txt"
    class_map.write_text("cat\ndog\nfox\n")
    for extra in ([], ["--class-map", str(class_map)]):
        proc = run_script(["validate.py", str(root), "--model", str(custom_model_dir), "--device", "cpu", *extra])
        assert proc.returncode == 0, proc.stderr
        assert _stderr_lines(proc) == [
            f"warning: empty class folders {root / 'aardvark'}, {root / 'dog_copy'}: labels are matched by class "
            "name, so this changes nothing"
        ]
        assert "on 12 images" in proc.stdout


def _class_folders(root: Path, counts: dict[str, int]) -> Path:
    for name, count in counts.items():
        (root / name).mkdir(parents=True)
        for index in range(count):
            (root / name / f"{index}.png").write_bytes(b"")
    return root


def test_an_empty_class_folder_is_refused_where_labels_follow_the_sorted_names(tmp_path: Path) -> None:
    from vtools.data.readers.folder import labelled_images
    from vtools.errors import UsageError

    root = _class_folders(tmp_path / "train", {"cat": 2, "cow": 0, "dog": 1})
    with pytest.raises(UsageError, match=r"^empty class folder .*cow: labels come from the sorted folder names, so an"):
        labelled_images(root)
    found = labelled_images(root, check_empty=False)  # a later call decides
    assert found.labels.tolist() == [0, 0, 2] and found.classes == ["cat", "cow", "dog"]


def test_an_empty_class_folder_changes_nothing_where_labels_are_matched_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vtools.data.readers.folder import labelled_images

    root = _class_folders(tmp_path / "train", {"cat": 2, "cow": 0, "dog": 1, "emu": 0})
    found = labelled_images(root, {"dog": 0, "cat": 1})  # cow and emu need no label: they hold no image
    assert capsys.readouterr().err == (
        f"warning: empty class folders {root / 'cow'}, {root / 'emu'}: labels are matched by class name, so this "
        "changes nothing\n"
    )
    assert found.labels.tolist() == [1, 1, 0] and found.labels.dtype == np.int32  # 4 bytes an image
    assert found.classes == ["dog", "cat"]  # by label, not by name
    assert list(found.entries.paths) == [
        str(root / "cat" / "0.png"),
        str(root / "cat" / "1.png"),
        str(root / "dog" / "0.png"),
    ]


def test_class_folders_missing_from_the_class_map_or_without_images_stop_in_one_line(tmp_path: Path) -> None:
    from vtools.data.readers.folder import labelled_images
    from vtools.errors import UsageError

    root = _class_folders(tmp_path / "train", {"ant": 1, "bee": 1, "cat": 1, "dog": 1, "eel": 1, "fox": 0, "gnu": 1})
    with pytest.raises(UsageError, match=rf"^class folder\(s\) ant, bee, dog under {root} are not in the class map$"):
        labelled_images(root, {"cat": 0, "eel": 1})
    empty = _class_folders(tmp_path / "empty", {"cat": 0, "dog": 0})
    for class_map in (None, {"cat": 0, "dog": 1}):
        with pytest.raises(UsageError, match=rf"^no images found in the class folders under {empty}$"):
            labelled_images(empty, class_map)


def test_a_folder_that_cannot_be_listed_is_an_entry_named_by_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root needs no permission to list, so the refusal is played by os.scandir (the permission itself is the
    script test above)."""
    from vtools.data.readers.scan import scan_folder

    for name in ("a.png", "dog/private/b.png", "dog/c.png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    listing = os.scandir

    def refused(path: str | bytes = ".") -> os.ScandirIterator:  # type: ignore[name-defined]
        if os.fsdecode(path).endswith("private"):
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", refused)
    found = scan_folder(tmp_path)
    assert list(found.paths) == [
        str(tmp_path / "a.png"),
        str(tmp_path / "dog" / "c.png"),
        str(tmp_path / "dog" / "private"),
    ]
    assert found.unreadable == {2: "PermissionError: the folder cannot be listed (Permission denied)"}
    found = scan_folder(tmp_path / "dog" / "private")  # the folder asked for itself
    assert list(found.paths) == [str(tmp_path / "dog" / "private")] and list(found.unreadable) == [0]


def test_a_list_of_images_gives_its_paths_as_listed_and_names_the_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vtools.data.readers.folder import find_image_entries

    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(b"")
    (tmp_path / "list.txt").write_text(f"imgs/a.png\n\nimgs/gone.png\n{tmp_path / 'imgs' / 'a.png'}\n")
    monkeypatch.chdir(tmp_path)
    found = find_image_entries("list.txt")  # relative: the paths stay relative to where one is
    assert list(found.paths) == [
        os.path.join("imgs", "a.png"),
        os.path.join("imgs", "gone.png"),
        str(tmp_path / "imgs" / "a.png"),
    ]
    assert found.unreadable == {1: "listed in list.txt, but it does not exist"}

"""A data path that is not there stops the scripts before torch loads, in the folder reader's words."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, assert_one_line_error, run_script
from vtools.cli.data_path import check_data_exists, is_plain_local_path
from vtools.errors import UsageError

DATA = REPO / "data" / "fashion-mnist-mini"

# runs a root script as python would, and says on stdout at exit whether torch was ever imported
WATCHED = (
    "import atexit, runpy, sys; "
    "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.mark.parametrize(
    ("source", "plain"),
    [
        ("data/x", True),
        ("~/images", True),
        ("list.txt", True),
        ("https://host/shards/{000..009}.tar", False),
        ("pipe:curl -s http://host/a.tar", False),
        ("photos/*.jpg", False),
        ("photos/img_[0-9].png", False),
    ],
)
def test_only_a_plain_local_path_is_checked(source: str, plain: bool) -> None:
    assert is_plain_local_path(source) is plain


def test_a_missing_folder_is_refused_and_the_others_are_left_to_their_readers(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=f"^{tmp_path / 'nope'} does not exist$"):
        check_data_exists(str(tmp_path / "nope"))
    check_data_exists(str(tmp_path))  # there
    check_data_exists(str(tmp_path / "nope"), dataset="torch/cifar10")  # may download into it
    check_data_exists(str(tmp_path / "nope" / "*.jpg"))  # a pattern: its reader says what matched
    check_data_exists(None)  # no data given: the scripts' own checks say so


SCRIPT_RUNS = {
    "train": ["train.py", "-c", "configs/fashion_mnist_cpu.yaml", "--data-dir", "{missing}"],
    "validate": ["validate.py", "{missing}", "--model", "test_resnet"],
    "inference": ["inference.py", "{missing}", "--model", "test_resnet"],
}


@pytest.mark.cpu_only(reason="the check reads the command line only, before any device is chosen")
@pytest.mark.parametrize("script", sorted(SCRIPT_RUNS))
def test_each_script_says_so_before_importing_torch(script: str, tmp_path: Path) -> None:
    missing = tmp_path / "no_such_folder"
    args = [arg.format(missing=missing) for arg in SCRIPT_RUNS[script]]
    proc = run_script(["-c", WATCHED, str(REPO / args[0]), *args[1:]], cwd=REPO)
    assert_one_line_error(proc, 2, f"{missing} does not exist")
    assert proc.stdout.strip().splitlines()[-1] == "torch imported: False"


@pytest.mark.cpu_only(reason="the check reads the command line only, before any device is chosen")
def test_an_existing_folder_passes_the_check_and_reaches_torch(tmp_path: Path) -> None:
    # the same watch sees torch load when the data is there: the assertion above can fail
    proc = run_script(["-c", WATCHED, str(REPO / "validate.py"), str(tmp_path), "--model", "test_resnet"], cwd=REPO)
    assert proc.returncode == 2, proc.stderr  # an empty folder: no class folders, said after the imports
    assert proc.stdout.strip().splitlines()[-1] == "torch imported: True"

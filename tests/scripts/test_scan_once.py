"""Under torchrun one rank lists the class folders and the others receive its list.

Eight ranks listing ImageNet's 1.28 M files on one network filesystem at once cost eight scans; the
listing is sent instead (vtools/data/readers/split_scan.py). Counted here with an audit hook on
``os.scandir`` in each rank (tests/scripts/count_scans.py), on the emulated npu's collectives as on cpu's:
rank 0 lists the tree, rank 1 lists nothing of it, and both train on the very samples and labels that
torchvision's ImageFolder finds (the order and labels the reader always gave).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from torchvision.datasets import ImageFolder

from tests.conftest import DEVICE_TYPES, ONE_THREAD, REPO, device_flags, run_script, torchrun, train_args

pytestmark = pytest.mark.slow


def _digest(folder: Path) -> str:
    """ImageFolder's samples (path and label, in its order) as count_scans.py digests a split."""
    digest = hashlib.sha256()
    for path, label in ImageFolder(str(folder)).samples:
        digest.update(f"{path}\t{label}\n".encode())
    return digest.hexdigest()


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_two_ranks_list_the_tree_once_and_train_on_the_same_samples(
    device_type: str, fashion4: Path, tmp_path: Path
) -> None:
    counts = tmp_path / "counts"
    counts.mkdir()
    train = train_args(fashion4, tmp_path, "run", *device_flags(device_type), "--epochs", "1", "--batch-size", "8")
    proc = run_script(torchrun(["tests/scripts/count_scans.py", str(counts), str(fashion4), *train]), env=ONE_THREAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((counts / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["listings"] >= 1 + 4 + 1 + 4  # the split folders and their class folders, train and val
    assert ranks[1]["listings"] == 0
    expected = [("train", 240, _digest(fashion4 / "train")), ("validation", 60, _digest(fashion4 / "val"))]
    for rank in ranks:
        assert [(o["split"], o["count"], o["digest"]) for o in rank["opened"]] == expected


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_a_refusal_on_the_listing_rank_is_every_ranks_one_line(
    device_type: str, fashion4: Path, tmp_path: Path
) -> None:
    """An empty class folder is refused where rank 0 lists; rank 1 stops with the same line, not in a
    collective that never comes."""
    data = tmp_path / "data"
    for split in ("train", "val"):
        (data / split).mkdir(parents=True)
        for folder in (fashion4 / split).iterdir():
            (data / split / folder.name).symlink_to(folder)
    (data / "train" / "aaa_empty").mkdir()
    train = train_args(data, tmp_path, "run", *device_flags(device_type), "--epochs", "1")
    proc = run_script(torchrun(train), env=ONE_THREAD, timeout=300)
    assert proc.returncode != 0
    refusal = f"empty class folder {data / 'train' / 'aaa_empty'}"
    assert proc.stderr.count(refusal) == 2, proc.stderr[-3000:]
    assert str(REPO / "vtools") not in proc.stderr  # no traceback through vtools (torchrun prints its own)

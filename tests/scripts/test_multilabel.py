"""Multi-label end to end on real images: Fashion-MNIST items two side by side, labelled with both classes.

train.py learns them far above chance and keeps its best epoch by mAP; validate.py on the exported model
folder reproduces that epoch's mAP and class report; inference.py lists each image's classes above the
threshold; a 2-rank torchrun run scores every rank's samples once (its mAP equals one process's validation).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import (
    DEVICE_TYPES,
    ONE_THREAD,
    device_flags,
    fashion_pairs,
    run_script,
    summary,
    torchrun,
    train_args,
)

# 2:1 images: the input keeps their shape and the crop keeps both items
PAIR_FLAGS = ["--input-size", "3", "28", "56", "--ratio", "1.8", "2.2", "--scale", "0.8", "1.0", "--hflip", "0"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """400 training and 100 validation pairs (4 classes)."""
    return fashion_pairs(tmp_path_factory.mktemp("pairs"), 400, 100)


def labels_of(split: Path) -> dict[str, set[str]]:
    with (split / "labels.csv").open(newline="") as handle:
        return {Path(row["image"]).name: set(row["labels"].split()) for row in csv.DictReader(handle)}


def chance_map(split: Path) -> float:
    """The mAP of scores that know nothing: each class's AP is then its share of positive images."""
    truth = labels_of(split).values()
    classes = set().union(*truth)
    return 100 * sum(sum(name in labels for labels in truth) / len(truth) for name in classes) / len(classes)


def validate_row(pairs: Path, model: Path, tmp_path: Path, device_type: str, *extra: str) -> dict[str, str]:
    results = tmp_path / f"validate-{model.parent.name}.csv"
    ran = run_script(
        ["validate.py", str(pairs), "--split", "val", "--model", str(model), "--workers", "1"]
        + [*device_flags(device_type), "--results-file", str(results), *extra]
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    return next(csv.DictReader(results.open(newline="")))


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_trains_above_chance_and_validate_reproduces_the_best_map(
    pairs: Path, tmp_path: Path, device_type: str
) -> None:
    trained = run_script(
        train_args(pairs, tmp_path, "pairs", *device_flags(device_type), *PAIR_FLAGS, "--epochs", "4", "--seed", "0")
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "multi-label data: the best epoch is the one with the highest mAP (--eval-metric map, not top1)" in (
        trained.stdout
    )
    rows = summary(tmp_path / "pairs")
    assert "eval_top1" not in rows[0] and {"eval_map", "eval_map_micro", "eval_f1"} <= set(rows[0])
    best = max(rows, key=lambda row: float(row["eval_map"]))
    chance = chance_map(pairs / "val")  # about 45 here
    assert float(best["eval_map"]) > chance + 30, (best, chance)

    model = tmp_path / "pairs" / "model"
    row = validate_row(pairs, model, tmp_path, device_type, "--report", str(tmp_path / "report"))
    assert float(row["map"]) == pytest.approx(float(best["eval_map"]), abs=1e-3)
    assert float(row["map_micro"]) == pytest.approx(float(best["eval_map_micro"]), abs=1e-3)
    assert float(row["f1"]) == pytest.approx(float(best["eval_f1"]), abs=1e-3)
    assert "top1" not in row and int(row["samples"]) == 100
    ours, theirs = (
        pd.read_csv(tmp_path / "pairs" / "eval" / "per_class.csv"),
        pd.read_csv(tmp_path / "report" / "per_class.csv"),
    )
    pd.testing.assert_frame_equal(ours, theirs, atol=1e-3)

    inferred = run_script(
        ["inference.py", str(pairs / "val" / "images"), "--model", str(model), "--workers", "1"]
        + [*device_flags(device_type), "--results-dir", str(tmp_path / "inference"), "--results-format", "json"]
    )
    assert inferred.returncode == 0, inferred.stderr[-3000:]
    assert "every class with probability >= 0.5" in inferred.stdout
    [written] = (tmp_path / "inference").glob("*.json")
    assert written.name == "pairs-threshold0.5.json"  # named by what chose the classes, not a top-k
    results = pd.read_json(written)
    truth = labels_of(pairs / "val")
    exact = sum(set(labels) == truth[name] for name, labels in zip(results["filename"], results["label"]))
    assert exact >= 60, exact  # whole label sets right; the F1 at 0.5 above counts single labels
    assert all(all(p >= 0.5 for p in probs) and probs == sorted(probs, reverse=True) for probs in results["prob"])


@pytest.mark.slow
@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_two_ranks_score_every_sample_once(pairs: Path, tmp_path: Path, device_type: str) -> None:
    """Each rank validates half the pairs; the gathered scores give the mAP that one process finds."""
    args = train_args(pairs, tmp_path, "ranks", *device_flags(device_type), *PAIR_FLAGS, "--epochs", "2")
    ran = run_script(torchrun(args), env=ONE_THREAD, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    rows = summary(tmp_path / "ranks")
    assert [int(row["eval_samples"]) for row in rows] == [100, 100]
    best = max(rows, key=lambda row: float(row["eval_map"]))
    row = validate_row(pairs, tmp_path / "ranks" / "model", tmp_path, device_type)
    assert float(row["map"]) == pytest.approx(float(best["eval_map"]), abs=1e-3)


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_mixup_and_a_resume_train_multi_hot_targets(pairs: Path, tmp_path: Path, device_type: str) -> None:
    """timm's multi-label mixup in the loop; a resumed run keeps scoring by mAP."""
    args = train_args(pairs, tmp_path, "mixed", *device_flags(device_type), *PAIR_FLAGS, "--mixup", "0.4")
    first = run_script([*args, "--epochs", "1"])
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_script([*args, "--epochs", "2", "--resume", "auto"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert [row["epoch"] for row in summary(tmp_path / "mixed")] == ["0", "1"]
    assert "best map " in again.stdout


# ---------------------------------------------------------------- the other commands that carry the labels


def _label_lists(source: object) -> list[list[int]]:
    sets = source.samples.label_sets  # type: ignore[attr-defined]
    return [sets.classes_of(index).tolist() for index in range(len(sets))]


@pytest.fixture(scope="module")
def small_pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 training and 6 validation pairs: some images of one class, some of two."""
    return fashion_pairs(tmp_path_factory.mktemp("small_pairs"), 12, 6)


@pytest.mark.cpu_only(reason="conversion and reading are host-side file work")
@pytest.mark.parametrize(("fmt", "prefix"), [("wds", "wds"), ("parquet", "hfds")])
def test_shards_keep_every_images_classes(fmt: str, prefix: str, small_pairs: Path, tmp_path: Path) -> None:
    """``vtools shards`` on a multi-label folder: the shards read back with the folder's classes and each
    image's class list, whether it has one class, two or none."""
    from vtools.data.readers.registry import SourceRequest, open_source

    if fmt == "parquet":
        pytest.importorskip("datasets")
    out = tmp_path / "store"
    proc = run_script(["-m", "vtools", "shards", str(small_pairs), str(out), "--format", fmt, "--shard-size", "5"])
    assert proc.returncode == 0, proc.stderr
    assert "4 classes ->" in proc.stdout
    for split, stored in (("train", "train"), ("val", "validation")):
        folder = open_source(SourceRequest("", str(small_pairs), split))
        shards = open_source(SourceRequest(f"{prefix}/store", str(out), stored))
        assert shards.classes == folder.classes == ["bag", "sneaker", "t-shirt_top", "trouser"]
        assert _label_lists(shards) == _label_lists(folder)
        assert {len(classes) for classes in _label_lists(folder)} == {1, 2}


@pytest.mark.cpu_only(reason="conversion and reading are host-side file work")
def test_multi_label_shards_served_over_http_are_refused_in_one_line(small_pairs: Path, tmp_path: Path) -> None:
    """A stream reads one class per image: multi-label shards say so, from their split info or, without one,
    sample by sample, instead of training every image as class 0."""
    from tests.data.readers.shard_server import serve
    from vtools.data.readers.registry import SourceRequest, open_source
    from vtools.data.readers.wds_stream import shard_samples
    from vtools.errors import UsageError

    out = tmp_path / "store"
    assert run_script(["-m", "vtools", "shards", str(small_pairs), str(out), "--shard-size", "5"]).returncode == 0
    with serve(out) as url:
        with pytest.raises(UsageError, match="these shards are multi-label .* read one class per image"):
            open_source(SourceRequest("wds/store", url, "train"))
        streamed = [sample for _, sample in shard_samples(f"{url}/store-train-000000.tar", 0, ("png",), "cls", 5)]
    assert [getattr(sample, "reason", "") for sample in streamed] == [
        "a list of classes in .cls (multi-label), which a stream does not read"
    ] * 5


@pytest.mark.cpu_only(reason="conversion is host-side file work")
def test_shards_of_splits_of_two_kinds_are_refused(small_pairs: Path, tmp_path: Path) -> None:
    import shutil

    mixed = tmp_path / "mixed"
    shutil.copytree(small_pairs / "train", mixed / "train")
    (mixed / "val" / "bag").mkdir(parents=True)
    shutil.copy(next((small_pairs / "val" / "images").glob("*.png")), mixed / "val" / "bag" / "a.png")
    proc = run_script(["-m", "vtools", "shards", str(mixed), str(tmp_path / "out")])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "has a labels file (multi-label), so every split must" in proc.stderr
    assert not (tmp_path / "out").exists()

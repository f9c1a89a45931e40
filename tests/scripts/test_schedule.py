"""train.py's learning-rate schedule against timm's own scheduler, driven the way timm's train.py drives it.

Each case trains a few tiny epochs, then builds timm's scheduler from the run's
saved config.yaml and steps it exactly as timm's train.py does: ``step_update``
after every optimizer update, the logged lr read after the epoch's training,
``step(epoch + 1, metric)`` after validation with the run's own eval metric
(``None`` in epochs --val-interval skips), for as many epochs as
``create_scheduler_v2`` returns. Every summary.csv row's lr, and the number of
rows, must match. Nothing here re-derives a schedule by hand.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from timm.scheduler import create_scheduler_v2, scheduler_kwargs

from tests.conftest import DEVICE_TYPES, REPO, device_flags, run_script, summary
from vtools.cli.runner import command_main

CLASSES = ["bag", "sneaker", "t-shirt_top", "trouser"]
TRAIN_PER_CLASS, BATCH = 2, 2
BATCHES_PER_EPOCH = len(CLASSES) * TRAIN_PER_CLASS // BATCH


@pytest.fixture(scope="module")
def tiny_fashion(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 training and 4 validation images of the shipped subset: 4 batches of 2 per epoch."""
    root = tmp_path_factory.mktemp("tiny_fashion")
    for split, count in (("train", TRAIN_PER_CLASS), ("val", 1)):
        for name in CLASSES:
            (root / split / name).mkdir(parents=True)
            for file in sorted((REPO / "data/fashion-mnist-mini" / split / name).glob("*.png"))[:count]:
                shutil.copy(file, root / split / name / file.name)
    return root


CASES = {
    "cosine-warmup": ["--sched", "cosine", "--epochs", "6", "--warmup-epochs", "2", "--min-lr", "1e-4"],
    "cosine-prefix-cooldown": [
        "--sched",
        "cosine",
        "--epochs",
        "4",
        "--warmup-epochs",
        "2",
        "--warmup-prefix",
        "--cooldown-epochs",
        "2",
        "--min-lr",
        "1e-4",
    ],
    "cosine-cycles": [
        "--sched",
        "cosine",
        "--epochs",
        "3",
        "--warmup-epochs",
        "1",
        "--lr-cycle-limit",
        "2",
        "--lr-cycle-mul",
        "1.5",
        "--lr-cycle-decay",
        "0.5",
        "--cooldown-epochs",
        "1",
    ],
    "cosine-noise": ["--sched", "cosine", "--epochs", "6", "--warmup-epochs", "0", "--lr-noise", "0.3", "0.8"],
    "tanh": ["--sched", "tanh", "--epochs", "5", "--warmup-epochs", "1", "--cooldown-epochs", "1"],
    "step": ["--sched", "step", "--epochs", "6", "--warmup-epochs", "1", "--decay-epochs", "2", "--decay-rate", "0.5"],
    "multistep-prefix": [
        "--sched",
        "multistep",
        "--epochs",
        "5",
        "--warmup-epochs",
        "1",
        "--warmup-prefix",
        "--decay-milestones",
        "2",
        "4",
        "--decay-rate",
        "0.5",
    ],
    "plateau-top1": [
        "--sched",
        "plateau",
        "--epochs",
        "6",
        "--warmup-epochs",
        "1",
        "--patience-epochs",
        "0",
        "--decay-rate",
        "0.5",
    ],
    "plateau-top5-val-interval": [
        "--sched",
        "plateau",
        "--epochs",
        "7",
        "--warmup-epochs",
        "1",
        "--patience-epochs",
        "0",
        "--decay-rate",
        "0.5",
        "--eval-metric",
        "top5",
        "--val-interval",
        "2",
    ],  # top-5 of 4 classes never improves: decays
    "plateau-loss": [
        "--sched",
        "plateau",
        "--epochs",
        "6",
        "--warmup-epochs",
        "1",
        "--patience-epochs",
        "0",
        "--decay-rate",
        "0.5",
        "--eval-metric",
        "loss",
    ],  # a falling loss must not decay
    "poly-cooldown": [
        "--sched",
        "poly",
        "--epochs",
        "5",
        "--warmup-epochs",
        "1",
        "--decay-rate",
        "2",
        "--cooldown-epochs",
        "2",
        "--min-lr",
        "1e-4",
    ],
    "wsd": ["--sched", "wsd", "--epochs", "5", "--warmup-epochs", "1", "--decay-epochs", "2"],
    "cosine-on-updates": [
        "--sched",
        "cosine",
        "--sched-on-updates",
        "--epochs",
        "4",
        "--warmup-epochs",
        "1",
        "--cooldown-epochs",
        "1",
        "--min-lr",
        "1e-4",
    ],
    "step-on-updates-accum": [
        "--sched",
        "step",
        "--sched-on-updates",
        "--epochs",
        "4",
        "--warmup-epochs",
        "1",
        "--decay-epochs",
        "1",
        "--decay-rate",
        "0.7",
        "--grad-accum-steps",
        "3",
    ],
}


def run_args(data: Path, out: Path, device_type: str, extra: list[str]) -> list[str]:
    return [
        "--data-dir",
        str(data),
        "--model",
        "test_resnet",
        "--img-size",
        "32",
        "--batch-size",
        str(BATCH),
        "--lr",
        "0.05",
        "--opt",
        "sgd",
        "--workers",
        "0",
        "--checkpoint-hist",
        "0",
        "--log-interval",
        "2",
        "--output",
        str(out),
        "--experiment",
        "run",
        *device_flags(device_type),
        *extra,
    ]


def train_in_process(data: Path, out: Path, extra: list[str]) -> Path:
    """One cpu train.py run in this process (no interpreter start-up per case); returns its run folder."""
    assert command_main("train")(run_args(data, out, "cpu", extra)) == 0
    return out / "run"


def train_as_user(data: Path, out: Path, device_type: str, extra: list[str]) -> Path:
    """One train.py run in its own process, as a user runs it (the emulated npu needs a fresh process:
    autograd sizes its per-device queues when it first runs)."""
    proc = run_script(["train.py", *run_args(data, out, device_type, extra)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "run"


def timm_lrs_and_epochs(run: Path, updates_per_epoch: int) -> list[float]:
    """The lr timm's train.py would log for each epoch, from timm's scheduler and the run's metrics."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    args = argparse.Namespace(**{key.replace("-", "_"): value for key, value in config.items()})
    rows = summary(run)
    metric_column = f"eval_{args.eval_metric}"
    metrics = {int(row["epoch"]): float(row[metric_column]) for row in rows if row[metric_column] != ""}
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.lr)
    scheduler, num_epochs = create_scheduler_v2(
        optimizer,
        **scheduler_kwargs(args, decreasing_metric=args.eval_metric == "loss"),
        updates_per_epoch=updates_per_epoch,
    )
    lrs, num_updates = [], 0
    for epoch in range(num_epochs):
        for _ in range(updates_per_epoch):
            num_updates += 1
            scheduler.step_update(num_updates=num_updates)
        lrs.append(sum(g["lr"] for g in optimizer.param_groups) / len(optimizer.param_groups))
        validated = (epoch + 1) % args.val_interval == 0 or epoch + 1 == num_epochs
        scheduler.step(epoch + 1, metrics[epoch] if validated else None)
    return lrs


def check_against_timm(run: Path, accum: int = 1) -> list[float]:
    updates_per_epoch = -(-BATCHES_PER_EPOCH // accum)
    expected = timm_lrs_and_epochs(run, updates_per_epoch)
    rows = summary(run)
    assert [int(row["epoch"]) for row in rows] == list(range(len(expected))), "epochs trained differ from timm's"
    logged = [float(row["lr"]) for row in rows]
    assert logged == pytest.approx(expected, rel=1e-12, abs=1e-15)
    return logged


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.cpu_only(
    reason="the schedule is host arithmetic; test_schedule_matches_timm_on_device runs the loop on every device"
)
def test_schedule_matches_timm(case: str, tiny_fashion: Path, tmp_path: Path) -> None:
    """cpu only: the schedule is host arithmetic; the npu runs of the same loop follow below."""
    extra = CASES[case]
    accum = int(extra[extra.index("--grad-accum-steps") + 1]) if "--grad-accum-steps" in extra else 1
    logged = check_against_timm(train_in_process(tiny_fashion, tmp_path, extra), accum)
    assert len(set(logged)) > 1, "a schedule that never moves proves nothing"
    if case in ("plateau-top1", "plateau-top5-val-interval"):  # the metric drove a decay after warmup
        assert min(logged[2:]) < logged[1], logged


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
@pytest.mark.parametrize("case", ["plateau-top1", "cosine-on-updates"])
def test_schedule_matches_timm_on_device(case: str, device_type: str, tiny_fashion: Path, tmp_path: Path) -> None:
    check_against_timm(train_as_user(tiny_fashion, tmp_path, device_type, CASES[case]))


@pytest.mark.cpu_only(reason="scheduler state is host-side; npu resume: tests/scripts/test_train.py")
def test_plateau_resume_keeps_its_patience(tiny_fashion: Path, tmp_path: Path) -> None:
    """Top-5 of 4 classes never improves, so with patience 2 the rate halves every third epoch. Resumed
    after epoch 2, two bad epochs into its patience, the run must decay when the uninterrupted one does:
    timm's plateau state alone forgets the count."""
    plateau = [
        "--sched",
        "plateau",
        "--epochs",
        "7",
        "--warmup-epochs",
        "0",
        "--patience-epochs",
        "2",
        "--decay-rate",
        "0.5",
        "--eval-metric",
        "top5",
        "--checkpoint-hist",
        "10",
    ]
    full = train_in_process(tiny_fashion, tmp_path / "full", plateau)
    resumed = train_in_process(
        tiny_fashion, tmp_path / "resumed", [*plateau, "--resume", str(full / "checkpoint-2.pth.tar")]
    )
    expected = [float(row["lr"]) for row in summary(full)]
    assert len(set(expected)) > 1
    assert [float(row["lr"]) for row in summary(resumed)][3:] == expected[3:]


@pytest.mark.cpu_only(reason="epoch bookkeeping is host-side")
def test_val_interval_skips_validation_but_not_the_last_epoch(tiny_fashion: Path, tmp_path: Path) -> None:
    import pandas as pd

    run = train_in_process(
        tiny_fashion,
        tmp_path,
        [
            "--sched",
            "cosine",
            "--epochs",
            "5",
            "--warmup-epochs",
            "0",
            "--val-interval",
            "2",
            "--checkpoint-hist",
            "10",
        ],
    )
    table = pd.read_csv(run / "summary.csv")
    assert table["epoch"].tolist() == [0, 1, 2, 3, 4]
    assert table["eval_top1"].isna().tolist() == [True, False, True, False, False]
    assert sorted(p.name for p in run.glob("checkpoint-*.pth.tar")) == [
        "checkpoint-1.pth.tar",
        "checkpoint-3.pth.tar",
        "checkpoint-4.pth.tar",
    ]
    assert torch.load(run / "last.pth.tar", map_location="cpu", weights_only=True)["epoch"] == 5

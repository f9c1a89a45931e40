"""The hot loops never wait for the device between log steps: train, validate and inference.

A device-to-host synchronisation (``.item()``, a device-to-host copy) stalls an accelerator's
queue. The emulated npu counts them, so each test runs a loop over 4 and over 8 batches, through
the real DeviceLoader (side-stream prefetch) and the real recipe, and requires the same count:
whatever syncs remain are per epoch or per log step, never per batch. npu only: the counter is the
emulator's (cpu has no queue to stall).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import timm
import torch
from torch.utils.data import Dataset

from tests.conftest import load_emulated_npu
from vtools.cli import train_flags
from vtools.cli.typed import typed_options
from vtools.data.loaders import DeviceLoader, make_loader
from vtools.evaluation.loops import evaluate, predict
from vtools.evaluation.predictions import PredictionLog
from vtools.observe.mlflow_tracker import MlflowTracker
from vtools.observe.tracking import TrackedRun, Trackers
from vtools.options.train_job import TrainJob
from vtools.run_events import LogPoint, RunEnd
from vtools.runtime.amp import resolve_amp
from vtools.train import recipe
from vtools.train.loop import TrainComponents, train_one_epoch

load_emulated_npu()

import tests.emulated_npu as emulated  # noqa: E402

pytestmark = pytest.mark.npu_only(reason="the host-sync counter is the emulator's")

NPU = torch.device("npu:0")
BATCH, CLASSES, SIZE = 4, 5, 32


class RandomImages(Dataset):
    """uint8 images with labels, as the workers of a real loader hand them over."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (count, 3, SIZE, SIZE), dtype=torch.uint8, generator=generator)
        self.labels = torch.randint(0, CLASSES, (count,), generator=generator).tolist()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        return self.images[index], self.labels[index], index


def device_loader(batches: int) -> DeviceLoader:
    loader = make_loader(RandomImages(batches * BATCH), BATCH, NPU, workers=0, drop_last=True)
    return DeviceLoader(loader, NPU, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))


def syncs(run: Callable[[], object]) -> int:
    counter = emulated.extension().sync_count
    before = counter()
    run()
    return counter() - before


def recipe_components(extra: list[str]) -> TrainComponents:
    """A model and the real recipe (optimizer, schedule, loss, mixup, EMA) from train.py's own flags."""
    job = typed_options(
        TrainJob, train_flags.build_parser().parse_args(["--model", "test_resnet", "--lr", "0.01", *extra])
    )
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=CLASSES).to(NPU)
    optimizer = recipe.build_optimizer(model, job.optim, job.optim.lr)
    mixup = recipe.build_mixup(job.augment, CLASSES)
    scheduler, _ = recipe.build_scheduler(optimizer, job.optim, 8, job.run.eval_metric, job.run.seed)
    return TrainComponents(
        model=model,
        optimizer=optimizer,
        loss_fn=recipe.build_train_loss(job.augment, mixup is not None),
        amp=resolve_amp(NPU, job.runtime.amp),
        device=NPU,
        scaler=None,
        scheduler=scheduler,
        mixup=mixup,
        ema=recipe.build_ema(model, job.optim),
        clip_grad=job.optim.clip_grad,
        grad_accum_steps=job.optim.grad_accum_steps,
    )


@pytest.mark.parametrize(
    "extra",
    [
        [],
        [
            "--mixup",
            "0.2",
            "--model-ema",
            "--clip-grad",
            "1.0",
            "--grad-accum-steps",
            "2",
            "--sched-on-updates",
            "--amp",
            "--amp-dtype",
            "bfloat16",
        ],
    ],
    ids=["plain", "mixup-ema-clip-accum-bf16"],
)
def test_training_epoch_makes_no_per_batch_syncs(extra: list[str]) -> None:
    parts = recipe_components(extra)
    counts = [
        syncs(lambda n=n: train_one_epoch(parts, device_loader(n), 0, 0, log_interval=100, show_progress=False))
        for n in (4, 8)
    ]
    assert counts[0] == counts[1], counts


def test_on_a_saturating_chip_the_float_status_flag_adds_no_per_batch_sync() -> None:
    """A 910A's flag is read at every training step and once per validation pass, on the device: the loops
    still wait for it only at log steps and at the end."""
    from tests.emulated_npu.chips import posing_as

    with posing_as("910A"):
        parts = recipe_components([])
        assert parts.amp.overflow.flag
        train = [
            syncs(lambda n=n: train_one_epoch(parts, device_loader(n), 0, 0, log_interval=100, show_progress=False))
            for n in (4, 8)
        ]
        model = timm.create_model("test_resnet", num_classes=CLASSES).to(NPU)
        amp = resolve_amp(NPU, False)
        validate = [syncs(lambda n=n: evaluate(model, device_loader(n), NPU, amp, show_progress=False)) for n in (4, 8)]
    assert train[0] == train[1] and validate[0] == validate[1], (train, validate)


def test_validation_makes_no_per_batch_syncs() -> None:
    model = timm.create_model("test_resnet", num_classes=CLASSES).to(NPU)
    amp = resolve_amp(NPU, False)
    counts = [syncs(lambda n=n: evaluate(model, device_loader(n), NPU, amp, show_progress=False)) for n in (4, 8)]
    assert counts[0] == counts[1], counts


def test_class_report_predictions_make_no_per_batch_syncs() -> None:
    """The class report's per-sample outcomes stay on the device until one gather at the end."""
    model = timm.create_model("test_resnet", num_classes=CLASSES).to(NPU)
    amp = resolve_amp(NPU, False)

    def validate_and_gather(batches: int) -> None:
        log = PredictionLog()
        evaluate(model, device_loader(batches), NPU, amp, show_progress=False, on_logits=log.add)
        assert len(log.gather(NPU)) == batches * len(next(iter(device_loader(1))).targets)

    counts = [syncs(lambda n=n: validate_and_gather(n)) for n in (4, 8)]
    assert counts[0] == counts[1], counts


def test_inference_makes_no_per_batch_syncs() -> None:
    model = timm.create_model("test_resnet", num_classes=CLASSES).to(NPU)
    amp = resolve_amp(NPU, False)
    counts = [
        syncs(lambda n=n: list(predict(model, device_loader(n), amp, topk=3, show_progress=False))) for n in (4, 8)
    ]
    assert counts[0] == counts[1], counts


@pytest.mark.slow
def test_a_tracker_adds_no_sync_to_the_training_steps(tmp_path: Path) -> None:
    """MLflow on (a real SQLite store), fed every log step and the epoch's row as train.py feeds it: the
    epoch syncs exactly as often as without it, log steps included (log interval 2)."""
    run = TrackedRun("run", tmp_path, "id0", False, {"model": "test_resnet"}, {})
    tracker = MlflowTracker(run, f"sqlite:///{tmp_path / 'm.db'}", "e", artifacts=False)
    # a generous start: a SQLite store's schema set-up outlasted the 60 s default in a loaded full suite (10-15 s
    # alone), and a tracker given up logs nothing; what this test measures is the steps' syncs
    trackers = Trackers([tracker], print, start_seconds=600)
    trackers.begin()
    parts = recipe_components([])

    def epoch(on_log: Callable[[LogPoint], None] | None) -> None:
        result, _ = train_one_epoch(parts, device_loader(8), 0, 0, log_interval=2, show_progress=False, on_log=on_log)
        if on_log is not None:
            trackers.epoch({"epoch": 0, "train_loss": result.loss})

    plain, tracked = syncs(lambda: epoch(None)), syncs(lambda: epoch(trackers.step))
    lines = trackers.close(RunEnd("FINISHED", {}))
    assert tracked == plain, (plain, tracked)
    assert lines == [] and trackers.feeds[0].done["step"] == 4

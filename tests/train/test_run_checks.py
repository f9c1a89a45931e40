"""vtools/train/run.py: the checks and choices around the epochs that need no whole run (which metric picks the
best epoch, when the ranks agree, what is refused before training, when a run stops early, which weights
validation reads). Whole runs through them: tests/scripts/test_train.py, test_multilabel.py, test_early_stop.py."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.train.test_run import a_run, an_epoch
from vtools.cli.train_flags import build_parser
from vtools.cli.typed import typed_options
from vtools.data.readers.registry import Source
from vtools.errors import RunFailed, UsageError
from vtools.evaluation.loops import EvalResult
from vtools.options.train_job import TrainJob
from vtools.runtime.distributed import DistInfo
from vtools.train.early_stop import EarlyStop
from vtools.train.resume import SavedOptions
from vtools.train.run import (
    EpochSettings,
    TrainingData,
    check_finite,
    check_same_experiment,
    check_same_label_kind,
    ema_on_device,
    eval_model,
    multi_label_metric,
    stop_check_every,
)

pytestmark = pytest.mark.cpu_only(reason="host-side decisions; the device runs are tests/scripts/test_train.py's")


def job_of(*flags: str) -> TrainJob:
    return typed_options(TrainJob, build_parser().parse_args(list(flags)))


def source(description: str, label_classes: int | None = None) -> Source:
    """A split with one label per image, or (``label_classes``) a multi-label one over that many classes."""
    sets = None if label_classes is None else SimpleNamespace(num_classes=label_classes)
    return Source(SimpleNamespace(label_sets=sets), None, description)


def data_of(train: Source) -> TrainingData:
    return TrainingData(train, train, ["a", "b"], 2)


def test_the_settings_are_read_from_the_options_each_under_its_own_name() -> None:
    flags = ["--val-interval", "3", "--log-interval", "7", "-b", "24", "--mixup-off-epoch", "9"]
    flags += ["--eval-metric", "top5", "--threshold", "0.3", "--dist-bn", "broadcast", "--sync-bn"]
    settings = EpochSettings.of(job_of(*flags, "--model-ema-force-cpu"))
    expected = {"val_interval": 3, "log_interval": 7, "batch_size": 24, "mixup_off_epoch": 9, "eval_metric": "top5"}
    expected |= {"threshold": 0.3, "dist_bn": "broadcast", "sync_bn": True, "ema_force_cpu": True}
    assert asdict(settings) == expected


def test_single_label_data_keeps_the_metric_and_refuses_map() -> None:
    said: list[str] = []
    single = data_of(source("the folder data/x/train"))
    assert multi_label_metric(job_of("--eval-metric", "loss"), single, said.append) == "loss"
    assert multi_label_metric(job_of("--class-weights", "balanced"), single, said.append) == "top1"
    with pytest.raises(UsageError) as refused:
        multi_label_metric(job_of("--eval-metric", "map"), single, said.append)
    assert (
        str(refused.value)
        == "--eval-metric map needs multi-label data; the folder data/x/train has one label per image"
    )
    assert said == []


def test_multi_label_data_picks_map_says_why_and_refuses_single_label_balancing() -> None:
    said: list[str] = []
    multi = data_of(source("the folder data/pairs/train", label_classes=4))
    assert multi_label_metric(job_of("--eval-metric", "top5"), multi, said.append) == "map"
    assert multi_label_metric(job_of("--eval-metric", "top1"), multi, said.append) == "map"
    assert said == [
        f"multi-label data: the best epoch is the one with the highest mAP (--eval-metric map, not {metric})"
        for metric in ("top5", "top1")
    ]
    said.clear()
    assert multi_label_metric(job_of("--eval-metric", "loss"), multi, said.append) == "loss"
    assert multi_label_metric(job_of("--eval-metric", "map"), multi, said.append) == "map"
    assert said == []
    for flags, flag in (
        (["--class-weights", "balanced"], "--class-weights"),
        (["--balanced-sampler"], "--balanced-sampler"),
    ):
        with pytest.raises(UsageError) as refused:
            multi_label_metric(job_of(*flags), multi, said.append)
        assert str(refused.value) == f"{flag} balances single-label classes; the folder data/pairs/train is multi-label"


def test_ranks_agree_every_log_step_and_one_process_every_update() -> None:
    job = job_of("--log-interval", "13")
    assert stop_check_every(job, DistInfo(0, 1)) == 1
    assert stop_check_every(job, DistInfo(1, 2)) == 13


def test_both_splits_multi_label_over_the_same_classes_or_neither() -> None:
    check_same_label_kind(source("train"), source("val"))
    check_same_label_kind(source("train", 5), source("val", 5))
    with pytest.raises(UsageError) as refused:
        check_same_label_kind(source("the folder t", 5), source("the folder v"))
    assert str(refused.value) == (
        "the folder t is multi-label but the folder v has one label per image: give both splits a labels file "
        "(labels.csv or labels.json), or neither"
    )
    with pytest.raises(UsageError) as refused:
        check_same_label_kind(source("the folder t"), source("the folder v", 5))
    assert str(refused.value).startswith("the folder v is multi-label but the folder t has one label per image")
    with pytest.raises(UsageError) as refused:
        check_same_label_kind(source("the folder t", 5), source("the folder v", 4))
    assert str(refused.value) == (
        "the folder t has 5 classes but the folder v has 4: the splits must name the same classes"
    )


METRICS = EvalResult(top1=50.0, top5=90.0, loss=0.7, count=30, seconds=1.0)


@pytest.mark.parametrize("where", ["weight", "buffer"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_diverged_epoch_stops_the_run_before_it_is_saved(where: str, bad: float) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    check_finite(4, METRICS, model)
    check_finite(4, None, model)  # an epoch that did not validate
    tensor = model[0].weight if where == "weight" else model[1].running_mean
    with torch.no_grad():
        tensor[1] = bad
    with pytest.raises(RunFailed) as failed:
        check_finite(4, METRICS, model)
    assert str(failed.value).startswith("epoch 4: the weights hold non-finite values: training diverged")


def test_a_diverged_eval_loss_stops_the_run_with_its_value() -> None:
    model = torch.nn.Linear(3, 2)
    with pytest.raises(RunFailed) as failed:
        check_finite(2, EvalResult(top1=1.0, top5=5.0, loss=math.inf, count=3, seconds=1.0), model)
    assert str(failed.value) == (
        "epoch 2: the eval loss is inf: training diverged; the epoch is not saved (lower --lr, raise "
        "--warmup-epochs, or use --clip-grad), and the previous checkpoint is intact"
    )


def test_a_model_without_floating_point_state_has_nothing_to_diverge() -> None:
    counted = torch.nn.Module()
    counted.register_buffer("batches_seen", torch.tensor([7]))  # an integer buffer only
    check_finite(1, METRICS, torch.nn.Identity())
    check_finite(1, None, counted)


def test_validation_reads_the_ema_on_the_device_else_the_model_never_the_ddp_wrapper() -> None:
    model, ema = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    wrapped = SimpleNamespace(module=model)  # what DDP holds its model as
    with_ema = SimpleNamespace(model=wrapped, ema=SimpleNamespace(module=ema))
    assert ema_on_device(with_ema, force_cpu=False) is ema
    assert ema_on_device(with_ema, force_cpu=True) is None
    assert eval_model(with_ema, DistInfo(0, 2), ema_force_cpu=False) is ema
    assert eval_model(with_ema, DistInfo(0, 2), ema_force_cpu=True) is model
    no_ema = SimpleNamespace(model=wrapped, ema=None)
    assert ema_on_device(no_ema, force_cpu=False) is None
    assert eval_model(no_ema, DistInfo(0, 2), ema_force_cpu=False) is model
    assert eval_model(no_ema, DistInfo(0, 1), ema_force_cpu=False) is wrapped  # one process: as built


def test_another_epoch_follows_unless_this_was_the_last_or_a_signal_stopped_it() -> None:
    run = a_run(num_epochs=3)
    assert run.continues(0, an_epoch()) and run.continues(1, an_epoch())
    assert not run.continues(2, an_epoch())
    assert not run.continues(0, an_epoch(interrupted=True))


def test_the_epochs_trained_here_are_those_from_this_process_first() -> None:
    run = a_run(num_epochs=6, first_epoch=2)
    run.summary_rows = [{"epoch": "0"}, {"epoch": "1"}, {"epoch": 2}, {"epoch": 3}]  # carried rows are text
    assert run.epochs_trained() == 2
    assert a_run(num_epochs=6).epochs_trained() == 0


def test_early_stopping_stops_once_patience_runs_out_after_the_checkpoint_is_whole() -> None:
    rows = [{"epoch": e, "eval_top1": top1} for e, top1 in enumerate([10.0, 20.0, 19.0, 20.0])]
    off = a_run(num_epochs=10)
    off.summary_rows = rows
    assert not off.stops_early() and off.stopped_early == "" and off.manager.waits == 0
    patient = a_run(num_epochs=10, early_stop=EarlyStop("top1", 3, 0.0))
    patient.summary_rows = rows
    assert not patient.stops_early() and patient.stopped_early == "" and patient.manager.waits == 0
    out = a_run(num_epochs=10, early_stop=EarlyStop("top1", 2, 0.0))
    out.summary_rows = rows
    assert out.stops_early() and out.manager.waits == 1
    assert out.stopped_early.startswith("early stop: top1 has not improved by more than 0 for 2 validated epoch(s)")


def test_a_resume_that_changes_the_experiment_stops_in_one_line_naming_the_change() -> None:
    state = {"args": {"lr": 0.1, "seed": 1, "epochs": 10, "batch_size": 8}, "world_size": 2, "class_names": ["a", "b"]}
    changed = SavedOptions({"lr": 0.2, "seed": 2, "epochs": 10, "batch_size": 8}, frozenset({"epochs"}))
    with pytest.raises(UsageError) as refused:
        check_same_experiment(state, Path("run/last.pth.tar"), changed, 10, ["a", "b"], 50, DistInfo(0, 2), print)
    assert str(refused.value) == (
        "--resume run/last.pth.tar: this command line changes the run it continues (--lr 0.1 -> 0.2; --seed 1 -> 2); "
        "resume with the run's options (its config.yaml), or start a new run from its weights with "
        "--initial-checkpoint run/last.pth.tar"
    )


def test_an_elastic_restart_may_change_the_global_batch_and_new_epochs_are_said() -> None:
    state = {"args": {"lr": 0.1, "epochs": 10, "batch_size": 8}, "world_size": 2, "train_samples": 50}
    same = SavedOptions({"lr": 0.1, "epochs": 12, "batch_size": 8}, frozenset({"epochs"}))
    said: list[str] = []
    with pytest.raises(UsageError, match=r"global batch \(--batch-size x processes\) 8 x 2 -> 8 x 1"):
        check_same_experiment(state, Path("c.pth"), same, 12, [], 50, DistInfo(0, 1), said.append)
    check_same_experiment(state, Path("c.pth"), same, 12, [], 50, DistInfo(0, 1), said.append, elastic=True)
    assert said == ["--epochs 12 (the run had 10): the schedule is the one for 12 epochs from here on"]
    check_same_experiment(state, Path("c.pth"), same, 10, [], 50, DistInfo(0, 2), said.append)
    assert len(said) == 1  # the same epochs: nothing to say


def test_a_head_with_more_outputs_than_the_data_has_classes_is_said(fashion4: Path) -> None:
    """--num-classes above the folder's class count trains outputs no image belongs to: allowed, said once."""
    from vtools.train.run import open_data

    said: list[str] = []
    job = job_of("--data-dir", str(fashion4), "--model", "test_resnet", "--num-classes", "6")
    data, _ = open_data(job, DistInfo(), said.append)
    assert data.num_classes == 6 and len(data.classes) == 4
    assert [line for line in said if "--num-classes" in line] == [
        f"--num-classes 6 is more than the 4 classes of {data.train.description}: outputs 4-5 have no images and "
        "are named by their index in the class report; leave --num-classes out to train one output per class"
    ]
    said.clear()
    open_data(job_of("--data-dir", str(fashion4), "--model", "test_resnet"), DistInfo(), said.append)
    assert not [line for line in said if "--num-classes" in line]

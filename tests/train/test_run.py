"""vtools/train/run.py and run_files.py: the training run's decisions between its verbs (which epochs
validate, what counts as a stop inside an epoch, when a run stops after one) and the rows it writes.
Whole runs through these verbs: tests/scripts/test_train.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vtools.data.readers.registry import Source
from vtools.errors import UsageError
from vtools.evaluation.loops import EvalResult
from vtools.runtime.distributed import DistInfo
from vtools.train.early_stop import EarlyStop
from vtools.train.loop import EpochResult
from vtools.train.resume import Position
from vtools.train.run import EpochSettings, TrainingRun, check_labels_fit
from vtools.train.run_files import summary_row

pytestmark = pytest.mark.cpu_only(reason="host-side decisions; the device runs are tests/scripts/test_train.py's")

SETTINGS = EpochSettings(
    val_interval=3,
    log_interval=5,
    batch_size=8,
    mixup_off_epoch=0,
    eval_metric="top1",
    threshold=0.5,
    dist_bn="reduce",
    sync_bn=False,
    ema_force_cpu=False,
)


class Recorder:
    """A checkpoint manager that records waits, and a stop whose agreement is given."""

    def __init__(self, agreed: bool = False) -> None:
        self.waits = 0
        self._agreed = agreed

    def wait(self) -> None:
        self.waits += 1

    def agreed(self, num_updates: int | None = None) -> bool:
        return self._agreed


def a_run(
    num_epochs: int, manager: Recorder | None = None, first_epoch: int = 0, early_stop: EarlyStop | None = None
) -> TrainingRun:
    """A run with only what the decisions read (the rest is never reached)."""
    nothing = None
    return TrainingRun(
        SETTINGS,
        plan=nothing,
        data=nothing,
        parts=nothing,
        loaders=nothing,
        manager=manager or Recorder(),
        claim=nothing,
        dist_info=DistInfo(),
        num_epochs=num_epochs,
        position=Position(epoch=first_epoch),
        decode_during_validation=False,
        checkpoint_state=lambda where, result: None,
        empty_model=lambda: None,
        early_stop=early_stop,
    )


def an_epoch(interrupted: bool = False, steps: int = 4) -> EpochResult:
    return EpochResult(
        loss=1.0, samples=32, seconds=2.0, data_seconds=0.5, steps=steps, skipped_updates=0, interrupted=interrupted
    )


METRICS = EvalResult(top1=50.0, top5=90.0, loss=0.7, count=30, seconds=1.0)


def test_the_settings_are_the_few_options_the_verbs_read() -> None:
    settings = SETTINGS
    assert (settings.val_interval, settings.batch_size, settings.eval_metric) == (3, 8, "top1")
    assert (settings.dist_bn, settings.sync_bn, settings.ema_force_cpu) == ("reduce", False, False)


def test_epochs_validate_on_the_interval_and_the_last_one_always() -> None:
    run = a_run(num_epochs=7)
    assert [epoch for epoch in range(7) if run.validates(epoch)] == [2, 5, 6]
    assert list(a_run(num_epochs=7, first_epoch=4).epochs()) == [4, 5, 6]


def test_a_stop_during_training_or_validation_is_a_stop_within_the_epoch() -> None:
    run = a_run(num_epochs=6)
    assert run.stopped_within(0, an_epoch(interrupted=True), None)
    assert run.stopped_within(2, an_epoch(), None)  # a validating epoch whose validation a signal stopped
    assert not run.stopped_within(0, an_epoch(), None)  # --val-interval skips epoch 0's validation
    assert not run.stopped_within(2, an_epoch(), METRICS)


def test_a_run_stops_after_an_epoch_once_its_checkpoint_is_whole_but_finishes_after_the_last() -> None:
    manager = Recorder()
    assert a_run(num_epochs=3, manager=manager).stops_after(1, Recorder(agreed=True))
    assert manager.waits == 1
    assert not a_run(num_epochs=3, manager=manager).stops_after(2, Recorder(agreed=True))  # finishes instead
    assert not a_run(num_epochs=3, manager=manager).stops_after(0, Recorder(agreed=False))
    assert manager.waits == 1


def test_fewer_outputs_than_the_training_labels_stop_in_one_line() -> None:
    source = Source(SimpleNamespace(labels=[0, 4, 2]), None, "the folder data/x/train")
    check_labels_fit(source, None, 5)
    with pytest.raises(UsageError) as refused:
        check_labels_fit(source, None, 4)
    assert str(refused.value) == (
        "--num-classes 4 is fewer than the 5 classes of the folder data/x/train; leave --num-classes out (it "
        "defaults to the class count) or give at least 5"
    )
    named_only = Source(SimpleNamespace(labels=None), None, "a dataset")  # labels known once images are read
    with pytest.raises(UsageError, match="fewer than the 3 classes"):
        check_labels_fit(named_only, ["a", "b", "c"], 2)


def test_a_summary_row_leaves_what_the_epoch_did_not_measure_empty() -> None:
    validated = summary_row(4, an_epoch(), METRICS, 0.01)
    assert (validated["eval_top1"], validated["eval_samples"], validated["img_per_sec"]) == (50.0, 30, 16.0)
    skipped = summary_row(5, an_epoch(steps=0), None, 0.01)  # not validated, trained before a resume
    assert skipped["eval_loss"] == skipped["eval_top1"] == skipped["img_per_sec"] == skipped["data_wait"] == ""
    assert skipped["train_loss"] == 1.0 and skipped["epoch"] == 5


def test_a_batch_larger_than_the_set_is_fitted_and_returned() -> None:
    """fit_batch_to_set says the size to train with (pairs under mixup) and leaves the options as they are."""
    from vtools.cli.train_flags import build_parser
    from vtools.cli.typed import typed_options
    from vtools.options.train_job import TrainJob
    from vtools.runtime.distributed import DistInfo
    from vtools.train.assemble import fit_batch_to_set

    job = typed_options(TrainJob, build_parser().parse_args(["--mixup", "0.2"]))
    size, note = fit_batch_to_set(128, job.augment, 42, 7, DistInfo())
    assert (size, job.data.batch_size) == (6, 128)
    assert note.startswith("--batch-size 128 is more than the 7 training images: training in batches of 6")
    assert fit_batch_to_set(4, job.augment, 42, 7, DistInfo()) == (4, "")
    with pytest.raises(UsageError, match="too few for a batch of pairs"):
        fit_batch_to_set(4, job.augment, 42, 1, DistInfo())


def test_an_elastic_restart_on_fewer_processes_keeps_the_global_batch_by_accumulating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchrun continues a 2-process run (batch 8) on 1 process with --resume auto: 2 accumulation steps
    keep the global batch of 16, recorded in the options checkpoints store, said in one line; where no
    whole number keeps it (3 processes), the new global batch is said; outside torchrun's agent, or
    without --resume auto, nothing changes (the resume check then compares as ever)."""
    from vtools.cli.train_flags import build_parser, typed
    from vtools.runtime.distributed import DistInfo
    from vtools.train.resume import SavedOptions
    from vtools.train.run import keep_global_batch

    job = typed(build_parser().parse_args(["--batch-size", "8", "--resume", "auto"]))
    state = {"args": {"batch_size": 8, "grad_accum_steps": 1}, "world_size": 2}
    said: list[str] = []
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    kept, elastic = keep_global_batch(job, state, DistInfo(0, 1), said.append)  # the checkpoints record the job's
    assert (kept.optim.grad_accum_steps, SavedOptions.of(kept).values["grad_accum_steps"], elastic) == (2, 2, True)
    assert said == [
        "torchrun continues the run on 1 process(es) instead of 2: --grad-accum-steps 1 -> 2 keeps its global "
        "batch of 16"
    ]
    said.clear()
    same, elastic = keep_global_batch(job, state, DistInfo(0, 3), said.append)
    assert same.optim.grad_accum_steps == 1 and elastic
    assert said == [
        "torchrun continues the run on 3 process(es) instead of 2: the global batch is 24 (it was 16; no whole "
        "--grad-accum-steps keeps it)"
    ]
    assert keep_global_batch(job, state, DistInfo(0, 2), said.append)[1] is False  # the same count
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    assert keep_global_batch(job, state, DistInfo(0, 1), said.append) == (job, False)

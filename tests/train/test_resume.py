"""Checkpoint and resume state, in process and on every device: a run saved, written to disk, read back
safely and restored into fresh components continues exactly as the uninterrupted run (weights, optimizer,
schedule, GradScaler, EMA, random streams); the position survives another batch size or process count;
a schedule started at a later epoch is the one a run reaching that epoch has; the checkpoint files kept
are the ones the metric and --checkpoint-hist name. The whole-run tests (tests/scripts/test_train.py's exact
resume, tests/scripts/test_schedule.py against timm) cover the same through train.py; these run in seconds."""

from __future__ import annotations

import copy
import os
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from timm.scheduler import create_scheduler_v2, scheduler_kwargs

from tests.cli.test_tracking_flags import TRACKER_DESTS
from vtools.cli.declared import resume_changeable
from vtools.cli.train_flags import build_parser
from vtools.cli.typed import typed_options
from vtools.data.loaders import Batch
from vtools.errors import RunFailed, UsageError
from vtools.options.train_job import TrainJob
from vtools.runtime.amp import resolve_amp
from vtools.runtime.distributed import DistInfo
from vtools.train import recipe
from vtools.train.assemble import build_components
from vtools.train.checkpoint import BEST, LAST, CheckpointManager, host_copy, load_training_state
from vtools.train.loop import TrainComponents, train_one_epoch
from vtools.train.recovery import ProgressMark
from vtools.train.resume import (
    Position,
    RunFolder,
    SavedOptions,
    experiment_changes,
    restore,
    start_at_epoch,
    training_state,
)
from vtools.train.run import resume_position

FEATURES, CLASSES, BATCH, STEPS = 6, 3, 4, 4
FLAGS = ["--lr", "0.05", "--momentum", "0.9", "--sched", "cosine", "--warmup-epochs", "1", "--epochs", "5"]


def _args(*extra: str):
    return build_parser().parse_args(["--model", "mlp", "--batch-size", str(BATCH), *FLAGS, *extra])


def _batches(device: torch.device, epoch: int) -> list[Batch]:
    generator = torch.Generator().manual_seed(100 + epoch)
    return [
        Batch(
            torch.randn(BATCH, FEATURES, generator=generator).to(device),
            torch.randint(0, CLASSES, (BATCH,), generator=generator).to(device),
            torch.arange(BATCH),
        )
        for _ in range(STEPS)
    ]


def _components(device: torch.device, args, seed: int) -> TrainComponents:
    """train.py's own assembly (optimizer, schedule, EMA, ...) around a small model with dropout, so that
    the random streams matter; a GradScaler as fp16 runs have."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, CLASSES)
    ).to(device)
    loaders = SimpleNamespace(channels_last=False, updates_per_epoch=lambda accum: -(-STEPS // accum))
    job = typed_options(TrainJob, args)
    parts, _, _ = build_components(job, model, loaders, CLASSES, device, resolve_amp(device, False), DistInfo())
    parts.scaler = resolve_amp(device, True, "float16").grad_scaler()
    return parts


def _train(parts: TrainComponents, device: torch.device, epochs: range, num_updates: int, metrics=None) -> int:
    """Epochs as train.py drives them: per-update schedule steps inside, ``step(epoch + 1, metric)`` after."""
    for epoch in epochs:
        _, num_updates = train_one_epoch(parts, _batches(device, epoch), epoch, num_updates, show_progress=False)
        parts.scheduler.step(epoch + 1, None if metrics is None else metrics[epoch])
    return num_updates


def _save_and_read(state: dict, folder: Path, metric: float | None = None) -> dict:
    manager = CheckpointManager(folder)
    manager.save(state, epoch=state["epoch"] - 1, metric=metric)
    manager.wait()
    return load_training_state(folder / LAST)


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(
        torch.equal(x.detach().cpu(), y.detach().cpu())
        for x, y in zip(a.state_dict().values(), b.state_dict().values())
    )


@pytest.mark.parametrize("resume_optimizer", [True, False], ids=["resume", "no-resume-opt"])
def test_a_restored_run_continues_as_the_uninterrupted_one(
    device: torch.device, tmp_path: Path, resume_optimizer: bool
) -> None:
    args = _args("--model-ema", "--model-ema-decay", "0.5")
    run = _components(device, args, seed=0)
    num_updates = _train(run, device, range(2), 0)
    run.scaler.update(128.0)  # a run whose GradScaler had backed off
    data_config = {"input_size": (3, 8, 8), "crop_pct": 0.9}
    state = training_state(
        vars(args), run, Position(2, 0, num_updates), ["a", "b", "c"], device, DistInfo(), data_config, None, 32
    )
    saved = _save_and_read(state, tmp_path, metric=42.0)
    assert (saved["epoch"], saved["num_updates"], saved["arch"], saved["train_samples"]) == (2, 8, "mlp", 32)
    assert (saved["class_names"], saved["data_config"], saved["version"]) == (["a", "b", "c"], data_config, 2)
    assert saved["args"] == vars(args) and saved["scaler"]["scale"] == 128.0
    uninterrupted = copy.deepcopy(run)
    _train(uninterrupted, device, range(2, 4), num_updates)  # the random streams go on from the saved ones
    resumed = _components(device, args, seed=1)
    assert not _same(resumed.model, run.model)
    manager = CheckpointManager(tmp_path / "resumed")
    position, note = restore(saved, resumed, manager, device, DistInfo(), 0, BATCH, resume_optimizer)
    assert (position, note) == (Position(2, 0, 8), "")
    assert (manager.best_metric, manager.best_epoch) == (42.0, 1)  # the best so far comes along
    assert _same(resumed.model, run.model) and _same(resumed.ema.module, run.ema.module)
    if not resume_optimizer:  # --no-resume-opt: a fresh optimizer and GradScaler, the schedule still carried
        assert resumed.optimizer.state_dict()["state"] == {}
        assert resumed.scaler.get_scale() == resolve_amp(device, True, "float16").grad_scaler().get_scale()
        assert recipe.mean_lr(resumed.optimizer) == recipe.mean_lr(run.optimizer)
        timms = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.05)  # timm's train.py on resume:
        schedule, _ = create_scheduler_v2(timms, **scheduler_kwargs(args), updates_per_epoch=STEPS)
        schedule.step(position.epoch)  # the scheduler stepped to the resumed epoch sets the rate
        assert recipe.mean_lr(resumed.optimizer) == pytest.approx(timms.param_groups[0]["lr"])
        return
    assert resumed.scaler.state_dict() == run.scaler.state_dict()
    _train(resumed, device, range(position.epoch, 4), position.num_updates)
    assert _same(resumed.model, uninterrupted.model) and _same(resumed.ema.module, uninterrupted.ema.module)
    assert not _same(resumed.model, run.model)  # the two epochs after the save moved the weights
    assert recipe.mean_lr(resumed.optimizer) == recipe.mean_lr(uninterrupted.optimizer)
    assert resumed.scheduler.state_dict() == uninterrupted.scheduler.state_dict()
    assert resumed.scaler.state_dict() == uninterrupted.scaler.state_dict()


def test_random_streams_resume_where_they_were(device: torch.device, tmp_path: Path) -> None:
    """After a restore the python, numpy, torch and device generators draw what the saved run drew next."""
    import random

    import numpy as np

    args = _args()
    run = _components(device, args, seed=0)
    saved = _save_and_read(training_state(vars(args), run, Position(1), [], device, DistInfo(), {}), tmp_path)
    expected = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, device=device).cpu())
    single = {key: value for key, value in saved.items() if key != "rank_states"}  # before per-rank states
    for state in (saved, single):
        torch.manual_seed(123)  # other streams in between: the restore must bring the saved ones back
        random.seed(5)
        np.random.seed(5)
        restore(state, _components(device, args, seed=1), CheckpointManager(tmp_path), device, DistInfo(), 0, BATCH)
        drawn = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, device=device).cpu())
        assert drawn[:2] == expected[:2]
        assert torch.equal(drawn[2], expected[2]) and torch.equal(drawn[3], expected[3])


def test_a_mid_epoch_position_is_kept_in_samples(device: torch.device, tmp_path: Path) -> None:
    """Saved after 3 steps of 4 images: resumed with batches of 2 it continues at step 6, with the same
    global batch on 2 processes at step 1 (each rank then reseeds, and says so); the interrupted epoch's
    loss share comes along only mid-epoch."""
    args = _args()
    run = _components(device, args, seed=0)
    result, updates = train_one_epoch(run, _batches(device, 0)[:3], 0, 0, show_progress=False)
    state = training_state(vars(args), run, Position(0, 3, updates), [], device, DistInfo(), {}, result)
    saved = _save_and_read(state, tmp_path)
    assert (saved["step_in_epoch"], saved["samples_in_epoch"], saved["world_size"]) == (3, 12, 1)
    fresh = _components(device, args, seed=1)
    half, note = restore(saved, fresh, CheckpointManager(tmp_path), device, DistInfo(), 0, BATCH // 2)
    assert note == "" and (half.epoch, half.step, half.num_updates) == (0, 6, 3) and type(half.step) is int
    assert fresh.optimizer.state_dict()["state"] != {}  # the optimizer resumes unless told not to
    assert half.carried == (pytest.approx(result.local_loss_sum), 12) and half.samples_before == 12
    two, note = restore(saved, fresh, CheckpointManager(tmp_path), device, DistInfo(1, 2), 0, BATCH // 2)
    assert two.step == 3 and two.carried == (0.0, 0)  # another process count: no rank's share is its own
    assert two.samples_before == 12  # the epoch's count goes on over every process
    assert note.startswith(" (saved by 1 process(es), resumed by 2: random streams re-seeded")
    restore(saved, fresh, CheckpointManager(tmp_path), device, DistInfo(1, 2), 7, BATCH)
    drawn = torch.rand(2)
    torch.manual_seed(7 + 1)  # rank 1 seeds the run's seed + its rank
    assert torch.equal(drawn, torch.rand(2))
    old = {key: value for key, value in saved.items() if key not in ("samples_in_epoch", "num_updates")}
    assert restore(old, fresh, CheckpointManager(tmp_path), device, DistInfo(), 0, BATCH // 2)[0] == Position(
        0, 3, 0, (pytest.approx(result.local_loss_sum), 12), 3 * (BATCH // 2)
    )  # a first-version checkpoint: the step as saved, no update count, its samples as this batch counts them
    shared = training_state(vars(args), run, Position(0, 3, updates), [], device, DistInfo(0, 2), {}, result)
    assert (shared["samples_in_epoch"], shared["world_size"]) == (3 * BATCH * 2, 2)
    start = {**saved, "step_in_epoch": 0, "samples_in_epoch": 0}
    assert restore(start, fresh, CheckpointManager(tmp_path), device, DistInfo(), 0, BATCH)[0].carried == (0.0, 0)


@pytest.mark.filterwarnings("ignore:PlateauLRScheduler is deprecated")
def test_a_plateau_schedule_resumes_with_its_patience(device: torch.device, tmp_path: Path) -> None:
    """timm's plateau schedule keeps its counters in the torch scheduler inside it: a run resumed after
    two flat epochs lowers the rate when the uninterrupted one does, not two epochs later."""
    args = _args("--sched", "plateau", "--patience-epochs", "2", "--decay-rate", "0.5", "--warmup-epochs", "0")
    metrics = [50.0, 50.0, 50.0, 50.0, 50.0]
    run = _components(device, args, seed=0)
    num_updates = _train(run, device, range(2), 0, metrics)
    saved = _save_and_read(
        training_state(vars(args), run, Position(2, 0, num_updates), [], device, DistInfo(), {}), tmp_path
    )
    resumed = _components(device, args, seed=1)
    restore(saved, resumed, CheckpointManager(tmp_path), device, DistInfo(), 0, BATCH)
    rates = []
    for parts in (run, resumed):
        _train(parts, device, range(2, 4), num_updates, metrics)
        rates.append(recipe.mean_lr(parts.optimizer))
    assert rates[0] == rates[1] == pytest.approx(0.05 * 0.5)


@pytest.mark.parametrize("start", [1, 3])
@pytest.mark.parametrize("on_updates", [False, True], ids=["per-epoch", "per-update"])
def test_a_later_start_epoch_has_the_schedule_a_run_reaching_it_has(
    device: torch.device, on_updates: bool, start: int
) -> None:
    """--start-epoch N begins with the learning rate and update count of a run that trained epochs 0..N-1."""
    args = _args(*(["--sched-on-updates"] if on_updates else []))
    walked = _components(device, args, seed=0)
    for epoch in range(start):
        for update in range(1, STEPS + 1):
            walked.scheduler.step_update(num_updates=epoch * STEPS + update)
        walked.scheduler.step(epoch + 1)
    jumped = _components(device, args, seed=0)
    position = start_at_epoch(jumped, start, STEPS, on_updates)
    assert position == Position(start, 0, start * STEPS)
    assert recipe.mean_lr(jumped.optimizer) == pytest.approx(recipe.mean_lr(walked.optimizer))
    assert recipe.mean_lr(jumped.optimizer) != pytest.approx(recipe.mean_lr(_components(device, args, 0).optimizer))
    assert start_at_epoch(_components(device, args, seed=0), 0, STEPS, on_updates) == Position(0, 0, 0)
    unscheduled = _components(device, args, seed=0)
    unscheduled.scheduler = None
    assert start_at_epoch(unscheduled, 2, STEPS, on_updates) == Position(2, 0, 2 * STEPS)


# ---------------------------------------------------------------- the files kept


@pytest.mark.cpu_only(reason="file layout on disk is host-side")
@pytest.mark.parametrize("higher_is_better", [True, False], ids=["top1", "loss"])
def test_best_last_and_history_follow_the_metric(tmp_path: Path, higher_is_better: bool) -> None:
    """last is every epoch's state; a validated epoch also gets a numbered file (the newest --checkpoint-hist
    kept) and becomes best when its metric improves (higher top-1, or lower loss); an unvalidated epoch
    changes neither, nor does a tie with the best (the earlier epoch stays best, as in timm); an interrupted
    save replaces last and keeps the best so far."""
    written = []
    manager = CheckpointManager(tmp_path, keep=2, higher_is_better=higher_is_better, on_write=written.append)
    metrics = [10.0, 30.0, None, 30.0 if higher_is_better else 10.0, 5.0]
    bests = []
    for epoch, metric in enumerate(metrics):
        improved = manager.save({"epoch": epoch}, epoch, metric)
        manager.wait()
        bests.append(improved)
        assert torch.load(tmp_path / LAST, weights_only=True)["epoch"] == epoch
    expected_best = 1 if higher_is_better else 4
    assert bests == ([True, True, False, False, False] if higher_is_better else [True, False, False, False, True])
    assert (manager.best_epoch, manager.best_metric) == (expected_best, metrics[expected_best])
    assert torch.load(tmp_path / BEST, weights_only=True)["epoch"] == expected_best
    numbered = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-"))
    assert numbered == ["checkpoint-3.pth.tar", "checkpoint-4.pth.tar"]  # epoch 2 was not validated
    assert {p.name for p in map(Path, written)} == {LAST, BEST, *(f"checkpoint-{e}.pth.tar" for e in (0, 1, 3, 4))}
    interrupted = manager.save_interrupted({"epoch": 5, "step_in_epoch": 2})
    saved = torch.load(interrupted, weights_only=True)
    assert interrupted == tmp_path / LAST
    assert (saved["step_in_epoch"], saved["best_epoch"], saved["best_metric"]) == (
        2,
        expected_best,
        metrics[expected_best],
    )


@pytest.mark.cpu_only(reason="a failing write is host-side file handling; no tensor leaves the host")
def test_a_failed_background_write_is_raised_once(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    manager = CheckpointManager(tmp_path / "file" / "run")
    manager.save({"epoch": 1}, epoch=0, metric=None)
    with pytest.raises(RunFailed, match="last.pth.tar was not created"):
        manager.wait()
    manager.wait()  # reported once, then forgotten


@pytest.mark.cpu_only(reason="file layout on disk is host-side")
@pytest.mark.parametrize("keep, numbered", [(0, []), (1, ["checkpoint-2.pth.tar"])])
def test_a_short_history_keeps_the_newest_and_best(tmp_path: Path, keep: int, numbered: list[str]) -> None:
    """--checkpoint-hist 0 keeps no numbered file, 1 the newest; best is kept either way."""
    manager = CheckpointManager(tmp_path, keep=keep)
    for epoch, metric in enumerate([3.0, 1.0, 2.0]):
        manager.save({"epoch": epoch}, epoch, metric)
    manager.wait()
    assert sorted(os.listdir(tmp_path)) == sorted([LAST, BEST, *numbered])
    assert torch.load(tmp_path / BEST, weights_only=True)["epoch"] == 0


def test_the_saved_copy_is_the_host_state_of_the_moment(device: torch.device) -> None:
    """What the background writer saves: host tensors that later training does not change, in the same
    containers, with a module state_dict's version record (which loading reads) kept."""
    model = torch.nn.BatchNorm1d(3).to(device)
    state = {
        "model": model.state_dict(),
        "pair": (torch.ones(2, device=device), 3),
        "list": [torch.zeros(1, device=device)],
    }
    copied = host_copy(state)
    assert isinstance(copied["model"], OrderedDict) and copied["model"]._metadata == state["model"]._metadata
    assert isinstance(copied["pair"], tuple) and copied["pair"][1] == 3 and isinstance(copied["list"], list)
    assert all(t.device.type == "cpu" for t in [*copied["model"].values(), copied["pair"][0], copied["list"][0]])
    with torch.no_grad():
        model.running_mean.add_(5.0)
        state["pair"][0].add_(1.0)
    assert torch.equal(copied["model"]["running_mean"], torch.zeros(3))
    assert torch.equal(copied["pair"][0], torch.ones(2))


@pytest.mark.cpu_only(reason="reading files is host-side")
def test_a_file_that_is_not_a_training_checkpoint_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^--resume .*absent\.pth: no such checkpoint$"):
        load_training_state(tmp_path / "absent.pth")
    torch.save({"state_dict": {}, "epoch": 1}, tmp_path / "weights.pth")
    with pytest.raises(UsageError, match=r"not a vtools training checkpoint \(missing optimizer, rng\)$"):
        load_training_state(tmp_path / "weights.pth")
    (tmp_path / "text.pth").write_text("hello")
    with pytest.raises(UsageError, match=r"^--resume .*text\.pth: not a readable training checkpoint"):
        load_training_state(tmp_path / "text.pth")


# ---------------------------------------------------------------- checkpoint messages are whole sentences (issue 33)


def _torch_says(path: Path) -> str:
    try:
        torch.load(path, weights_only=True)
    except Exception as err:
        return str(err)
    raise AssertionError(f"torch read {path}")


def _detail(message: str) -> str:
    """The first parenthesised part of a one-line checkpoint error: torch's words."""
    start = message.index(" (") + 2
    depth = 1
    for end in range(start, len(message)):
        depth += {"(": 1, ")": -1}.get(message[end], 0)
        if depth == 0:
            return message[start:end]
    raise AssertionError(f"no closed parenthesis in {message}")


def _ends_where_a_sentence_ends(detail: str, torch_text: str) -> None:
    """``detail`` is torch's own words up to the end of one of its sentences, never cut inside one."""
    line = next(line for line in torch_text.splitlines() if detail.rstrip(".") in line)
    after = line[line.index(detail.rstrip(".")) + len(detail.rstrip(".")) :]
    assert after == "" or after[0] in ".!?", (detail, after[:40])


@pytest.mark.cpu_only(reason="reading files is host-side")
def test_checkpoint_errors_quote_torch_in_whole_sentences(tmp_path: Path) -> None:
    """torch's errors run to paragraphs (a refused global comes with two paragraphs of advice; a cut
    archive with three sentences of guesses): a one-line error keeps whole sentences of them, never a
    fixed-width cut, and --resume names the file once."""
    import datetime

    from vtools.models.weights import read_checkpoint

    state = {"state_dict": {"w": torch.ones(3)}, "optimizer": {}, "epoch": 0, "rng": {}}
    torch.save(state, tmp_path / "whole.pth")
    data = (tmp_path / "whole.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2])
    torch.save({**state, "when": datetime.date(2026, 1, 1)}, tmp_path / "dated.pth")
    for name, kind in (("cut.pth", "not a readable"), ("dated.pth", "was refused: loading it would run code")):
        path = tmp_path / name
        for read in (load_training_state, read_checkpoint):
            with pytest.raises(UsageError) as failed:
                read(path)
            message = str(failed.value)
            assert kind in message and message.count(str(path)) == 1, message
            _ends_where_a_sentence_ends(_detail(message), _torch_says(path))
            assert len(message) < 400, message


@pytest.mark.cpu_only(reason="reading files is host-side")
def test_a_file_in_no_format_of_torch_save_is_said_so(tmp_path: Path) -> None:
    """Text or random bytes: torch's own words are about an internal step (``101``, ``Unsupported operand
    67``); the message says what the file is not instead."""
    (tmp_path / "notes.pth").write_text("hello world\n" * 4)
    (tmp_path / "noise.pth").write_bytes(bytes(range(7, 256, 3)))
    for name in ("notes.pth", "noise.pth"):
        with pytest.raises(UsageError, match=r"\(it is in neither of the formats torch.save writes: a zip archive"):
            load_training_state(tmp_path / name)


def test_whole_sentences_keeps_the_first_however_long() -> None:
    from vtools.models.weights import whole_sentences

    assert whole_sentences("One. Two two. Three three three.", limit=14) == "One. Two two."
    long = "a " * 200 + "end."
    assert whole_sentences(f"\x1b[1m{long}\x1b[0m Next.\nsecond line") == long


# ---------------------------------------------------------------- the learning rate


@pytest.mark.parametrize(
    "flags, global_batch, expected",
    [
        (["--lr", "0.3"], 4096, 0.3),  # --lr wins
        (["--lr-base", "0.1", "--lr-base-size", "256"], 1024, 0.4),  # linear for sgd
        (["--lr-base", "0.1", "--opt", "adamw"], 1024, 0.2),  # sqrt for adaptive optimizers
        (["--lr-base", "0.1", "--opt", "lamb"], 64, 0.05),
        (["--lr-base", "0.1", "--opt", "adamw", "--lr-base-scale", "linear"], 1024, 0.4),
        (["--lr-base", "0.1", "--lr-base-scale", "sqrt"], 1024, 0.2),
    ],
)
def test_the_learning_rate_scales_with_the_global_batch_as_timms(
    flags: list[str], global_batch: int, expected: float
) -> None:
    """timm's train.py rule: without --lr, --lr-base x (global batch / --lr-base-size), square-rooted for
    optimizers whose name holds "ada" or "lamb" unless --lr-base-scale says."""
    args = build_parser().parse_args(["--model", "mlp", *flags])
    assert recipe.scaled_lr(typed_options(TrainJob, args).optim, global_batch) == pytest.approx(expected)


def test_the_logged_rate_is_the_mean_over_parameter_groups() -> None:
    weight, bias = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([{"params": [weight], "lr": 0.1}, {"params": [bias], "lr": 0.4}], lr=1.0)
    assert recipe.mean_lr(optimizer) == pytest.approx(0.25)


def test_components_without_schedule_scaler_or_ema_resume_the_rest(device: torch.device, tmp_path: Path) -> None:
    """A run resumed without --model-ema, fp16 or a schedule: the weights and position resume, the parts
    the new command line has no use for are left out; a checkpoint of another model stops in one line."""
    args = _args("--model-ema")
    run = _components(device, args, seed=0)
    saved = _save_and_read(training_state(vars(args), run, Position(1, 0, 4), [], device, DistInfo(), {}), tmp_path)
    bare = _components(device, _args(), seed=1)
    bare.scheduler = bare.scaler = None
    assert bare.ema is None
    position, _ = restore(saved, bare, CheckpointManager(tmp_path), device, DistInfo(), 0, BATCH)
    assert position == Position(1, 0, 4) and _same(bare.model, run.model)
    assert training_state(vars(args), bare, position, [], device, DistInfo(), {})["scaler"] is None
    other = _components(device, _args(), seed=0)
    other.model = torch.nn.Linear(FEATURES, CLASSES).to(device)
    with pytest.raises(UsageError, match="^checkpoint --resume does not fit the model: missing: weight, bias;"):
        restore(saved, other, CheckpointManager(tmp_path), device, DistInfo(), 0, BATCH)


@pytest.mark.cpu_only(reason="reading files is host-side")
def test_a_checkpoint_that_would_run_code_is_refused(tmp_path: Path) -> None:
    torch.save({"state_dict": {}, "optimizer": {}, "epoch": 0, "rng": Position()}, tmp_path / "code.pth")
    with pytest.raises(UsageError) as refused:
        load_training_state(tmp_path / "code.pth")
    assert str(refused.value).startswith(f"--resume checkpoint {tmp_path / 'code.pth'} was refused: loading it")


@pytest.mark.filterwarnings("ignore:PlateauLRScheduler is deprecated")
@pytest.mark.parametrize("eval_metric", ["top1", "loss"])
def test_a_plateau_schedule_reads_the_metric_the_run_chose(device: torch.device, eval_metric: str) -> None:
    """Falling figures are progress for --eval-metric loss and a plateau for top-1 (timm's decreasing_metric):
    with patience 1, only the top-1 run lowers its rate."""
    args = _args("--sched", "plateau", "--patience-epochs", "1", "--decay-rate", "0.5", "--warmup-epochs", "0")
    args.eval_metric = eval_metric
    parts = _components(device, args, seed=0)
    for epoch, metric in enumerate([5.0, 4.0, 3.0, 2.0]):
        parts.scheduler.step(epoch + 1, metric)
    assert recipe.mean_lr(parts.optimizer) == pytest.approx(0.05 if eval_metric == "loss" else 0.05 * 0.5)


def test_an_unknown_schedule_stops_in_one_line() -> None:
    args = _args("--sched", "zigzag")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.raises(UsageError, match=r"^--sched zigzag: .+"):
        recipe.build_scheduler(optimizer, typed_options(TrainJob, args).optim, 4, "top1", 42)


# the options a resumed run could change before the flags declared it (the hand-kept list this replaced)
CHANGEABLE_BEFORE_TAGS = frozenset(
    "config resume output experiment data data_dir dataset_download workers threads bind_cores device "
    "device_modules dist_backend profile log_interval log_tensorboard checkpoint_hist val_interval "
    "validation_batch_size on_bad_image channels_last torchcompile pretrained initial_checkpoint epochs "
    "batch_size torchcompile_mode pretrained_path no_resume_opt start_epoch synchronize_step grad_checkpointing "
    "pin_mem no_prefetcher use_multi_epochs_loader local_rank".split()
) | {"recovery_interval", "recovery_keep", "dist_timeout"}  # added with recovery checkpoints (issue 35)
CHANGEABLE_BEFORE_TAGS |= set(TRACKER_DESTS)  # where figures are sent (issue 37)
CHANGEABLE_BEFORE_TAGS |= {"early_stop_patience", "early_stop_min_delta"}  # a resume may extend the patience
CHANGEABLE_BEFORE_TAGS |= {"threshold"}  # where multi-label predictions are counted: figures, not training


def test_the_flags_declare_what_a_resume_may_change() -> None:
    assert resume_changeable(build_parser()) == CHANGEABLE_BEFORE_TAGS


def test_a_resume_names_the_options_it_changes_but_the_declared_ones() -> None:
    saved_args = vars(_args())
    state = {"args": saved_args, "world_size": 1, "class_names": ["a"], "train_samples": 8}
    changeable = resume_changeable(build_parser())
    now = SavedOptions({**saved_args, "lr": 0.5, "output": "elsewhere", "epochs": 9}, changeable)
    assert experiment_changes(state, now, ["a"], 8, 1) == ["--lr 0.05 -> 0.5"]
    doubled = SavedOptions({**saved_args, "batch_size": BATCH * 2}, changeable)
    assert experiment_changes(state, doubled, ["a"], 8, 1) == [
        f"global batch (--batch-size x processes) {BATCH} x 1 -> {BATCH * 2} x 1"
    ]
    halved = SavedOptions({**saved_args, "batch_size": BATCH // 2}, changeable)
    assert experiment_changes(state, halved, ["a"], 8, 2) == []  # half the batch on twice the processes
    accumulating = SavedOptions({**saved_args, "grad_accum_steps": 2}, changeable)
    assert experiment_changes(state, accumulating, ["a"], 8, 1) == [
        f"global batch (--batch-size x processes x --grad-accum-steps) {BATCH} x 1 x 1 -> {BATCH} x 1 x 2"
    ]
    assert experiment_changes(state, accumulating, ["a"], 8, 1, batch_may_change=True) == []  # elastic: said
    halved_accumulating = SavedOptions({**saved_args, "batch_size": BATCH // 2, "grad_accum_steps": 2}, changeable)
    assert experiment_changes(state, halved_accumulating, ["a"], 8, 1) == []  # the same global batch
    undeclared = SavedOptions(now.values, changeable - {"output"})
    assert experiment_changes(state, undeclared, ["a"], 8, 1) == ["--lr 0.05 -> 0.5", "--output (none) -> elsewhere"]


def test_the_run_begins_where_the_checkpoint_or_start_epoch_says_and_says_so(
    device: torch.device, tmp_path: Path
) -> None:
    """resume_position: train.py's options reach restore() (this process's batch, --no-resume-opt, the seed a
    changed process count re-seeds with), the line says where the run continues and how many updates the
    process before had trained past it, and --start-epoch begins a run at the schedule of that epoch."""
    args = _args()
    run = _components(device, args, seed=0)
    result, updates = train_one_epoch(run, _batches(device, 0)[:3], 0, 0, show_progress=False)
    state = training_state(vars(args), run, Position(0, 3, updates), [], device, DistInfo(), {}, result)
    saved = _save_and_read(state, tmp_path)
    folder = RunFolder(tmp_path, tmp_path / LAST)
    ProgressMark(tmp_path).write(0, 4, 4)  # the killed process had logged update 4
    loaders = SimpleNamespace(updates_per_epoch=lambda accum: -(-STEPS // accum))
    said: list[str] = []

    def begin(flags: list[str], saved_state: dict | None, dist_info: DistInfo | None = None):
        job = typed_options(TrainJob, _args(*flags))
        parts = _components(device, _args(*flags), seed=1)
        manager = CheckpointManager(tmp_path / "resumed")
        ranks = dist_info or DistInfo()
        return resume_position(job, saved_state, folder, parts, manager, loaders, ranks, said.append), parts

    position, parts = begin(["--batch-size", "2"], saved)
    assert (position.epoch, position.step, position.num_updates, position.samples_before) == (0, 6, 3, 12)
    assert _same(parts.model, run.model) and parts.optimizer.state_dict()["state"] != {}
    assert said == [
        f"resumed from {tmp_path / LAST} at epoch 0, step 6; the process before had reached update 4 at its "
        "last log step: 1 update(s) are trained again"
    ]
    _, parts = begin(["--no-resume-opt"], saved)
    assert _same(parts.model, run.model) and parts.optimizer.state_dict()["state"] == {}
    begin(["--seed", "7"], saved, DistInfo(1, 2))
    drawn = torch.rand(2)
    assert said[-1].endswith(
        "re-seeded, so the run will not repeat an uninterrupted one exactly); the process before had "
        "reached update 4 at its last log step: 1 update(s) are trained again"
    )  # both notes
    torch.manual_seed(7 + 1)  # another process count: rank 1 re-seeds with the run's seed + its rank
    assert torch.equal(drawn, torch.rand(2))
    said.clear()
    assert begin([], None)[0] == Position() and said == []
    for on_updates in ([], ["--sched-on-updates"]):
        flags = ["--start-epoch", "3", "--grad-accum-steps", "2", *on_updates]
        position, parts = begin(flags, None)
        assert position == Position(3, 0, 3 * 2)  # two updates per epoch of 4 batches
        reached = _components(device, _args(*flags), seed=1)
        start_at_epoch(reached, 3, 2, bool(on_updates))
        assert recipe.mean_lr(parts.optimizer) == recipe.mean_lr(reached.optimizer)


def test_a_resumed_optimizer_keeps_this_runs_implementation_flags() -> None:
    """A checkpoint from a device whose optimizer took the fused step resumes on one that takes the
    per-tensor step (and back): the state is the checkpoint's, the implementation this run's."""
    weights = [torch.nn.Parameter(torch.ones(3))]
    saved = torch.optim.SGD(weights, lr=0.1, momentum=0.9, foreach=True)
    weights[0].grad = torch.ones(3)
    saved.step()
    here = torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.5, momentum=0.9, foreach=False)
    recipe.load_optimizer_state(here, saved.state_dict())
    assert here.param_groups[0]["foreach"] is False and here.param_groups[0]["lr"] == 0.1
    assert torch.equal(next(iter(here.state.values()))["momentum_buffer"], torch.ones(3))


def test_a_run_saved_before_the_options_were_declared_resumes_unchanged(tmp_path: Path) -> None:
    """A run folder made before every option was declared once (issue 61) holds train.py's options as that
    version parsed them (tests/data/train_args_before_61.json, recorded from it): today the same command line
    parses to the same values, its config.yaml trains again with -c, the same options may change on resume,
    and the resume comparison finds nothing changed."""
    import json

    from tests.conftest import REPO
    from vtools.cli.config import dump_config
    from vtools.cli.train_flags import build_parser, parse, typed

    recorded = json.loads((REPO / "tests" / "data" / "train_args_before_61.json").read_text(encoding="utf-8"))
    job = typed(parse(recorded["argv"]))
    now = job.values()  # the job alone carries the options: checkpoints, config.yaml and the trackers read it
    assert now == recorded["args"]
    may_change = SavedOptions.of(job).may_change  # from the declarations, no parser
    assert sorted(may_change) == recorded["may_change"] == sorted(resume_changeable(build_parser()))
    config = tmp_path / "config.yaml"
    config.write_text(dump_config(recorded["args"]), encoding="utf-8")
    again = typed(parse(["-c", str(config)])).values()
    assert {key: again[key] for key in now if key not in ("config", "data")} == {
        key: value for key, value in now.items() if key not in ("config", "data")
    }
    state = {"args": recorded["args"], "world_size": 1}
    assert experiment_changes(state, SavedOptions(now, may_change), [], 0, 1) == []

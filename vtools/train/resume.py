"""What a training checkpoint holds, where a run continues, and how every rank picks up its own state.

A run is resumable at any update boundary: the checkpoint holds the shared
state (model, optimizer, scheduler, GradScaler, EMA, position in the epoch)
once, and each rank's own state (its RNG streams, its share of the epoch's
training loss) once per rank. Ranks are seeded ``seed + rank``, so restoring
rank 0's generators on every rank would give all of them the same dropout,
mixup and erasing draws; instead each rank restores the entry saved for it.
"""

from __future__ import annotations

import math
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vtools.atomic import atomic_write
from vtools.errors import UsageError
from vtools.models.prepare import unwrap
from vtools.models.weights import check_state_dict_fits
from vtools.options.train_job import RunOptions, TrainJob, resume_changeable
from vtools.outputs import Output, check_apart, prove_writable, run_folder_of
from vtools.results import read_number_table
from vtools.runtime import device as dev
from vtools.runtime.distributed import DistInfo, broadcast_from_main, gather_objects
from vtools.train.checkpoint import (
    BEST,
    LAST,
    NUMBERED,
    CheckpointManager,
    native_rng,
    portable_rng,
    recovery_files,
)
from vtools.train.loop import EpochResult, TrainComponents
from vtools.train.recipe import load_optimizer_state
from vtools.train.run_lock import holds_ended_run, reserve_new_folder

STATE_VERSION = 2


@dataclass(frozen=True)
class Position:
    """Where a resumed run continues, and this rank's share of the interrupted epoch's loss."""

    epoch: int = 0
    step: int = 0
    num_updates: int = 0
    carried: tuple[float, int] = (0.0, 0)
    samples_before: int = 0  # the epoch's samples every process trained before the checkpoint


@dataclass(frozen=True)
class RunFolder:
    """The folder a run writes to, the checkpoint it resumes (if any) and what to tell the user."""

    path: Path
    resume: Path | None
    note: str = ""
    made: bool = False  # this run created the folder


@dataclass(frozen=True)
class SavedOptions:
    """Every option of the run as its checkpoints store them: a plain dict, the file format of timm's
    ``args`` (a resume compares it, validate.py --checkpoint reads it), and the names a resumed run may
    change, as their declarations mark them (``resume=True``)."""

    values: Mapping[str, Any]
    may_change: frozenset[str]

    @classmethod
    def of(cls, job: TrainJob) -> SavedOptions:
        """The job's options, as its checkpoints store them."""
        return cls(job.values(), resume_changeable())


def _model_stem(model: str) -> str:
    return Path(model.rstrip("/")).name.replace(":", "_")


def choose_run_folder(run: RunOptions, model: str, data_dir: str | None, dist_info: DistInfo) -> RunFolder:
    """Decide the run folder on rank 0 and share it, so that every rank resumes the same checkpoint.

    ``--resume auto`` continues ``--output/--experiment`` when a name is given;
    without one, it continues the newest run of the same model in ``--output``
    (the folders are named ``<model>-<timestamp>``), so re-queuing the same
    command carries on instead of starting again.
    """
    choice = _choose_run_folder(run, model, data_dir) if dist_info.is_main else None
    return broadcast_from_main(choice)


def check_output(output: Path, experiment: str, data: str | None) -> None:
    """--output must be (or become) a writable folder outside the data, and --experiment a folder name in
    it: said in one line before any run folder is chosen or made."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} is a file, not a folder")
    enclosing = run_folder_of(output)
    if enclosing is not None:  # the run folders of --output would nest inside that run's files
        raise UsageError(
            f"--output {output} is inside the run folder {enclosing}: --output is the parent of run folders, "
            f"which stand side by side (--output {enclosing.parent})"
        )
    folders = [Output("--output", output, files=())]
    if experiment:
        folders.append(Output(f"--experiment {experiment}:", output / experiment, files=()))
    check_apart([("the data folder", data)], folders)  # a run folder in a split would be read as a class
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--output {output}: cannot create it ({err.strerror or err})") from err
    prove_writable(folders[0])  # os.access says yes to root even where nothing can be made (/proc)
    if experiment and (output / experiment).exists() and not (output / experiment).is_dir():
        raise UsageError(f"--experiment {experiment}: {output / experiment} is a file, not a run folder")


DEFAULT_OUTPUT = "runs"  # --output '' (timm's default spelling) means this


def _choose_run_folder(run: RunOptions, model: str, data_dir: str | None) -> RunFolder:
    output, stem = Path(run.output or DEFAULT_OUTPUT), _model_stem(model)
    check_output(output, run.experiment, data_dir)
    named = output / run.experiment if run.experiment else None
    if run.resume and run.resume != "auto":
        if named is not None:
            return RunFolder(named, Path(run.resume))
        return RunFolder(_new_folder(output, stem), Path(run.resume), made=True)
    if run.resume != "auto":
        if named is not None and holds_ended_run(named):
            fresh = reserve_new_folder(output, run.experiment)
            return RunFolder(fresh, None, earlier_run_note(named, fresh), made=True)
        return RunFolder(named, None) if named is not None else RunFolder(_new_folder(output, stem), None, made=True)
    if named is not None:
        if has_checkpoint(named):
            return _continue(named, "")
        return RunFolder(named, None, f"--resume auto: no checkpoint in {named} yet, starting from scratch")
    earlier = [folder for folder in output.glob(f"{stem}-*") if has_checkpoint(folder)] if output.is_dir() else []
    if not earlier:
        folder = _new_folder(output, stem)
        return RunFolder(
            folder,
            None,
            f"--resume auto: no earlier run of {model} with a checkpoint in "
            f"{output}, starting from scratch in {folder}",
            made=True,
        )
    newest = max(earlier, key=lambda folder: max(path.stat().st_mtime for path in resumable(folder)))
    note = f"--resume auto: continuing {newest}, the newest run of {model} in {output}"
    if len(earlier) > 1:
        note += f" ({len(earlier)} have checkpoints; name one with --experiment)"
    return _continue(newest, note)


def earlier_run_note(folder: Path, fresh: Path) -> str:
    """What a new run says of an ended run's folder that it leaves alone for ``fresh``: --resume auto is
    offered only where there is a checkpoint to continue (a run killed before its first one left none)."""
    if has_checkpoint(folder):
        return (
            f"{folder} holds an earlier run, left as it is: this run writes to {fresh} "
            "(--resume auto would continue the earlier one)"
        )
    return (
        f"{folder} holds files of an earlier run that saved no checkpoint, left as they are: this run writes to "
        f"{fresh} (there is nothing to continue there)"
    )


def resumable(folder: Path) -> list[Path]:
    """The checkpoints ``--resume auto`` may continue a run folder from: last.pth.tar and the recovery
    checkpoints (the numbered ones only stand in for a damaged last)."""
    return [path for path in (folder / LAST, *recovery_files(folder)) if path.is_file()]


def has_checkpoint(folder: Path) -> bool:
    return bool(resumable(folder))


def _continue(folder: Path, note: str) -> RunFolder:
    """Resume ``folder`` from its newest intact checkpoint: last.pth.tar or a recovery checkpoint written
    after it (by modification time: each is renamed into place once whole, one at a time); when none of
    them is intact, from the newest intact numbered checkpoint (saying so)."""
    candidates = resumable(folder)
    intact = [path for path in candidates if is_intact(path)]
    if intact:
        newest = max(intact, key=lambda path: path.stat().st_mtime_ns)
        if len(intact) < len(candidates):
            damaged = ", ".join(path.name for path in candidates if path not in intact)
            skipped = f"--resume auto: skipping the damaged {damaged}; continuing from {newest.name}"
            note = f"{note}; {skipped}" if note else skipped
        return RunFolder(folder, newest, note)
    numbered = sorted(
        ((int(m.group(1)), path) for path in folder.glob("checkpoint-*.pth.tar") if (m := NUMBERED.match(path.name))),
        reverse=True,
    )
    for _, path in numbered:
        if is_intact(path):
            fallback = f"--resume auto: {folder / LAST} is damaged; continuing from {path.name}"
            return RunFolder(folder, path, f"{note}; {fallback}" if note else fallback)
    return RunFolder(folder, candidates[0] if candidates else folder / LAST, note)  # loading it names the damage


def is_intact(path: Path) -> bool:
    """Whether a checkpoint's archive opens (a truncated or overwritten file does not): cheap, it reads
    only the archive's directory."""
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _new_folder(output: Path, stem: str) -> Path:
    return reserve_new_folder(output, f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")


def rank_state(device: torch.device, result: EpochResult | None = None) -> dict[str, Any]:
    """This rank's own part of a checkpoint: RNG streams and, mid-epoch, its share of the epoch's loss."""
    state: dict[str, Any] = {"rng": portable_rng(dev.rng_state(device))}
    if result is not None:
        state["train_loss_sum"], state["train_samples"] = result.local_loss_sum, result.local_samples
    return state


_PLATEAU_KEY = "reduce_on_plateau"


def scheduler_state(scheduler: Any) -> dict[str, Any] | None:
    """timm's scheduler state, plus the counters of the torch ReduceLROnPlateau inside timm's plateau
    schedule, which timm's own state leaves out (a resumed plateau run would restart its patience)."""
    if scheduler is None:
        return None
    state = scheduler.state_dict()
    inner = getattr(scheduler, "lr_scheduler", None)
    if inner is not None:
        state[_PLATEAU_KEY] = inner.state_dict()
    return state


def load_scheduler_state(scheduler: Any, state: dict[str, Any]) -> None:
    state = dict(state)
    inner_state = state.pop(_PLATEAU_KEY, None)
    scheduler.load_state_dict(state)
    if inner_state is not None:
        scheduler.lr_scheduler.load_state_dict(inner_state)


def training_state(
    options: Mapping[str, Any],
    parts: TrainComponents,
    position: Position,
    classes: list[str],
    device: torch.device,
    dist_info: DistInfo,
    data_config: dict[str, Any],
    result: EpochResult | None = None,
    train_samples: int | None = None,
) -> dict[str, Any] | None:
    """Everything ``--resume`` needs (on rank 0; None elsewhere). Every rank must call it: the ranks'
    own states are gathered here. ``position`` is where training continues. ``data_config`` (the
    run's preprocessing) lets validate.py --checkpoint evaluate the weights as the run did; ``options``
    (every option, as :class:`SavedOptions` holds them) is stored as timm stores its args."""
    ranks = gather_objects(rank_state(device, result))
    if not dist_info.is_main:
        return None
    state = {
        "arch": options["model"],
        "epoch": position.epoch,
        "step_in_epoch": position.step,
        # the position again in samples of the whole epoch order: a resume with another per-process batch
        # size or process count (the same global batch) continues at the same sample
        "samples_in_epoch": position.step * options["batch_size"] * dist_info.world_size,
        "world_size": dist_info.world_size,
        "num_updates": position.num_updates,
        "state_dict": unwrap(parts.model).state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": scheduler_state(parts.scheduler),
        "scaler": parts.scaler.state_dict() if parts.scaler is not None else None,
        "rng": ranks[0]["rng"],
        "rank_states": ranks,
        "class_names": classes,
        "train_samples": train_samples,
        "data_config": dict(data_config),
        "args": dict(options),
        "version": STATE_VERSION,
    }
    if parts.ema is not None:
        state["state_dict_ema"] = parts.ema.module.state_dict()
    return state


def start_at_epoch(parts: TrainComponents, epoch: int, updates_per_epoch: int, on_updates: bool) -> Position:
    """--start-epoch: begin at ``epoch`` with the schedule (and the update count) already there, as timm's
    train.py steps its scheduler to the start epoch."""
    num_updates = epoch * updates_per_epoch
    if parts.scheduler is not None and epoch > 0:
        if on_updates:
            parts.scheduler.step_update(num_updates)
        else:
            parts.scheduler.step(epoch)
    return Position(epoch, 0, num_updates)


def restore(
    state: dict[str, Any],
    parts: TrainComponents,
    manager: CheckpointManager,
    device: torch.device,
    dist_info: DistInfo,
    seed: int,
    batch_size: int,
    resume_optimizer: bool = True,
) -> tuple[Position, str]:
    """Load a training checkpoint into the components and this rank's RNG; returns where to continue
    and a note for the user when the number of processes changed. Without ``resume_optimizer``
    (--no-resume-opt) the optimizer and GradScaler start afresh, as in timm."""
    check_state_dict_fits(parts.model, state["state_dict"], "--resume")
    parts.model.load_state_dict(state["state_dict"])
    if resume_optimizer:
        load_optimizer_state(parts.optimizer, state["optimizer"])
    else:  # a fresh optimizer, at the rate the schedule had reached (not its warmup's first)
        for group, saved in zip(parts.optimizer.param_groups, state["optimizer"]["param_groups"]):
            group["lr"] = saved["lr"]
    if parts.scheduler is not None and state.get("scheduler") is not None:
        load_scheduler_state(parts.scheduler, state["scheduler"])
    if resume_optimizer and parts.scaler is not None and state.get("scaler") is not None:
        parts.scaler.load_state_dict(state["scaler"])
    if parts.ema is not None and "state_dict_ema" in state:
        parts.ema.module.load_state_dict(state["state_dict_ema"])
    manager.best_metric, manager.best_epoch = state.get("best_metric"), state.get("best_epoch")
    ranks = state.get("rank_states") or [{"rng": state["rng"]}]
    note = ""
    if len(ranks) == dist_info.world_size:
        mine = ranks[dist_info.rank]
        dev.set_rng_state(device, native_rng(mine["rng"]))
    else:  # another process count: the shards differ anyway, so only the shared state carries over
        mine = {}
        dev.seed_everything(seed + dist_info.rank)
        note = (
            f" (saved by {len(ranks)} process(es), resumed by {dist_info.world_size}: random streams "
            "re-seeded, so the run will not repeat an uninterrupted one exactly)"
        )
    per_step = batch_size * dist_info.world_size
    step = int(state["samples_in_epoch"]) // per_step if "samples_in_epoch" in state else int(state["step_in_epoch"])
    carried = (float(mine.get("train_loss_sum", 0.0)), int(mine.get("train_samples", 0))) if step else (0.0, 0)
    before = int(state.get("samples_in_epoch", step * per_step))
    position = Position(int(state["epoch"]), step, int(state.get("num_updates", 0)), carried, before)
    return position, note


GLOBAL_BATCH_PARTS = frozenset({"grad_accum_steps"})  # compared as a factor of the global batch


def experiment_changes(
    state: dict[str, Any],
    options: SavedOptions,
    classes: list[str],
    train_samples: int,
    world_size: int,
    batch_may_change: bool = False,
) -> list[str]:
    """What this command line changes in the experiment a checkpoint continues: options (but those the flags
    declare changeable: where things go, how fast they run, how much is logged; --epochs, which is noted;
    --batch-size and --grad-accum-steps when the global batch stays the same, the position being kept in
    samples), the global batch (unless ``batch_may_change``: an elastic restart says it instead), the class
    names and the training set's size. Empty when the resume continues the same run."""
    saved, now = state.get("args") or {}, options.values
    changes = [
        f"--{key.replace('_', '-')} {_shown(value)} -> {_shown(now[key])}"
        for key, value in sorted(saved.items())
        if key not in options.may_change | GLOBAL_BATCH_PARTS and key in now and _plain(now[key]) != _plain(value)
    ]
    if "batch_size" in saved and "world_size" in state and not batch_may_change:
        layouts = [
            (saved["batch_size"], state["world_size"], saved.get("grad_accum_steps", 1)),
            (now["batch_size"], world_size, now.get("grad_accum_steps", 1)),
        ]
        if math.prod(layouts[0]) != math.prod(layouts[1]):
            accumulates = any(layout[2] != 1 for layout in layouts)
            shown = [" x ".join(map(str, layout if accumulates else layout[:2])) for layout in layouts]
            parts = "--batch-size x processes" + (" x --grad-accum-steps" if accumulates else "")
            changes.append(f"global batch ({parts}) {shown[0]} -> {shown[1]}")
    saved_classes = state.get("class_names")
    if saved_classes and list(saved_classes) != list(classes):
        differ = [f"{a} -> {b}" for a, b in zip(saved_classes, classes) if a != b][:3]
        detail = ", ".join(differ) if differ else f"{len(saved_classes)} -> {len(classes)} classes"
        changes.append(f"class names ({detail})")
    if state.get("train_samples") not in (None, train_samples):
        changes.append(f"training images {state['train_samples']} -> {train_samples}")
    return changes


def global_batch(state: dict[str, Any]) -> int | None:
    """The global batch a checkpoint was trained with (per-process batch x processes x accumulation)."""
    saved = state.get("args") or {}
    if "batch_size" not in saved or "world_size" not in state:
        return None
    return int(saved["batch_size"]) * int(state["world_size"]) * int(saved.get("grad_accum_steps") or 1)


def accumulation_keeping(state: dict[str, Any], batch_size: int, world_size: int, accum: int) -> int | None:
    """The --grad-accum-steps with which ``world_size`` processes of ``batch_size`` keep the checkpoint's
    global batch; None when it is kept already or no whole number of steps keeps it."""
    before = global_batch(state)
    per_update = batch_size * world_size
    if before is None or before == per_update * accum or before % per_update:
        return None
    return before // per_update


def _plain(value: Any) -> Any:
    """A value as YAML and argparse may both give it (tuples and lists alike, 1 and 1.0 alike)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return "(none)" if value in (None, "") else str(value)


def carry_best_checkpoint(resume_path: Path | None, manager: CheckpointManager) -> None:
    """Resuming into a new folder: bring the run's best checkpoint along, since the best metric comes too."""
    target = manager.folder / BEST
    if resume_path is None or target.exists() or not (resume_path.parent / BEST).is_file():
        return
    payload = (resume_path.parent / BEST).read_bytes()
    manager.on_write(target)
    atomic_write(target, lambda stream: stream.write(payload))


def read_summary(out_dir: Path, resume_path: Path | None, before_epoch: int) -> list[dict[str, Any]]:
    """The rows of summary.csv a resumed run keeps: its own folder's, or (resuming into a new folder) those
    beside the checkpoint it continues, for the epochs before the one it continues."""
    path = out_dir / "summary.csv"
    if not path.is_file() and resume_path is not None:
        path = resume_path.parent / "summary.csv"
    if resume_path is None or not path.is_file():
        return []
    try:
        return [row for row in read_number_table(path, first="epoch") if int(row["epoch"]) < before_epoch]
    except UsageError as err:
        problem = str(err).removeprefix(f"{path} ").removeprefix(": ")
        raise UsageError(
            f"{path} is damaged ({problem}); repair it, or move it away to resume without the earlier epochs' rows"
        ) from err

"""ImageNet-style training of timm models from a YAML run file, on any device.

Examples:
  python train.py -c configs/fashion_mnist_cpu.yaml
  python train.py -c configs/resnet50_a3_imagenet.yaml --data-dir /data/imagenet --device npu --amp
  torchrun --nproc-per-node 8 train.py -c configs/resnet50_a3_imagenet.yaml --data-dir /data/imagenet --device npu

Options come from the defaults, then the YAML file (-c), then the command line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vtools.cli.config import dump_config
from vtools.errors import EXIT_STREAM_LOST, UsageError
from vtools.evaluation.best_epoch import metric_text
from vtools.evaluation.loops import EvalResult
from vtools.evaluation.report_files import CONFUSION, OVERALL
from vtools.models.create import weights_description
from vtools.observe.curves import plot_runs, read_summary_rows
from vtools.observe.data_wait import DataWaitVerdict
from vtools.observe.fallback import CSV_NAME, FallbackWatch
from vtools.observe.figures import pyplot
from vtools.observe.profiling import StepProfiler
from vtools.observe.report_plots import draw_report_or_why_not
from vtools.observe.run_trackers import training_trackers
from vtools.observe.tracking import TRACKING_FILE, Trackers
from vtools.observe.wandb_tracker import WANDB_FOLDER
from vtools.options.train_job import TrainJob
from vtools.run_events import LogPoint, RunEnd
from vtools.runtime import device as dev
from vtools.runtime.device_cards import device_label
from vtools.runtime.distributed import DistInfo, barrier, check_collective_timeout, init_distributed, shutdown
from vtools.runtime.heartbeat import rank_heartbeat, report_progress
from vtools.runtime.resolve import Runtime, setup_runtime
from vtools.train import recipe
from vtools.train.checkpoint import BEST, LAST, recovery_files
from vtools.train.loop import EpochResult, StopRequest, exit_code
from vtools.train.resume import RunFolder, choose_run_folder
from vtools.train.run import Say, TrainingRun, set_up, stop_check_every
from vtools.train.run_clock import RunClock, clock_text
from vtools.train.run_files import CONFIG_NAMES, EVAL_DIR, MODEL_DIR, SUMMARY, TrainOutcome, write_run_config
from vtools.train.run_lock import FolderClaim, owned_folder


def run(job: TrainJob) -> int:
    """Train the job the command line gave (vtools/cli/train_flags.py parses it before torch is imported)."""
    return train_run(job).code


def train_run(job: TrainJob) -> TrainOutcome:
    """Train as ``train.py`` does with these options (printing what it prints) and say how the run ended:
    the seam the Python API calls."""
    runtime = setup_runtime(job.runtime)
    if job.distributed.sync_bn and runtime.device.type == "cpu":
        raise UsageError("--sync-bn needs an accelerator: torch's SyncBatchNorm does not run on cpu")
    device, backend = runtime.device, job.distributed.dist_backend
    if backend:
        dev.dist_backend(device, backend)  # an unavailable backend fails now, not inside torchrun
    timeout = job.distributed.dist_timeout
    check_collective_timeout(device, timeout)
    dist_info = init_distributed(device, backend, timeout)
    try:  # a rank that stops answering ends the job in one line (vtools/runtime/heartbeat.py)
        with rank_heartbeat(dist_info.rank, dist_info.world_size, timeout, device_label(device)):
            return train(job, runtime, dist_info)
    finally:
        shutdown()


def train(job: TrainJob, runtime: Runtime, dist_info: DistInfo) -> TrainOutcome:
    """Train in a run folder this run owns (rank 0 holds its lock; a failed start leaves none behind)."""
    run = choose_run_folder(job.run, job.model.model, job.data.data_dir, dist_info)
    with owned_folder(run.path, enabled=dist_info.is_main, made=run.made) as claim:
        with FallbackWatch(runtime.device.type, fatal=job.run.no_cpu_fallback) as fallbacks:
            code, last_lines, model_dir = run_training(job, run, runtime, dist_info, claim)
        if dist_info.is_main:  # every rank runs the same operators: rank 0's count stands for the run
            path = claim.folder / CSV_NAME
            claim.wrote(path, created=not path.exists())
            fallbacks.write_csv(path)
            print(fallbacks.summary(str(path)))
            for line in last_lines:
                print(line)
        summary = claim.folder / SUMMARY
        rows = read_summary_rows(summary) if dist_info.is_main and summary.is_file() else []
        return TrainOutcome(code, claim.folder, model_dir, rows)


def run_training(
    job: TrainJob, run: RunFolder, runtime: Runtime, dist_info: DistInfo, claim: FolderClaim
) -> tuple[int, list[str], Path | None]:
    """Set the run up, say how it starts, train its epochs and finish it. Returns the exit code, for a run
    that finished its final summary (printed after the fallback count), and the model folder it exported."""
    say = print if dist_info.is_main else (lambda *a, **k: None)
    training = set_up(job, run, runtime, dist_info, claim, say)
    options = config_options(job, training.settings.batch_size)
    if dist_info.is_main:
        write_run_config(dump_config(options), claim, say)
    for line in start_lines(job, runtime, training):
        say(line)
    training.start()
    watch = watch_run(job, runtime, training, say, options)
    ended = RunEnd("FAILED", {})  # what the trackers are told if the run ends by an exception
    try:
        with StopRequest(runtime.device, check_every=stop_check_every(job, dist_info)) as stop:
            code = train_epochs(training, stop, watch, say)
            if code is not None:
                ended = RunEnd("KILLED", run_figures(training))
                return code, watch.trackers.close(ended), None
            with stop.shielded():  # the run's last files are written whole, whatever signal comes now
                model_dir = finish(training, say)
            epochs = training.epochs_trained()  # in this process
            last_lines = final_summary(claim, training.clock, epochs, watch.data_wait) + recovery_lines(training)
            if stop.requested:
                say(f"{stop.signal_name} came after the last epoch: the run's files were finished first")
        ended = RunEnd("FINISHED", run_figures(training), model_dir, report_dir(claim))
        early = [training.stopped_early] if training.stopped_early else []  # the run's last line says why
        return 0, last_lines + watch.trackers.close(ended) + early, model_dir
    finally:
        if ended.status == "FAILED":
            for line in watch.trackers.close(ended):
                say(line)


def config_options(job: TrainJob, batch_size: int) -> dict[str, Any]:
    """The job's options with the batch size the run trains with (fitted to a tiny set): config.yaml's
    values (``train.py -c config.yaml`` repeats the run), the trackers' config and params."""
    return {**job.values(), "batch_size": batch_size}


def run_figures(training: TrainingRun) -> dict[str, float | int | str]:
    """The run's end summary for the trackers: its best epoch and how long it took."""
    figures: dict[str, float | int | str] = {
        "epochs": len(training.summary_rows),
        "seconds": round(training.clock.elapsed, 2),
    }
    if training.manager.best_epoch is not None:
        figures[f"best_{training.settings.eval_metric}"] = training.manager.best_metric
        figures["best_epoch"] = training.manager.best_epoch
    return figures


def report_dir(claim: FolderClaim) -> Path | None:
    """The best epoch's class report, where the run wrote one."""
    folder = claim.folder / EVAL_DIR
    return folder if (folder / OVERALL).is_file() else None


def start_lines(job: TrainJob, runtime: Runtime, training: TrainingRun) -> list[str]:
    """What the run says before its first step: what trains where and how, and warnings about its options."""
    parts, plan = training.parts, training.plan
    world_size, lr, num_epochs = plan.world_size, plan.lr, plan.num_epochs
    lines = [
        f"training {job.model.model} on {runtime.device} ({runtime.amp.dtype_name}"
        f"{', GradScaler' if parts.scaler else ''}), {len(training.loaders.sampler.order) * world_size} train / "
        f"{len(training.loaders.val.dataset)} val images, {training.data.num_classes} classes, "
        f"{rate_text(lr, recipe.mean_lr(parts.optimizer))}, {num_epochs} epochs of {plan.updates_per_epoch} "
        f"update(s), {world_size} process(es) -> "
        f"{training.claim.folder}"
    ]
    optim = job.optim
    if not optim.warmup_prefix and optim.warmup_epochs >= num_epochs:
        lines.append(
            f"warning: --warmup-epochs {optim.warmup_epochs} is not shorter than this run's {num_epochs} epoch(s): "
            f"the rate never reaches --lr {lr:.4g} (use fewer warm-up epochs, or --warmup-prefix)"
        )
    if parts.task is not None:
        distill = job.distill
        lines.append(
            f"distilling from {distill.kd_model_name} (logit, temperature {distill.kd_temperature}, task weight "
            f"{parts.task.task_loss_weight:g}, distillation weight {parts.task.distill_loss_weight:g})"
        )
    if training.recovery is not None:
        lines.append(
            f"recovery checkpoints {training.recovery.describe()} (the newest {job.run.recovery_keep} kept): "
            "--resume auto continues from the newest"
        )
    lines += [f"amp: {runtime.amp.note}"] if runtime.amp.note else []
    lines += [f"device: {note}" for note in runtime.notes]
    defaults = training.plan.device_defaults_line(runtime.device.type)
    if defaults:
        lines.append(defaults)
    lines.append(f"cpu budget: {runtime.budget.describe()}")
    if not training.resumed:
        num_classes = training.data.num_classes
        model = job.model
        lines.append(weights_description(model.model, model.pretrained, num_classes, model.initial_checkpoint))
    return lines


@dataclass(frozen=True)
class RunWatch:
    """What watches the run from above the training layer: the trackers (TensorBoard, W&B, MLflow), the
    profiler, the data-wait advice, and the log step's line."""

    trackers: Trackers
    profiler: StepProfiler
    data_wait: DataWaitVerdict
    on_log: Callable[[LogPoint], None]


def watch_run(job: TrainJob, runtime: Runtime, training: TrainingRun, say: Say, options: dict[str, Any]) -> RunWatch:
    """The trackers and the profile on rank 0, the data-wait advice for this run's loaders, and a log step
    that goes to them and (without a progress bar) to a line with the run's ETA."""
    is_main, out_dir = training.dist_info.is_main, training.claim.folder
    device = str(runtime.device)
    trackers = training_trackers(job, options, training.claim, training.resumed, device, say, is_main)
    trackers.begin()  # before the loaders fork their workers (vtools/observe/tracking.py)
    profiler = StepProfiler(job.logging.profile, runtime.device, out_dir, "train", enabled=is_main)
    data_wait = DataWaitVerdict(training.plan.loader)

    def on_log(point: LogPoint) -> None:
        report_progress(point.epoch, point.step)  # the step a line naming a stopped rank gives
        trackers.step(point)
        line = training.clock.step_line(point)
        if line:
            say(line)

    return RunWatch(trackers, profiler, data_wait, on_log)


def train_epochs(training: TrainingRun, stop: StopRequest, watch: RunWatch, say: Say) -> int | None:
    """Train the epochs left, saying each one's figures; the exit code where a signal stopped the run,
    None once its last epoch is saved (or --early-stop-patience ends the run after an earlier one)."""
    if training.stops_early():  # resumed already out of patience: trains nothing more, as a finished run
        return None
    for epoch in training.epochs():
        result = training.train_epoch(epoch, stop, watch.profiler.wrap, watch.on_log)
        metrics, predictions = training.validate_epoch(epoch, result, stop)
        if training.stopped_within(epoch, result, metrics):
            path = training.save_interrupted(epoch, result, stop)
            if path is not None and result.lost:
                say(
                    f"{result.lost}: saved a resumable checkpoint at epoch {epoch} step {result.completed_steps} "
                    f"to {path}; continue with --resume auto once the shards can be read again"
                )
            elif path is not None:
                say(
                    f"{stop.signal_name}: saved a resumable checkpoint at epoch {epoch} step "
                    f"{result.completed_steps} to {path}; continue with --resume {path}"
                )
            barrier()  # no rank leaves (and has torchrun stop the others) before the checkpoint is whole
            return EXIT_STREAM_LOST if result.lost else exit_code(stop.signal_name)
        saved = training.save_epoch(epoch, result, metrics, predictions, stop)
        if training.dist_info.is_main:
            watch.trackers.epoch(saved.row)
            say(epoch_line(epoch, result, saved.metrics, saved.best, training.clock.since_epoch_start))
            verdict = watch.data_wait.epoch(epoch, result.data_wait, result.steps)
            if verdict:
                say(verdict)
        if training.stops_after(epoch, stop):
            say(
                f"{stop.signal_name}: stopping after epoch {epoch}, saved in {training.claim.folder / LAST}; "
                "continue with --resume auto"
            )
            return exit_code(stop.signal_name)
        if training.stops_early():
            return None
    return None


def finish(training: TrainingRun, say: Say) -> Path | None:
    """After the last epoch: curves and the class report's pictures, then the best weights as a model
    folder (its path, on rank 0)."""
    is_main, claim = training.dist_info.is_main, training.claim
    curves = draw_curves(claim) if is_main else ""  # from summary.csv, while the last checkpoint is written
    report = draw_eval_report(claim) if is_main else ""
    exported = training.finish()
    if exported is None:
        return None
    say(
        f"best {metric_text(training.settings.eval_metric, exported.best_metric)} at epoch {exported.best_epoch}; "
        f"model folder: {exported.folder}"
    )
    if exported.others:
        others = ", ".join(exported.others)
        say(f"{exported.folder} also holds {others}, which this run did not write: left as they are")
    say(curves)
    if report:
        say(report)
    return exported.folder


RUN_FILES = (  # what a finished run leaves, in the order the final summary names them
    (MODEL_DIR, f"{MODEL_DIR}/ (the best weights)"),
    (SUMMARY, SUMMARY),
    *((name, name) for name in CONFIG_NAMES),  # config.yaml, args.yaml
    ("curves.png", "curves.png"),
    (EVAL_DIR, f"{EVAL_DIR}/ (class report)"),
    (BEST, BEST),
    (LAST, LAST),
    ("tensorboard", "tensorboard/"),
    (WANDB_FOLDER, f"{WANDB_FOLDER}/ (W&B's files)"),
    (TRACKING_FILE, TRACKING_FILE),
    (CSV_NAME, CSV_NAME),
)


def final_summary(claim: FolderClaim, clock: RunClock, epochs: int, data_wait: DataWaitVerdict) -> list[str]:
    """The run's last lines: how long it took, what it wrote where, and the data-wait reminder."""
    folder = claim.folder
    names = [  # the fallback list is written after these lines are made
        text for name, text in RUN_FILES if name == CSV_NAME or (name in claim.ledger and (folder / name).exists())
    ]
    checkpoints = sorted(p.name for p in folder.glob("checkpoint-*.pth.tar") if p.name in claim.ledger)
    if checkpoints:
        names.append(f"{len(checkpoints)} epoch checkpoint(s)")
    recovery = [path.name for path in recovery_files(folder) if path.name in claim.ledger]
    if recovery:
        names.append(f"{len(recovery)} recovery checkpoint(s)")
    line = f"finished in {clock_text(clock.elapsed)} ({epochs} epoch(s) in this process); wrote to {folder}: "
    line += ", ".join(names)
    reminder = data_wait.summary()
    return [line, reminder] if reminder else [line]


def recovery_lines(training: TrainingRun) -> list[str]:
    """What the recovery checkpoints cost this process's steps (rank 0 writes them): the copy to host
    memory, and the waits for a previous write that had not reached the disk."""
    stats = training.manager.recovery
    if training.recovery is None or not training.dist_info.is_main:
        return []
    return [
        f"recovery checkpoints: {stats.count} taken ({training.recovery.describe()}); the steps spent "
        f"{stats.copy_seconds:.2f} s copying the state to host memory and {stats.wait_seconds:.2f} s waiting "
        "for the disk"
    ]


def draw_eval_report(claim: FolderClaim) -> str:
    """The pictures of ``<run>/eval``'s report, or why there are none (a multi-label report is tables only)."""
    folder = claim.folder / EVAL_DIR
    if not (folder / OVERALL).is_file():
        return ""
    if not (folder / CONFUSION).is_file():
        return f"class report: {folder} (per-class AP, precision, recall and F1)"
    missing = draw_report_or_why_not(folder, before_write=lambda path: claim.wrote(path, created=not path.exists()))
    if missing is not None:
        return f"class report: {folder} (no pictures: {missing})"
    return f"class report: {folder} (confusion.png, reliability.png)"


def rate_text(lr: float, first: float) -> str:
    """The learning rate the start line shows: the one the first epoch trains with, and the schedule's
    peak when that differs (warm-up, or a resumed run further down the schedule)."""
    if math.isclose(first, lr, rel_tol=1e-6):
        return f"lr {lr:.4g}"
    return f"lr {first:.4g} now ({lr:.4g} at its peak)"


def draw_curves(claim: FolderClaim) -> str:
    """<run>/curves.png when matplotlib is installed; otherwise say how to get it. The ledger names the file
    only once it can be drawn; one an earlier process of the run drew goes then (it stops where that
    process stopped), so the folder and the run's last line never show a picture summary.csv has left."""
    path = claim.folder / "curves.png"
    try:
        pyplot("drawing curves.png")
    except UsageError as missing:
        stale = "curves.png" in claim.ledger and path.is_file()
        if stale:
            path.unlink()
        return f"no curves.png{' (the one drawn before the resume is removed)' if stale else ''}: {missing}"
    claim.wrote(path, created=not path.exists())
    try:
        return f"curves: {plot_runs([claim.folder], path)}"
    except UsageError as unreadable:  # a summary.csv it cannot read: the run's own words for it
        return f"no curves.png: {unreadable}"


def epoch_line(epoch: int, result: EpochResult, metrics: EvalResult | None, best: bool, seconds: float) -> str:
    """The epoch's figures, its data-wait share and its duration (training, validation and saving)."""
    line = f"epoch {epoch}: train_loss {result.loss:.4f}  "
    if metrics is not None:
        line += f"eval_loss {metrics.loss:.4f}  " + (
            f"mAP {metrics.map:.2f}  F1 {metrics.f1:.2f}  "
            if metrics.multi_label
            else f"top1 {metrics.top1:.2f}  top5 {metrics.top5:.2f}  "
        )
    else:
        line += "(not validated: --val-interval)  "
    if result.steps:
        line += f"{result.images_per_second:.1f} img/s  data wait {result.data_wait:.0%}  "
    else:
        line += "(its steps were trained before the resume)  "
    line += f"{seconds:.1f} s"
    if best:
        line += "  (best)"
    if result.skipped_updates:
        line += f"  {result.skipped_updates} updates skipped by the GradScaler"
    return line

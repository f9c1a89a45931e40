"""ImageNet-style training of timm models from a YAML run file, on any device.

Examples:
  python train.py -c configs/fashion_mnist_cpu.yaml
  python train.py -c configs/resnet50_a3_imagenet.yaml --data-dir /data/imagenet --device npu --amp
  torchrun --nproc-per-node 8 train.py -c configs/resnet50_a3_imagenet.yaml --data-dir /data/imagenet --device npu

Options come from the defaults, then the YAML file (-c), then the command line.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import torch
from timm.utils import distribute_bn

from vtools.atomic import atomic_write_text
from vtools.cli.config import dump_config, parse_with_config
from vtools.cli.options import model_in_chans, timm_model_kwargs
from vtools.cli.parser import check_values
from vtools.data.readers.registry import Source
from vtools.errors import RunFailed, UsageError
from vtools.evaluation.class_report import build_report
from vtools.evaluation.loops import EvalResult, evaluate
from vtools.evaluation.predictions import PredictionLog, Predictions
from vtools.evaluation.report_files import OVERALL, write_report
from vtools.models.create import create_model, weights_description
from vtools.models.folder import export_model_folder
from vtools.models.prepare import unwrap
from vtools.models.weights import read_state_dict
from vtools.observe.curves import ScalarLog, plot_runs
from vtools.observe.data_wait import DataWaitVerdict, LoaderSetting
from vtools.observe.fallback import CSV_NAME, FallbackWatch
from vtools.observe.figures import pyplot
from vtools.observe.profiling import StepProfiler
from vtools.observe.report_plots import draw_report
from vtools.outputs import Output, prove_writable
from vtools.results import write_rows
from vtools.runtime import device as dev
from vtools.runtime.distributed import DistInfo, barrier, init_distributed, shutdown
from vtools.runtime.resolve import Runtime, setup_runtime
from vtools.train import recipe
from vtools.train.assemble import (
    Loaders,
    build_components,
    build_datasets,
    build_loaders,
    build_model,
    fit_batch_to_set,
    wrap_for_speed,
)
from vtools.train.checkpoint import BEST, LAST, CheckpointManager, load_training_state
from vtools.train.loop import (
    EpochResult,
    LogPoint,
    StopRequest,
    TrainComponents,
    exit_code,
    train_one_epoch,
)
from vtools.train.options import build_parser, check_train_args
from vtools.train.resume import (
    Position,
    RunFolder,
    carry_best_checkpoint,
    choose_run_folder,
    experiment_changes,
    read_summary,
    restore,
    start_at_epoch,
    training_state,
)
from vtools.train.run_clock import RunClock, clock_text
from vtools.train.run_lock import FolderClaim, owned_folder

CONFIG_NAMES = ("config.yaml", "args.yaml")
EVAL_DIR = "eval"  # the best epoch's class report


def main(argv: list[str] | None = None) -> int:
    args = parse_with_config(build_parser(), argv)
    check_values(args)
    runtime = setup_runtime(args)
    check_train_args(args)
    if args.sync_bn and runtime.device.type == "cpu":
        raise UsageError("--sync-bn needs an accelerator: torch's SyncBatchNorm does not run on cpu")
    device = runtime.device
    if args.dist_backend:
        dev.dist_backend(device, args.dist_backend)  # an unavailable backend fails now, not inside torchrun
    dist_info = init_distributed(device, args.dist_backend)
    try:
        return train(args, runtime, dist_info)
    finally:
        shutdown()


def train(args: argparse.Namespace, runtime: Runtime, dist_info: DistInfo) -> int:
    """Train in a run folder this run owns (rank 0 holds its lock; a failed start leaves none behind)."""
    run = choose_run_folder(args, dist_info)
    last_lines: list[str] = []  # the run's final summary, printed after the fallback count
    with owned_folder(run.path, enabled=dist_info.is_main, made=run.made) as claim:
        with FallbackWatch(runtime.device.type, fatal=args.no_cpu_fallback) as fallbacks:
            code = run_training(args, run, runtime, dist_info, claim, last_lines)
        if dist_info.is_main:  # every rank runs the same operators: rank 0's count stands for the run
            path = claim.folder / CSV_NAME
            claim.wrote(path, created=not path.exists())
            fallbacks.write_csv(path)
            print(fallbacks.summary(str(path)))
            for line in last_lines:
                print(line)
        return code


def run_training(
    args: argparse.Namespace,
    run: RunFolder,
    runtime: Runtime,
    dist_info: DistInfo,
    claim: FolderClaim,
    last_lines: list[str],
) -> int:
    """Train; a run that finishes appends its final summary to ``last_lines``."""
    say = print if dist_info.is_main else (lambda *a, **k: None)
    device, amp = runtime.device, runtime.amp
    out_dir = run.path
    resume_state = load_training_state(run.resume) if run.resume else None
    if run.note:
        say(run.note)
    if dist_info.is_main:
        prove_writable(Output("--output", out_dir / "summary.csv"))
    dev.seed_everything(args.seed + dist_info.rank)

    train_source, val_source, classes = build_datasets(args)
    if not classes and not args.num_classes:
        raise UsageError(f"--dataset {args.dataset} does not name its classes: pass --num-classes")
    num_classes = args.num_classes or len(classes)
    check_labels_fit(train_source, classes, num_classes)
    batch_note = fit_batch_to_set(args, len(train_source), dist_info)  # before the resume compares the batch
    if batch_note:
        say(batch_note)
    classes = classes or [str(label) for label in range(num_classes)]
    if resume_state is not None:
        check_same_experiment(resume_state, run.resume, args, classes, len(train_source), dist_info, say)
    model = build_model(args, num_classes, device, runtime.model_dtype)
    loaders = build_loaders(
        args, model, train_source, val_source, device, dist_info, runtime.budget.workers, runtime.model_dtype
    )
    parts, lr, num_epochs = build_components(
        args, model, loaders, num_classes, device, amp, dist_info, runtime.model_dtype
    )
    manager = CheckpointManager(
        out_dir,
        keep=args.checkpoint_hist,
        higher_is_better=args.eval_metric != "loss",
        on_write=lambda path: claim.wrote(path, created=not path.exists(), keep=True),
    )
    position = Position()
    if resume_state is not None:
        position, note = restore(
            resume_state,
            parts,
            manager,
            device,
            dist_info,
            args.seed,
            args.batch_size,
            resume_optimizer=not args.no_resume_opt,
        )
        say(f"resumed from {run.resume} at epoch {position.epoch}, step {position.step}{note}")
    if args.start_epoch is not None:
        position = start_at_epoch(
            parts, args.start_epoch, loaders.updates_per_epoch(args.grad_accum_steps), args.sched_on_updates
        )
    wrap_for_speed(parts, args, device, dist_info)
    if dist_info.is_main:
        carry_best_checkpoint(run.resume, manager)
        write_run_config(args, claim, say)
    say(
        f"training {args.model} on {device} ({amp.dtype_name}{', GradScaler' if parts.scaler else ''}), "
        f"{len(loaders.sampler.order) * dist_info.world_size} train / {len(loaders.val.dataset)} val images, "
        f"{num_classes} classes, {rate_text(lr, recipe.mean_lr(parts.optimizer))}, {num_epochs} epochs, "
        f"{dist_info.world_size} process(es) -> {out_dir}"
    )
    if not args.warmup_prefix and args.warmup_epochs >= num_epochs:
        say(
            f"warning: --warmup-epochs {args.warmup_epochs} is not shorter than this run's {num_epochs} epoch(s): "
            f"the rate never reaches --lr {lr:.4g} (use fewer warm-up epochs, or --warmup-prefix)"
        )
    if parts.task is not None:
        say(
            f"distilling from {args.kd_model_name} (logit, temperature {args.kd_temperature}, task weight "
            f"{parts.task.task_loss_weight:g}, distillation weight {parts.task.distill_loss_weight:g})"
        )
    for note in runtime.notes:
        say(f"device: {note}")
    say(f"cpu budget: {runtime.budget.describe()}")
    if resume_state is None:
        say(weights_description(args.model, args.pretrained, num_classes, args.initial_checkpoint))

    summary_rows = read_summary(out_dir, run.resume, position.epoch)
    num_updates = position.num_updates
    scalars = ScalarLog(out_dir / "tensorboard" if args.log_tensorboard and dist_info.is_main else None)
    profiler = StepProfiler(args.profile, device, out_dir, "train", enabled=dist_info.is_main)
    clock = RunClock(
        num_epochs,
        len(loaders.train),  # batches per epoch; the first log step reports the exact count
        lambda e: (e + 1) % args.val_interval == 0 or e + 1 == num_epochs,
        first=(position.epoch, position.step),
    )
    data_wait = DataWaitVerdict(loader_setting(args, runtime, loaders, train_source))

    def on_log(point: LogPoint) -> None:
        scalars.step(point.num_updates, point.loss, point.lr, point.images_per_second)
        line = clock.step_line(point)
        if line:
            say(line)

    with StopRequest(device, check_every=args.log_interval if dist_info.enabled else 1) as stop, closing(scalars):
        for epoch in range(position.epoch, num_epochs):
            if parts.mixup is not None and args.mixup_off_epoch and epoch >= args.mixup_off_epoch:
                parts.mixup = None
            resuming = epoch == position.epoch
            first_step = position.step if resuming else 0
            if not loaders.train.started:
                loaders.sampler.set_epoch(epoch, skip_samples=first_step * args.batch_size)
            validates = (epoch + 1) % args.val_interval == 0 or epoch + 1 == num_epochs
            if validates:
                loaders.val.start()  # its workers decode the validation set while this epoch trains
            clock.epoch_started()
            result, num_updates = train_one_epoch(
                parts,
                profiler.wrap(loaders.train),
                epoch,
                num_updates,
                args.log_interval,
                stop,
                show_progress=dist_info.is_main,
                start_step=first_step,
                carried=position.carried if resuming else (0.0, 0),
                on_log=on_log,
            )
            clock.epoch_trained(result.seconds, result.steps)
            if not result.interrupted:
                share_batchnorm_statistics(parts, args, dist_info)
            metrics, predictions = None, PredictionLog()
            continues = epoch + 1 < num_epochs and not result.interrupted
            if continues and runtime.budget.decode_during_validation:
                start_epoch(loaders, epoch + 1)  # its first batches are decoded while the device validates
            if validates and not result.interrupted:
                metrics = evaluate(
                    eval_model(parts, dist_info, args),
                    loaders.val,
                    device,
                    amp,
                    desc=f"validate {epoch}",
                    show_progress=dist_info.is_main,
                    should_stop=None if dist_info.enabled else (lambda: stop.requested),
                    on_logits=predictions.add,
                )
            if result.interrupted or (validates and metrics is None):  # stopped mid-epoch or mid-validation
                where = Position(epoch, result.completed_steps, num_updates)
                state = training_state(
                    args, parts, where, classes, device, dist_info, loaders.data_config, result, len(train_source)
                )
                if dist_info.is_main:
                    with stop.shielded():
                        path = manager.save_interrupted(state)
                    say(
                        f"{stop.signal_name}: saved a resumable checkpoint at epoch {epoch} step "
                        f"{result.completed_steps} to {path}; continue with --resume {path}"
                    )
                barrier()  # no rank leaves (and has torchrun stop the others) before the checkpoint is whole
                return exit_code(stop.signal_name)
            check_finite(epoch, metrics, parts.model)
            if metrics is not None:
                clock.validated(metrics.seconds)
            gathered = predictions.gather(device) if metrics is not None else None  # every rank's samples
            if continues and not loaders.train.started:
                start_epoch(loaders, epoch + 1)  # validated on the host's cores: decode during the checkpoint
            lr_used = recipe.mean_lr(parts.optimizer)  # before the step: the rate this epoch trained with
            metric = getattr(metrics, args.eval_metric) if metrics is not None else None
            if parts.scheduler is not None:
                parts.scheduler.step(epoch + 1, metric)  # as timm: after validation, fed its metric
            state = training_state(
                args,
                parts,
                Position(epoch + 1, 0, num_updates),
                classes,
                device,
                dist_info,
                loaders.data_config,
                train_samples=len(train_source),
            )
            summary_rows.append(summary_row(epoch, result, metrics, lr_used))
            if dist_info.is_main:
                with stop.shielded():
                    best = manager.save(state, epoch, metric)
                    claim.wrote(out_dir / "summary.csv", created=not (out_dir / "summary.csv").exists())
                    write_rows(out_dir / "summary.csv", summary_rows, "csv")
                    if best and gathered is not None:
                        write_eval_report(claim, gathered, output_names(classes, num_classes), val_source, epoch)
                scalars.epoch(summary_rows[-1])
                say(epoch_line(epoch, result, metrics, best, clock.since_epoch_start))
                verdict = data_wait.epoch(epoch, result.data_wait)
                if verdict:
                    say(verdict)
            # a signal during validation (torchrun) or the save: this epoch is saved; after the last one the
            # run finishes its files instead
            if stop.agreed(now=True) and epoch + 1 < num_epochs:
                manager.wait()
                say(
                    f"{stop.signal_name}: stopping after epoch {epoch}, saved in {out_dir / LAST}; continue "
                    "with --resume auto"
                )
                return exit_code(stop.signal_name)
        with stop.shielded():  # the run's last files are written whole, whatever signal comes now
            finish_run(args, claim, manager, num_classes, classes, loaders.data_config, parts, dist_info, say)
        last_lines.extend(final_summary(claim, clock, num_epochs - position.epoch, data_wait))
        if stop.requested:
            say(f"{stop.signal_name} came after the last epoch: the run's files were finished first")
    return 0


def finish_run(
    args: argparse.Namespace,
    claim: FolderClaim,
    manager: CheckpointManager,
    num_classes: int,
    classes: list[str],
    data_config: dict[str, Any],
    parts: TrainComponents,
    dist_info: DistInfo,
    say: Callable[[str], None],
) -> None:
    """After the last epoch: curves, the last checkpoint on disk, the best weights as a model folder."""
    out_dir = claim.folder
    curves = draw_curves(claim) if dist_info.is_main else ""  # from summary.csv, while the last
    report = draw_eval_report(claim) if dist_info.is_main else ""
    manager.wait()  # checkpoint is written; it is whole (or its failure raised) before best is read
    if not dist_info.is_main:
        return
    claim.wrote(out_dir / "model", created=not (out_dir / "model").exists())
    exported, others = export_best(
        args, out_dir, num_classes, classes, data_config, ema_on_device(parts, args) is not None
    )
    say(f"best {args.eval_metric} {manager.best_metric:.4f} at epoch {manager.best_epoch}; model folder: {exported}")
    if others:
        say(f"{exported} also holds {', '.join(others)}, which this run did not write: left as they are")
    say(curves)
    if report:
        say(report)


def loader_setting(args: argparse.Namespace, runtime: Runtime, loaders: Loaders, source: Source) -> LoaderSetting:
    """What the data-wait advice depends on, for this run."""
    paths = getattr(source.samples, "paths", [])  # a few spread over the set, not a copy of a million names
    return LoaderSetting(
        runtime.budget,
        workers_given=args.workers is not None,
        from_files=not args.dataset,
        data_path=args.data_dir or "",
        img_size=int(loaders.data_config["input_size"][-1]),
        sample_files=tuple(str(path) for path in paths[:: max(1, len(paths) // 8)][:8]),
    )


RUN_FILES = (  # what a finished run leaves, in the order the final summary names them
    ("model", "model/ (the best weights)"),
    ("summary.csv", "summary.csv"),
    ("config.yaml", "config.yaml"),
    ("args.yaml", "args.yaml"),
    ("curves.png", "curves.png"),
    (EVAL_DIR, f"{EVAL_DIR}/ (class report)"),
    (BEST, BEST),
    (LAST, LAST),
    ("tensorboard", "tensorboard/"),
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
    line = f"finished in {clock_text(clock.elapsed)} ({epochs} epoch(s) in this process); wrote to {folder}: "
    line += ", ".join(names)
    reminder = data_wait.summary()
    return [line, reminder] if reminder else [line]


def output_names(classes: list[str], num_classes: int) -> list[str]:
    """A name for every output: the data's class names, then the index of any output beyond them
    (--num-classes above the data's class count)."""
    return classes + [str(index) for index in range(len(classes), num_classes)]


def write_eval_report(
    claim: FolderClaim, predictions: Predictions, classes: list[str], source: Source, epoch: int
) -> None:
    """The best epoch's class report in ``<run>/eval`` (tables now; pictures when the run ends)."""
    folder = claim.folder / EVAL_DIR
    claim.wrote(folder, created=not folder.exists())
    report = build_report(predictions, classes, getattr(source.samples, "name", None), about={"epoch": epoch})
    write_report(folder, report, before_write=lambda path: claim.wrote(path, created=not path.exists()))


def draw_eval_report(claim: FolderClaim) -> str:
    """The pictures of ``<run>/eval``'s report, or why there are none."""
    folder = claim.folder / EVAL_DIR
    if not (folder / OVERALL).is_file():
        return ""
    try:
        draw_report(folder, before_write=lambda path: claim.wrote(path, created=not path.exists()))
    except UsageError as missing:
        return f"class report: {folder} (no pictures: {missing})"
    return f"class report: {folder} (confusion.png, reliability.png)"


def check_labels_fit(source: Source, classes: list[str] | None, num_classes: int) -> None:
    """Every training label must be one of the model's outputs: fewer --num-classes than the set has
    classes would fail inside the loss, mid-epoch."""
    labels = getattr(source.samples, "labels", None)  # class folders: known before any image is read
    top = max(labels) if labels else len(classes or []) - 1
    if top >= num_classes:
        raise UsageError(
            f"--num-classes {num_classes} is fewer than the {top + 1} classes of {source.description}; leave "
            f"--num-classes out (it defaults to the class count) or give at least {top + 1}"
        )


def check_finite(epoch: int, metrics: EvalResult | None, model: torch.nn.Module) -> None:
    """A diverged epoch ends the run (exit 3) before it is saved, so it can never become best: its eval
    loss and every weight and buffer must be finite (one check per epoch, one host sync)."""
    tensors = [t for t in unwrap(model).state_dict().values() if t.is_floating_point()]
    weights_finite = bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()) if tensors else True
    loss_finite = metrics is None or math.isfinite(metrics.loss)
    if not (weights_finite and loss_finite):
        what = "the weights hold non-finite values" if not weights_finite else f"the eval loss is {metrics.loss}"
        raise RunFailed(
            f"epoch {epoch}: {what}: training diverged; the epoch is not saved (lower --lr, raise "
            "--warmup-epochs, or use --clip-grad), and the previous checkpoint is intact"
        )


def rate_text(lr: float, first: float) -> str:
    """The learning rate the start line shows: the one the first epoch trains with, and the schedule's
    peak when that differs (warm-up, or a resumed run further down the schedule)."""
    if math.isclose(first, lr, rel_tol=1e-6):
        return f"lr {lr:.4g}"
    return f"lr {first:.4g} now ({lr:.4g} at its peak)"


def check_same_experiment(
    state: dict[str, Any],
    path: Path,
    args: argparse.Namespace,
    classes: list[str],
    train_samples: int,
    dist_info: DistInfo,
    say: Callable[[str], None],
) -> None:
    """A resume continues the checkpoint's experiment or stops in one line naming what differs: what the
    start line, config.yaml and summary.csv show must be what the resumed run uses."""
    changes = experiment_changes(state, args, classes, train_samples, dist_info.world_size)
    if changes:
        raise UsageError(
            f"--resume {path}: this command line changes the run it continues ({'; '.join(changes)}); resume "
            f"with the run's options (its config.yaml), or start a new run from its weights with "
            f"--initial-checkpoint {path}"
        )
    saved = state.get("args") or {}
    if saved.get("epochs") not in (None, args.epochs):
        say(
            f"--epochs {args.epochs} (the run had {saved['epochs']}): the schedule is the one for {args.epochs} "
            "epochs from here on"
        )


def start_epoch(loaders: Loaders, epoch: int) -> None:
    """Have the workers start decoding ``epoch``'s batches now, ahead of its first step."""
    loaders.sampler.set_epoch(epoch)
    loaders.train.start()


def write_run_config(args: argparse.Namespace, claim: FolderClaim, say: Callable[[str], None]) -> None:
    """The run's resolved options as ``config.yaml`` (``train.py -c`` on it repeats the run); where a
    config.yaml that no vtools run wrote is in the way (the user's own), as ``args.yaml`` beside it."""
    name = next((name for name in CONFIG_NAMES if claim.owns(name)), None)
    if name is None:
        raise UsageError(
            f"{claim.folder} holds {' and '.join(CONFIG_NAMES)} that no vtools run wrote; give this run "
            "another --experiment (or --output) so they stay as they are"
        )
    if name != CONFIG_NAMES[0]:
        say(
            f"{claim.folder / CONFIG_NAMES[0]} was not written by a vtools run: left as it is; this run's options "
            f"go to {claim.folder / name}"
        )
    path = claim.folder / name
    claim.wrote(path, created=not path.exists())
    atomic_write_text(path, dump_config(args, path))


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


def share_batchnorm_statistics(parts: TrainComponents, args: argparse.Namespace, dist_info: DistInfo) -> None:
    """--dist-bn after an epoch under DDP, as timm's train.py: BatchNorm running statistics averaged over
    the ranks (reduce) or rank 0's everywhere (broadcast), in the model and in an EMA on the device. Off
    with --sync-bn, whose statistics are already shared."""
    if not dist_info.enabled or not args.dist_bn or args.sync_bn:
        return
    for model in (unwrap(parts.model), ema_on_device(parts, args)):
        if model is not None:
            distribute_bn(model, dist_info.world_size, reduce=args.dist_bn == "reduce")


def ema_on_device(parts: TrainComponents, args: argparse.Namespace) -> torch.nn.Module | None:
    """The EMA weights that validation uses: none without --model-ema, or with --model-ema-force-cpu
    (timm validates the trained weights then)."""
    if parts.ema is None or args.model_ema_force_cpu:
        return None
    return parts.ema.module


def eval_model(parts: TrainComponents, dist_info: DistInfo, args: argparse.Namespace) -> torch.nn.Module:
    """The EMA weights when tracked on the device; never the DDP wrapper: its forward may broadcast
    buffers, a collective that shards differing by one batch could not match."""
    if (ema := ema_on_device(parts, args)) is not None:
        return ema
    return unwrap(parts.model) if dist_info.enabled else parts.model


def summary_row(epoch: int, result: EpochResult, metrics: EvalResult | None, lr: float) -> dict[str, Any]:
    """One row of summary.csv; the eval columns stay empty in epochs that --val-interval skips. Speed and
    data wait are this process's measurement (a resumed epoch's: its resumed part's), empty where it
    trained none of the epoch (stopped after the epoch's last step, resumed for its validation)."""
    evaluated, timed = metrics is not None, result.steps > 0
    return {
        "epoch": epoch,
        "train_loss": result.loss,
        "eval_loss": metrics.loss if evaluated else "",
        "eval_top1": metrics.top1 if evaluated else "",
        "eval_top5": metrics.top5 if evaluated else "",
        "lr": lr,
        "img_per_sec": round(result.images_per_second, 2) if timed else "",
        "epoch_seconds": round(result.seconds, 2) if timed else "",
        "data_wait": round(result.data_wait, 4) if timed else "",
        "skipped_updates": result.skipped_updates,
        "eval_samples": metrics.count if evaluated else "",
    }


def epoch_line(epoch: int, result: EpochResult, metrics: EvalResult | None, best: bool, seconds: float) -> str:
    """The epoch's figures, its data-wait share and its duration (training, validation and saving)."""
    line = f"epoch {epoch}: train_loss {result.loss:.4f}  "
    if metrics is not None:
        line += f"eval_loss {metrics.loss:.4f}  top1 {metrics.top1:.2f}  top5 {metrics.top5:.2f}  "
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


def export_best(
    args: argparse.Namespace,
    out_dir: Path,
    num_classes: int,
    classes: list[str],
    data_config: dict[str, Any],
    use_ema: bool,
) -> tuple[Path, list[str]]:
    """Export the best epoch's weights (EMA weights when EMA was tracked) as a model folder."""
    model = create_model(
        args.model,
        pretrained=False,
        num_classes=num_classes,
        in_chans=model_in_chans(args),
        model_kwargs=timm_model_kwargs(args),
        bn_eps=args.bn_eps,
    )
    model.load_state_dict(read_state_dict(out_dir / BEST, use_ema=use_ema))
    return export_model_folder(model, out_dir / "model", classes, data_config)

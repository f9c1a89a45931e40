"""ImageNet-style training of timm models from a YAML run file, on any device.

Examples:
  python train.py -c configs/fashion_mnist_cpu.yaml
  python train.py -c configs/resnet50_a3_imagenet.yaml --data-dir /data/imagenet --device npu --amp
  torchrun --nproc-per-node 8 train.py -c configs/resnet50_a3_imagenet.yaml --data-dir /data/imagenet --device npu

Options come from the defaults, then the YAML file (-c), then the command line.
"""

from __future__ import annotations

import argparse
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from timm.layers import convert_sync_batchnorm

from vtools import data as vdata
from vtools import device as dev
from vtools import recipe
from vtools.checkpoint import BEST, LAST, CheckpointManager, load_training_state
from vtools.cli import (WORKERS_HELP, OneLineParser, Runtime, add_data_source_args, add_dataset_args, add_device_args,
                        add_model_args, add_preprocess_args, check_positive, check_values, preprocess_overrides,
                        setup_runtime)
from vtools.config import dump_config, parse_with_config
from vtools.curves import ScalarLog, plot_runs
from vtools.distributed import DistInfo, ShardSampler, barrier, init_distributed, shutdown
from vtools.engine import EvalResult, evaluate
from vtools.errors import UsageError
from vtools.files import atomic_write_text, check_writable, write_rows
from vtools.models import (create_model, export_model_folder, read_state_dict, unwrap, use_channels_last,
                           weights_description)
from vtools.profiling import StepProfiler
from vtools.resume import (Position, RunFolder, carry_best_checkpoint, choose_run_folder, read_summary, restore,
                           training_state)
from vtools.run_lock import owned_folder
from vtools.sampling import EpochSampler, SeededSamples
from vtools.sources import Source, SourceRequest, open_source
from vtools.training import EpochResult, StopRequest, TrainComponents, exit_code, train_one_epoch


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", default="", metavar="FILE", help="YAML file of options (keys = flag names)")
    group = parser.add_argument_group("data")
    add_data_source_args(group, "DIR", "root holding the train and validation folders (one sub-folder per class)")
    add_dataset_args(group)
    group.add_argument("--train-split", default="train", help="training split: folder, split name or shard "
                                                               "pattern (default: train)")
    group.add_argument("--val-split", default="validation",
                       help="validation split; val, eval... folders are found too (default: validation)")
    group.add_argument("--on-bad-image", default="error", choices=vdata.ON_BAD_IMAGE,
                       help="stop on an unreadable image, or skip it (default: error)")
    add_model_args(parser, default_model="resnet50", checkpoint_flags=False)
    add_preprocess_args(parser)
    group = parser.add_argument_group("batches")
    group.add_argument("--batch-size", "-b", type=int, default=128, help="per-device batch size (default: 128)")
    group.add_argument("--validation-batch-size", "-vb", type=int, default=None, help="(default: --batch-size)")
    group.add_argument("--grad-accum-steps", type=int, default=1, help="batches per optimizer update")
    group.add_argument("--workers", "-j", type=int, default=None, help=WORKERS_HELP)
    group = parser.add_argument_group("optimizer")
    group.add_argument("--opt", default="sgd", help="timm optimizer name (default: sgd)")
    group.add_argument("--opt-eps", type=float, default=None,
                       help="optimizer epsilon (default: the optimizer's)")
    group.add_argument("--opt-betas", type=float, nargs="+", default=None,
                       help="optimizer betas (default: the optimizer's)")
    group.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    group.add_argument("--weight-decay", type=float, default=2e-5, help="weight decay (default: 2e-5)")
    group.add_argument("--layer-decay", type=float, default=None, help="layer-wise lr decay")
    group.add_argument("--clip-grad", type=float, default=None, help="gradient clipping threshold")
    group.add_argument("--clip-mode", default="norm", choices=("norm", "value", "agc"),
                       help="gradient clipping mode (default: norm)")
    group = parser.add_argument_group("learning rate schedule")
    group.add_argument("--sched", default="cosine", help="timm scheduler (cosine, step, multistep, plateau, ...)")
    group.add_argument("--sched-on-updates", action="store_true", default=False, help="step the schedule per update")
    group.add_argument("--lr", type=float, default=None, help="learning rate (default: scaled from --lr-base)")
    group.add_argument("--lr-base", type=float, default=0.1, help="lr for a global batch of --lr-base-size")
    group.add_argument("--lr-base-size", type=int, default=256,
                       help="global batch size --lr-base is given for (default: 256)")
    group.add_argument("--lr-base-scale", default="", choices=("", "linear", "sqrt"),
                       help="how lr scales with batch size (default: sqrt for adaptive optimizers, else linear)")
    group.add_argument("--warmup-lr", type=float, default=1e-5,
                       help="learning rate at the start of warmup (default: 1e-5)")
    group.add_argument("--min-lr", type=float, default=0.0, help="floor of the schedule (default: 0)")
    group.add_argument("--epochs", type=int, default=300, help="epochs to train (default: 300)")
    group.add_argument("--decay-epochs", type=float, default=90,
                       help="epochs between step decays (default: 90)")
    group.add_argument("--decay-milestones", type=int, nargs="+", default=[90, 180, 270],
                       help="epochs at which multistep decays (default: 90 180 270)")
    group.add_argument("--decay-rate", "--dr", type=float, default=0.1,
                       help="lr multiplier at each decay (default: 0.1)")
    group.add_argument("--warmup-epochs", type=int, default=5,
                       help="linear warmup epochs (default: 5)")
    group.add_argument("--warmup-prefix", action="store_true", default=False,
                       help="warmup epochs come before, not within, the schedule")
    group.add_argument("--cooldown-epochs", type=int, default=0,
                       help="epochs at --min-lr after the schedule (default: 0)")
    group.add_argument("--patience-epochs", type=int, default=10,
                       help="plateau schedule patience (default: 10)")
    group.add_argument("--lr-noise", type=float, nargs="+", default=None, metavar="FRACTION",
                       help="add lr noise from (and until) these fractions of the schedule")
    group.add_argument("--lr-noise-pct", type=float, default=0.67, help="lr noise limit (default: 0.67)")
    group.add_argument("--lr-noise-std", type=float, default=1.0, help="lr noise std-dev (default: 1)")
    group.add_argument("--lr-cycle-mul", type=float, default=1.0,
                       help="cycle length multiplier of cosine/tanh/poly (default: 1)")
    group.add_argument("--lr-cycle-decay", type=float, default=0.5,
                       help="lr multiplier per cycle (default: 0.5)")
    group.add_argument("--lr-cycle-limit", type=int, default=1, help="number of cycles (default: 1)")
    group.add_argument("--lr-k-decay", type=float, default=1.0, help="k-decay of cosine/poly (default: 1)")
    group = parser.add_argument_group("augmentation and regularization")
    group.add_argument("--no-aug", action="store_true", default=False, help="no training augmentation")
    group.add_argument("--scale", type=float, nargs=2, default=[0.08, 1.0], help="random resized crop scale")
    group.add_argument("--ratio", type=float, nargs=2, default=[3 / 4, 4 / 3], help="random resized crop ratio")
    group.add_argument("--hflip", type=float, default=0.5,
                       help="horizontal flip probability (default: 0.5)")
    group.add_argument("--vflip", type=float, default=0.0,
                       help="vertical flip probability (default: 0)")
    group.add_argument("--color-jitter", type=float, default=0.4,
                       help="color jitter strength (default: 0.4)")
    group.add_argument("--aa", default=None, help="AutoAugment/RandAugment policy, e.g. rand-m9-mstd0.5-inc1")
    group.add_argument("--train-interpolation", default="random",
                       help="training resize interpolation (default: random)")
    group.add_argument("--reprob", type=float, default=0.0, help="random erasing probability (on the device)")
    group.add_argument("--remode", default="pixel", choices=("const", "rand", "pixel"),
                       help="random erasing fill (default: pixel)")
    group.add_argument("--recount", type=int, default=1, help="random erasing count (default: 1)")
    group.add_argument("--mixup", type=float, default=0.0, help="mixup alpha")
    group.add_argument("--cutmix", type=float, default=0.0, help="cutmix alpha")
    group.add_argument("--cutmix-minmax", type=float, nargs=2, default=None,
                       help="cutmix box ratio range (replaces the cutmix alpha)")
    group.add_argument("--mixup-prob", type=float, default=1.0,
                       help="probability of mixing a batch (default: 1)")
    group.add_argument("--mixup-switch-prob", type=float, default=0.5,
                       help="probability of cutmix instead of mixup when both are on (default: 0.5)")
    group.add_argument("--mixup-mode", default="batch", choices=("batch", "pair", "elem"),
                       help="mix per batch, pair or element (default: batch)")
    group.add_argument("--mixup-off-epoch", type=int, default=0, help="turn mixup off from this epoch (0: never)")
    group.add_argument("--smoothing", type=float, default=0.1, help="label smoothing")
    group.add_argument("--bce-loss", action="store_true", default=False, help="binary cross-entropy loss")
    group.add_argument("--bce-target-thresh", type=float, default=None,
                       help="binarize BCE targets at this threshold")
    group.add_argument("--drop", type=float, default=None, help="dropout rate")
    group.add_argument("--drop-path", type=float, default=None, help="stochastic depth rate")
    group.add_argument("--model-ema", action="store_true", default=False, help="track an EMA of the weights")
    group.add_argument("--model-ema-decay", type=float, default=0.9998,
                       help="EMA decay (default: 0.9998)")
    group.add_argument("--model-ema-warmup", action="store_true", default=False,
                       help="ramp the EMA decay up over the first updates")
    group = parser.add_argument_group("run")
    group.add_argument("--seed", type=int, default=42, help="random seed (default: 42)")
    group.add_argument("--log-interval", type=int, default=50,
                       help="batches between loss checks and bar updates; under torchrun also the updates "
                            "between the ranks' checks for a stop signal (default: 50)")
    group.add_argument("--val-interval", type=int, default=1, metavar="N",
                       help="validate and keep numbered checkpoints every N epochs and after the last "
                            "(default: 1)")
    group.add_argument("--output", default="runs", metavar="DIR", help="parent folder of run folders")
    group.add_argument("--experiment", default="", help="run folder name (default: <model>-<timestamp>)")
    group.add_argument("--resume", default="", metavar="PATH",
                       help="checkpoint to resume, or auto: the last checkpoint of --experiment, or without "
                            "one of the newest <model>-<timestamp> run in --output")
    group.add_argument("--initial-checkpoint", default="", metavar="PATH", help="weights to start from")
    group.add_argument("--checkpoint-hist", type=int, default=10, help="numbered checkpoints to keep")
    group.add_argument("--log-tensorboard", action="store_true", default=False,
                       help="write TensorBoard scalars (per epoch and per log step) to <run>/tensorboard")
    group.add_argument("--eval-metric", default="top1", choices=("top1", "top5", "loss"),
                       help="metric that picks the best checkpoint (default: top1)")
    group.add_argument("--sync-bn", action="store_true", default=False, help="synchronized BatchNorm under DDP")
    group.add_argument("--dist-backend", default=None, help="override the collective backend (default: per device)")
    add_device_args(parser)
    return parser


def _check_args(args: argparse.Namespace) -> None:
    for flag in ("grad_accum_steps", "log_interval", "val_interval"):  # sizes and epochs: check_values
        check_positive(getattr(args, flag), "--" + flag.replace("_", "-"))
    if recipe.mixup_enabled(args) and args.batch_size % 2:
        raise UsageError(f"--mixup/--cutmix pair up the samples of a batch: --batch-size must be even, "
                         f"got {args.batch_size}")
    args.data_dir = args.data or args.data_dir  # one spelling in the saved config
    if not args.data_dir and not args.dataset:
        raise UsageError("give the data folder (DIR, --data-dir or data-dir: in the config)")


def build_datasets(args: argparse.Namespace) -> tuple[Source, Source, list[str] | None]:
    """Training and validation sources (whatever stores them) and the class names."""
    def request(split: str, class_map: dict[str, int] | None = None) -> SourceRequest:
        return SourceRequest(args.dataset, args.data_dir or "", split, args.dataset_download, args.input_key,
                             args.target_key, class_map)

    if not args.dataset:
        root = args.data_dir
        if vdata.resolve_split_dir(root, args.train_split) == vdata.resolve_split_dir(root, args.val_split):
            raise UsageError(f"{root}: no separate {args.train_split} and {args.val_split} folders found")
    train = open_source(request(args.train_split))
    class_map = {name: index for index, name in enumerate(train.classes)} if not args.dataset else None
    val = open_source(request(args.val_split, class_map))
    return train, val, train.classes


def main(argv: list[str] | None = None) -> int:
    args = parse_with_config(build_parser(), argv)
    check_values(args)
    runtime = setup_runtime(args)
    _check_args(args)
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


@dataclass
class Loaders:
    train: vdata.DeviceLoader
    val: vdata.DeviceLoader
    sampler: EpochSampler
    data_config: dict[str, Any]
    channels_last: bool


def build_loaders(args: argparse.Namespace, model: torch.nn.Module, train_source: Any, val_source: Any,
                  device: torch.device, dist_info: DistInfo, workers: int) -> Loaders:
    """Training batches (seeded order and augmentation) and exact-once validation batches, on the device."""
    data_config = vdata.data_config_for(model, preprocess_overrides(args))
    mode = vdata.image_mode(data_config)
    keep = vdata.KEEP_TRAINING_BYTES // max(1, workers)  # each loader process keeps what it decodes
    train_set = SeededSamples(train_source.images(recipe.build_train_transform(args, data_config), mode, keep),
                              args.seed, replace_bad=args.on_bad_image == "skip")
    val_set = val_source.images(vdata.eval_transform(data_config), mode)
    channels_last = use_channels_last(args.channels_last, model, device)
    sampler = EpochSampler(len(train_set), args.seed, dist_info.rank, dist_info.world_size)
    if len(sampler.order) < args.batch_size:
        raise UsageError(f"--batch-size {args.batch_size} is larger than the {len(sampler.order)} training images "
                         "per process")
    train_loader = vdata.DeviceLoader(
        vdata.make_loader(train_set, args.batch_size, device, workers, sampler=sampler, drop_last=True,
                          seed=args.seed),
        device, data_config["mean"], data_config["std"], channels_last=channels_last,
        batch_transform=recipe.build_random_erasing(args, device),
        on_bad=vdata.bad_image_handler(args.on_bad_image, [], keep_batches_full=True))
    val_loader = vdata.eval_device_loader(
        val_set, args.validation_batch_size or args.batch_size, device, workers, data_config, channels_last,
        vdata.bad_image_handler(args.on_bad_image, []),
        sampler=ShardSampler(len(val_set), dist_info.rank, dist_info.world_size), persistent=True,
        keep_bytes=vdata.KEEP_VALIDATION_BYTES)
    return Loaders(train_loader, val_loader, sampler, data_config, channels_last)


def build_components(args: argparse.Namespace, model: torch.nn.Module, loaders: Loaders, num_classes: int,
                     device: torch.device, amp: Any, dist_info: DistInfo) -> tuple[TrainComponents, float, int]:
    """Layout, sync BN, optimizer, schedule, loss, mixup, EMA and GradScaler for this run, the learning
    rate, and the number of epochs to train (timm's: warmup prefix and cool-down included)."""
    if loaders.channels_last:
        model.to(memory_format=torch.channels_last)
    if dist_info.enabled and args.sync_bn:
        model = convert_sync_batchnorm(model)
    updates_per_epoch = (len(loaders.train) + args.grad_accum_steps - 1) // args.grad_accum_steps
    lr = recipe.scaled_lr(args, args.batch_size * args.grad_accum_steps * dist_info.world_size)
    optimizer = recipe.build_optimizer(model, args, lr)
    mixup = recipe.build_mixup(args, num_classes)
    scheduler, num_epochs = recipe.build_scheduler(optimizer, args, updates_per_epoch)
    parts = TrainComponents(
        model=model, optimizer=optimizer, loss_fn=recipe.build_train_loss(args, mixup is not None).to(device),
        amp=amp, device=device, scaler=amp.grad_scaler(), scheduler=scheduler, mixup=mixup,
        ema=recipe.build_ema(model, args), clip_grad=args.clip_grad, clip_mode=args.clip_mode,
        grad_accum_steps=args.grad_accum_steps)
    return parts, lr, num_epochs


def wrap_for_speed(parts: TrainComponents, args: argparse.Namespace, device: torch.device,
                   dist_info: DistInfo) -> None:
    """DDP across processes, then torch.compile, once the weights are final (after resume)."""
    if dist_info.enabled:
        ddp_ids = [device.index] if device.type != "cpu" else None
        parts.model = torch.nn.parallel.DistributedDataParallel(parts.model, device_ids=ddp_ids)
    if args.torchcompile:
        parts.model = torch.compile(parts.model, backend=args.torchcompile)


def train(args: argparse.Namespace, runtime: Runtime, dist_info: DistInfo) -> int:
    """Train in a run folder this run owns (rank 0 holds its lock; a failed start leaves none behind)."""
    run = choose_run_folder(args, dist_info)
    with owned_folder(run.path, enabled=dist_info.is_main):
        return run_training(args, run, runtime, dist_info)


def run_training(args: argparse.Namespace, run: RunFolder, runtime: Runtime, dist_info: DistInfo) -> int:
    say = print if dist_info.is_main else (lambda *a, **k: None)
    device, amp = runtime.device, runtime.amp
    out_dir = run.path
    resume_state = load_training_state(run.resume) if run.resume else None
    if run.note:
        say(run.note)
    if dist_info.is_main:
        check_writable(out_dir / "summary.csv", "--output")
    dev.seed_everything(args.seed + dist_info.rank)

    train_source, val_source, classes = build_datasets(args)
    if not classes and not args.num_classes:
        raise UsageError(f"--dataset {args.dataset} does not name its classes: pass --num-classes")
    num_classes = args.num_classes or len(classes)
    classes = classes or [str(label) for label in range(num_classes)]
    model = create_model(args.model, pretrained=args.pretrained, num_classes=num_classes, in_chans=args.in_chans,
                         model_kwargs=args.model_kwargs, drop_rate=args.drop, drop_path_rate=args.drop_path,
                         checkpoint=args.initial_checkpoint or None, device=device)
    loaders = build_loaders(args, model, train_source, val_source, device, dist_info, runtime.budget.workers)
    parts, lr, num_epochs = build_components(args, model, loaders, num_classes, device, amp, dist_info)
    manager = CheckpointManager(out_dir, keep=args.checkpoint_hist, higher_is_better=args.eval_metric != "loss")
    position = Position()
    if resume_state is not None:
        position, note = restore(resume_state, parts, manager, device, dist_info, args.seed)
        say(f"resumed from {run.resume} at epoch {position.epoch}, step {position.step}{note}")
    wrap_for_speed(parts, args, device, dist_info)
    if dist_info.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        carry_best_checkpoint(run.resume, out_dir)
        atomic_write_text(out_dir / "config.yaml", dump_config(args, out_dir / "config.yaml"))
    say(f"training {args.model} on {device} ({amp.dtype_name}{', GradScaler' if parts.scaler else ''}), "
        f"{len(loaders.sampler.order) * dist_info.world_size} train / {len(loaders.val.dataset)} val images, "
        f"{num_classes} classes, lr {lr:.4g}, {num_epochs} epochs, {dist_info.world_size} process(es) -> {out_dir}")
    say(f"cpu budget: {runtime.budget.describe()}")
    if resume_state is None:
        say(weights_description(args.model, args.pretrained, num_classes, args.initial_checkpoint))

    summary_rows = read_summary(out_dir, run.resume, position.epoch)
    num_updates = position.num_updates
    scalars = ScalarLog(out_dir / "tensorboard" if args.log_tensorboard and dist_info.is_main else None)
    profiler = StepProfiler(args.profile, device, out_dir, "train", enabled=dist_info.is_main)
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
            result, num_updates = train_one_epoch(
                parts, profiler.wrap(loaders.train), epoch, num_updates, args.log_interval, stop,
                show_progress=dist_info.is_main,
                start_step=first_step, carried=position.carried if resuming else (0.0, 0), on_log=scalars.step)
            metrics = None
            continues = epoch + 1 < num_epochs and not result.interrupted
            if continues and runtime.budget.decode_during_validation:
                start_epoch(loaders, epoch + 1)  # its first batches are decoded while the device validates
            if validates and not result.interrupted:
                metrics = evaluate(eval_model(parts, dist_info), loaders.val, device, amp,
                                   desc=f"validate {epoch}", show_progress=dist_info.is_main,
                                   should_stop=None if dist_info.enabled else (lambda: stop.requested))
            if result.interrupted or (validates and metrics is None):  # stopped mid-epoch or mid-validation
                where = Position(epoch, result.completed_steps, num_updates)
                state = training_state(args, parts, where, classes, device, dist_info, loaders.data_config, result)
                if dist_info.is_main:
                    with stop.shielded():
                        path = manager.save_interrupted(state)
                    say(f"{stop.signal_name}: saved a resumable checkpoint at epoch {epoch} step "
                        f"{result.completed_steps} to {path}; continue with --resume {path}")
                barrier()  # no rank leaves (and has torchrun stop the others) before the checkpoint is whole
                return exit_code(stop.signal_name)
            if continues and not loaders.train.started:
                start_epoch(loaders, epoch + 1)  # validated on the host's cores: decode during the checkpoint
            lr_used = recipe.mean_lr(parts.optimizer)  # before the step: the rate this epoch trained with
            metric = getattr(metrics, args.eval_metric) if metrics is not None else None
            if parts.scheduler is not None:
                parts.scheduler.step(epoch + 1, metric)  # as timm: after validation, fed its metric
            state = training_state(args, parts, Position(epoch + 1, 0, num_updates), classes, device, dist_info,
                                   loaders.data_config)
            summary_rows.append(summary_row(epoch, result, metrics, lr_used))
            if dist_info.is_main:
                with stop.shielded():
                    best = manager.save(state, epoch, metric)
                    write_rows(out_dir / "summary.csv", summary_rows, "csv")
                scalars.epoch(summary_rows[-1])
                say(epoch_line(epoch, result, metrics, best))
            if stop.agreed(now=True):  # a signal during validation (torchrun) or the save: this epoch is saved
                manager.wait()
                say(f"{stop.signal_name}: stopping after epoch {epoch}, saved in {out_dir / LAST}; continue "
                    "with --resume auto")
                return exit_code(stop.signal_name)
    curves = draw_curves(out_dir) if dist_info.is_main else ""  # from summary.csv, while the last
    manager.wait()  # checkpoint is written; it is whole (or its failure raised) before best is read
    if dist_info.is_main:
        exported = export_best(args, out_dir, num_classes, classes, loaders.data_config, parts.ema is not None)
        say(f"best {args.eval_metric} {manager.best_metric:.4f} at epoch {manager.best_epoch}; "
            f"model folder: {exported}")
        say(curves)
    return 0


def start_epoch(loaders: Loaders, epoch: int) -> None:
    """Have the workers start decoding ``epoch``'s batches now, ahead of its first step."""
    loaders.sampler.set_epoch(epoch)
    loaders.train.start()


def draw_curves(out_dir: Path) -> str:
    """<run>/curves.png when matplotlib is installed; otherwise say how to get it."""
    try:
        return f"curves: {plot_runs([out_dir], out_dir / 'curves.png')}"
    except UsageError as missing:
        return f"no curves.png: {missing}"


def eval_model(parts: TrainComponents, dist_info: DistInfo) -> torch.nn.Module:
    """The EMA weights when tracked; never the DDP wrapper: its forward may broadcast buffers, a
    collective that shards differing by one batch could not match."""
    if parts.ema is not None:
        return parts.ema.module
    return unwrap(parts.model) if dist_info.enabled else parts.model


def summary_row(epoch: int, result: EpochResult, metrics: EvalResult | None, lr: float) -> dict[str, Any]:
    """One row of summary.csv; the eval columns stay empty in epochs that --val-interval skips."""
    evaluated = metrics is not None
    return {"epoch": epoch, "train_loss": result.loss,
            "eval_loss": metrics.loss if evaluated else "", "eval_top1": metrics.top1 if evaluated else "",
            "eval_top5": metrics.top5 if evaluated else "",
            "lr": lr, "img_per_sec": round(result.images_per_second, 2),
            "epoch_seconds": round(result.seconds, 2), "data_wait": round(result.data_wait, 4),
            "skipped_updates": result.skipped_updates,
            "eval_samples": metrics.count if evaluated else ""}


def epoch_line(epoch: int, result: EpochResult, metrics: EvalResult | None, best: bool) -> str:
    line = f"epoch {epoch}: train_loss {result.loss:.4f}  "
    if metrics is not None:
        line += f"eval_loss {metrics.loss:.4f}  top1 {metrics.top1:.2f}  top5 {metrics.top5:.2f}  "
    else:
        line += "(not validated: --val-interval)  "
    line += f"{result.images_per_second:.1f} img/s"
    if best:
        line += "  (best)"
    if result.skipped_updates:
        line += f"  {result.skipped_updates} updates skipped by the GradScaler"
    return line


def export_best(args: argparse.Namespace, out_dir: Path, num_classes: int, classes: list[str],
                data_config: dict[str, Any], use_ema: bool) -> Path:
    """Export the best epoch's weights (EMA weights when EMA was tracked) as a model folder."""
    model = create_model(args.model, pretrained=False, num_classes=num_classes, in_chans=args.in_chans,
                         model_kwargs=args.model_kwargs)
    model.load_state_dict(read_state_dict(out_dir / BEST, use_ema=use_ema))
    return export_model_folder(model, out_dir / "model", classes, data_config)


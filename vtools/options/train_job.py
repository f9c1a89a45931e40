"""A training job's options as frozen dataclasses, one per concern, composed into :class:`TrainJob`.

As torchtitan's ``job_config`` does, the training code takes the concern it reads (the model builder a
:class:`ModelOptions`, the recipe an :class:`OptimOptions`), not a bag of flags. Each of train.py's own
options is declared here once, as a field with :func:`~vtools.options.declare.option`: its flags, default,
help, allowed values and whether a resume may change it. train.py's parser (vtools/cli/train_flags.py) is
generated from these fields, and its checks, which the Python API runs too, read them. A field without a
declaration is a flag other commands share, declared once in vtools/options/shared.py. The command edge
fills the concerns from its parse (``vtools.cli.typed.typed_options``); timm's refused and no-op flags
(vtools/options/train_compat.py) change nothing, and :class:`TimmOnlyOptions` only keeps them for config.yaml.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from vtools.options import values
from vtools.options.declare import (
    ABOVE_ZERO,
    AUG_REPEATS,
    BETAS,
    DROP_RATE,
    FRACTION,
    LOW_HIGH,
    NOT_NEGATIVE,
    POSITIVE,
    declared_fields,
    flat_values,
    option,
    option_names,
)
from vtools.options.shared import (
    DeviceFlags,
    EvalModelFlags,
    LoadingFlags,
    ModelFlags,
    NaflexFlags,
    PreprocessFlags,
    ResultFlags,
    RunFileFlags,
    SourceFlags,
    TrackingFlags,
)
from vtools.options.train_compat import FeatureDistillFlags, TimmTrainFlags
from vtools.runtime.options import RuntimeOptions


@dataclass(frozen=True, kw_only=True)
class DataOptions:
    """Where the images come from, how they are read, and the batch sizes the loaders make."""

    title: ClassVar[str] = "data"  # its group in --help

    data: str | None  # the positional DIR; --data-dir is its timm spelling
    data_dir: str | None
    dataset: str  # '' for image folders, else a reader prefix (torch/, hfds/, wds/, ...)
    dataset_download: bool
    input_key: str | None
    target_key: str | None
    class_map: str  # a file naming the classes, '' for the folders' own
    input_img_mode: str | None  # the Pillow mode images are decoded to; None: the model's
    train_split: str = option(
        "--train-split", default="train", help="training split: folder, split name or shard pattern (default: train)"
    )
    val_split: str = option(
        "--val-split",
        default="validation",
        help="validation split; val, eval... folders are found too (default: validation)",
    )
    on_bad_image: str  # error or skip
    batch_size: int  # per process; the run may fit it to a tiny set (fit_batch_to_set)
    validation_batch_size: int | None = option(
        "--validation-batch-size", "-vb", default=None, resume=True, allowed=POSITIVE, help="(default: --batch-size)"
    )
    balanced_sampler: bool = option(
        "--balanced-sampler",
        default=False,
        help="draw each epoch's training images by inverse class frequency (with replacement), so every class "
        "comes equally often; seeded, sharded across processes, resumable mid-epoch",
    )
    wds_shuffle_size: int = option(
        "--wds-shuffle-size",
        default=8192,
        metavar="N",
        allowed=POSITIVE,
        help="wds/ shards streamed from a server (an http(s):// URL or pipe: command as --data-dir or split): "
        "samples each loader worker holds to shuffle the stream, as timm's WDS_SHUFFLE_SIZE (default: 8192; "
        "1: the shards' own order); memory: N encoded images per worker; part of the run: a resume needs "
        "the same N to skip exactly the samples it trained (docs/data.md#shards-from-a-server)",
    )


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """The architecture, its weights, the layers' regularisation, the input it expects and how it is
    compiled and laid out."""

    title: ClassVar[str] = "model"  # its group in --help

    model: str
    pretrained: bool
    pretrained_path: str | None = option(
        "--pretrained-path",
        default=None,
        metavar="PATH",
        resume=True,
        help="pretrained weights file for --model (its classifier is adapted to --num-classes)",
    )
    initial_checkpoint: str = option(
        "--initial-checkpoint", default="", metavar="PATH", resume=True, help="weights to start from"
    )
    num_classes: int | None  # None: the data's class count
    in_chans: int | None
    model_kwargs: dict[str, Any]
    gp: str | None  # global pool type
    grad_checkpointing: bool = option(
        "--grad-checkpointing",
        default=False,
        resume=True,
        help="recompute activations in the backward pass (less memory, about a third more compute)",
    )
    head_init_scale: float | None = option(
        "--head-init-scale", default=None, help="scale the classifier's initial weights"
    )
    head_init_bias: float | None = option(
        "--head-init-bias", default=None, help="initial value of the classifier's bias"
    )
    bn_momentum: float | None = option(
        "--bn-momentum", default=None, allowed=FRACTION, help="BatchNorm momentum (default: the model's)"
    )
    bn_eps: float | None = option(
        "--bn-eps", default=None, allowed=ABOVE_ZERO, help="BatchNorm epsilon (default: the model's)"
    )
    drop: float = option("--drop", default=0.0, allowed=DROP_RATE, help="dropout rate (default: 0)")
    drop_connect: float | None = option(
        "--drop-connect", default=None, allowed=DROP_RATE, help="old name of --drop-path (used when --drop-path is not)"
    )
    drop_path: float | None = option("--drop-path", default=None, allowed=DROP_RATE, help="stochastic depth rate")
    drop_block: float | None = option("--drop-block", default=None, allowed=DROP_RATE, help="DropBlock rate")
    # preprocessing the model's data config is overridden with (timm's resolve_data_config reads them)
    img_size: int | None
    input_size: list[int] | None  # channels height width
    crop_pct: float | None
    crop_mode: str | None
    mean: list[float] | None
    std: list[float] | None
    interpolation: str  # '' for the model's own
    channels_last: bool | None  # None: auto
    torchcompile: str | None  # a torch.compile backend, None for eager
    torchcompile_mode: str | None


@dataclass(frozen=True, kw_only=True)
class OptimOptions:
    """The optimizer, the update step, the learning-rate schedule and the weights' moving average."""

    title: ClassVar[str] = "optimizer, schedule and weight average"  # its group in --help

    opt: str = option("--opt", default="sgd", help="timm optimizer name (default: sgd)")
    opt_eps: float | None = option(
        "--opt-eps", default=None, allowed=NOT_NEGATIVE, help="optimizer epsilon (default: the optimizer's)"
    )
    opt_betas: list[float] | None = option(
        "--opt-betas", default=None, nargs="+", allowed=BETAS, help="optimizer betas (default: the optimizer's)"
    )
    momentum: float = option("--momentum", default=0.9, allowed=FRACTION, help="SGD momentum (default: 0.9)")
    weight_decay: float = option(
        "--weight-decay", default=2e-5, allowed=NOT_NEGATIVE, help="weight decay (default: 2e-5)"
    )
    layer_decay: float | None = option("--layer-decay", default=None, allowed=ABOVE_ZERO, help="layer-wise lr decay")
    layer_decay_min_scale: float = option(
        "--layer-decay-min-scale",
        default=0,
        allowed=NOT_NEGATIVE,
        help="floor of the layer-decay lr scale (default: 0)",
    )
    layer_decay_no_opt_scale: float | None = option(
        "--layer-decay-no-opt-scale",
        default=None,
        allowed=NOT_NEGATIVE,
        help="layers whose layer-decay scale falls below this are frozen",
    )
    opt_kwargs: dict[str, Any] = option(
        "--opt-kwargs",
        default={},
        nargs="*",
        action=values.KEY_VALUE_PAIRS,
        metavar="KEY=VALUE",
        help="extra keyword arguments for the optimizer",
    )
    clip_grad: float | None = option(
        "--clip-grad", default=None, allowed=ABOVE_ZERO, help="gradient clipping threshold"
    )
    clip_mode: Literal["norm", "value", "agc"] = option(
        "--clip-mode", default="norm", help="gradient clipping mode (default: norm)"
    )
    grad_accum_steps: int = option(
        "--grad-accum-steps", default=1, allowed=POSITIVE, help="batches per optimizer update"
    )
    synchronize_step: bool = option(
        "--synchronize-step",
        default=False,
        resume=True,
        help="wait for the device after every update (timing and debugging; slower)",
    )
    sched: str = option("--sched", default="cosine", help="timm scheduler (cosine, step, multistep, plateau, ...)")
    sched_on_updates: bool = option("--sched-on-updates", default=False, help="step the schedule per update")
    lr: float | None = option(
        "--lr", default=None, allowed=NOT_NEGATIVE, help="learning rate (default: scaled from --lr-base)"
    )
    lr_base: float = option(
        "--lr-base", default=0.1, allowed=NOT_NEGATIVE, help="lr for a global batch of --lr-base-size"
    )
    lr_base_size: int = option(
        "--lr-base-size", default=256, allowed=POSITIVE, help="global batch size --lr-base is given for (default: 256)"
    )
    lr_base_scale: str = option(
        "--lr-base-scale",
        default="",
        choices=("", "linear", "sqrt"),
        help="how lr scales with batch size (default: sqrt for adaptive optimizers, else linear)",
    )
    warmup_lr: float = option(
        "--warmup-lr", default=1e-5, allowed=NOT_NEGATIVE, help="learning rate at the start of warmup (default: 1e-5)"
    )
    min_lr: float = option("--min-lr", default=0.0, allowed=NOT_NEGATIVE, help="floor of the schedule (default: 0)")
    epochs: int = option("--epochs", default=300, resume=True, allowed=POSITIVE, help="epochs to train (default: 300)")
    decay_epochs: float = option(
        "--decay-epochs", default=90, allowed=ABOVE_ZERO, help="epochs between step decays (default: 90)"
    )
    decay_milestones: list[int] = option(
        "--decay-milestones",
        default=[90, 180, 270],
        nargs="+",
        help="epochs at which multistep decays (default: 90 180 270)",
    )
    decay_rate: float = option(
        "--decay-rate", "--dr", default=0.1, allowed=NOT_NEGATIVE, help="lr multiplier at each decay (default: 0.1)"
    )
    warmup_epochs: int = option(
        "--warmup-epochs", default=5, allowed=NOT_NEGATIVE, help="linear warmup epochs (default: 5)"
    )
    warmup_prefix: bool = option(
        "--warmup-prefix", default=False, help="warmup epochs come before, not within, the schedule"
    )
    cooldown_epochs: int = option(
        "--cooldown-epochs", default=0, allowed=NOT_NEGATIVE, help="epochs at --min-lr after the schedule (default: 0)"
    )
    patience_epochs: int = option(
        "--patience-epochs", default=10, allowed=NOT_NEGATIVE, help="plateau schedule patience (default: 10)"
    )
    lr_noise: list[float] | None = option(
        "--lr-noise",
        default=None,
        nargs="+",
        metavar="FRACTION",
        help="add lr noise from (and until) these fractions of the schedule",
    )
    lr_noise_pct: float = option(
        "--lr-noise-pct", default=0.67, allowed=NOT_NEGATIVE, help="lr noise limit (default: 0.67)"
    )
    lr_noise_std: float = option(
        "--lr-noise-std", default=1.0, allowed=NOT_NEGATIVE, help="lr noise std-dev (default: 1)"
    )
    # timm takes the logarithm to base --lr-cycle-mul and raises t to the power --lr-k-decay: 0 or below fails
    lr_cycle_mul: float = option(
        "--lr-cycle-mul",
        default=1.0,
        allowed=ABOVE_ZERO,
        help="cycle length multiplier of cosine/tanh/poly (default: 1)",
    )
    lr_cycle_decay: float = option(
        "--lr-cycle-decay", default=0.5, allowed=NOT_NEGATIVE, help="lr multiplier per cycle (default: 0.5)"
    )
    lr_cycle_limit: int = option("--lr-cycle-limit", default=1, allowed=POSITIVE, help="number of cycles (default: 1)")
    lr_k_decay: float = option(
        "--lr-k-decay", default=1.0, allowed=ABOVE_ZERO, help="k-decay of cosine/poly (default: 1)"
    )
    model_ema: bool = option("--model-ema", default=False, help="track an EMA of the weights")
    model_ema_decay: float = option(
        "--model-ema-decay", default=0.9998, allowed=FRACTION, help="EMA decay (default: 0.9998)"
    )
    model_ema_warmup: bool = option(
        "--model-ema-warmup", default=False, help="ramp the EMA decay up over the first updates"
    )
    model_ema_force_cpu: bool = option(
        "--model-ema-force-cpu",
        default=False,
        help="keep the EMA weights on the host (as timm, the EMA is then not validated: the best checkpoint "
        "follows the trained weights)",
    )


@dataclass(frozen=True, kw_only=True)
class AugmentOptions:
    """Training-time augmentation (timm's transform, random erasing, mixup/CutMix, repeated order) and the
    loss's label regularisation."""

    title: ClassVar[str] = "augmentation and regularization"  # its group in --help

    no_aug: bool = option("--no-aug", default=False, help="no training augmentation")
    train_crop_mode: str | None = option(
        "--train-crop-mode", default=None, metavar="MODE", help="training crop: rrc (default) or rkrc, rkrr"
    )
    scale: list[float] = option(
        "--scale", default=[0.08, 1.0], nargs="+", allowed=LOW_HIGH, help="random resized crop scale"
    )
    ratio: list[float] = option(
        "--ratio", default=[3 / 4, 4 / 3], nargs="+", allowed=LOW_HIGH, help="random resized crop ratio"
    )
    hflip: float = option("--hflip", default=0.5, allowed=FRACTION, help="horizontal flip probability (default: 0.5)")
    vflip: float = option("--vflip", default=0.0, allowed=FRACTION, help="vertical flip probability (default: 0)")
    color_jitter: float = option(
        "--color-jitter", default=0.4, allowed=NOT_NEGATIVE, help="color jitter strength (default: 0.4)"
    )
    color_jitter_prob: float | None = option(
        "--color-jitter-prob", default=None, allowed=FRACTION, help="probability of color jitter (default: always)"
    )
    grayscale_prob: float | None = option(
        "--grayscale-prob", default=None, allowed=FRACTION, help="probability of grayscale conversion"
    )
    gaussian_blur_prob: float | None = option(
        "--gaussian-blur-prob", default=None, allowed=FRACTION, help="probability of gaussian blur"
    )
    aa: str | None = option("--aa", default=None, help="AutoAugment/RandAugment policy, e.g. rand-m9-mstd0.5-inc1")
    train_interpolation: str = option(
        "--train-interpolation", default="random", help="training resize interpolation (default: random)"
    )
    reprob: float = option("--reprob", default=0.0, allowed=FRACTION, help="random erasing probability (on the device)")
    remode: Literal["const", "rand", "pixel"] = option(
        "--remode", default="pixel", help="random erasing fill (default: pixel)"
    )
    recount: int = option(
        "--recount", default=1, allowed=POSITIVE, help="most random erasing boxes per image (default: 1)"
    )
    mixup: float = option("--mixup", default=0.0, allowed=NOT_NEGATIVE, help="mixup alpha")
    cutmix: float = option("--cutmix", default=0.0, allowed=NOT_NEGATIVE, help="cutmix alpha")
    cutmix_minmax: list[float] | None = option(
        "--cutmix-minmax",
        default=None,
        nargs="+",
        allowed=LOW_HIGH,
        help="cutmix box ratio range (replaces the cutmix alpha)",
    )
    mixup_prob: float = option(
        "--mixup-prob", default=1.0, allowed=FRACTION, help="probability of mixing a batch (default: 1)"
    )
    mixup_switch_prob: float = option(
        "--mixup-switch-prob",
        default=0.5,
        allowed=FRACTION,
        help="probability of cutmix instead of mixup when both are on (default: 0.5)",
    )
    mixup_mode: str = option(
        "--mixup-mode",
        default="batch",
        choices=("batch", "pair", "elem"),
        help="mix per batch, pair or element (default: batch)",
    )
    mixup_off_epoch: int = option(
        "--mixup-off-epoch", default=0, allowed=NOT_NEGATIVE, help="turn mixup off from this epoch (0: never)"
    )
    smoothing: float = option("--smoothing", default=0.1, allowed=DROP_RATE, help="label smoothing")
    bce_loss: bool = option(
        "--bce-loss",
        default=False,
        help="binary cross-entropy loss (with --smoothing or mixup; plain cross-entropy otherwise, as timm)",
    )
    bce_sum: bool = option("--bce-sum", default=False, help="sum the BCE loss over classes")
    bce_target_thresh: float | None = option(
        "--bce-target-thresh", default=None, allowed=FRACTION, help="binarize BCE targets at this threshold"
    )
    bce_pos_weight: float | None = option(
        "--bce-pos-weight", default=None, allowed=NOT_NEGATIVE, help="BCE weight of positive targets"
    )
    class_weights: str = option(
        "--class-weights",
        default="",
        metavar="balanced|FILE",
        help="weight each class's loss term: 'balanced' by inverse class frequency (scikit-learn's formula), or "
        "a file of weights (JSON object or list, or CSV class,weight rows); for imbalanced classes (default: off)",
    )
    aug_repeats: float = option(
        "--aug-repeats",
        default=0,
        metavar="N",
        allowed=AUG_REPEATS,
        help="repeated augmentation: each image N times per epoch, spread over the processes (timm's "
        "RepeatAugSampler; DeiT recipes use 3) (default: 0, off)",
    )


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Where the run writes, how it resumes and checkpoints, its seed and its validation."""

    title: ClassVar[str] = "run"  # its group in --help

    output: str = option(
        "--output", default="", metavar="DIR", resume=True, help="parent folder of run folders (default: runs)"
    )
    experiment: str = option(
        "--experiment", default="", resume=True, help="run folder name (default: <model>-<timestamp>)"
    )
    resume: str = option(
        "--resume",
        default="",
        metavar="PATH",
        resume=True,
        help="checkpoint to resume, or auto: the last checkpoint of --experiment, or without "
        "one of the newest <model>-<timestamp> run in --output",
    )
    no_resume_opt: bool = option(
        "--no-resume-opt",
        default=False,
        resume=True,
        help="with --resume: restart the optimizer and GradScaler state, keep weights and position",
    )
    start_epoch: int | None = option(
        "--start-epoch",
        default=None,
        metavar="N",
        resume=True,
        allowed=NOT_NEGATIVE,
        help="epoch to start at (the schedule starts there too); overrides a resumed position",
    )
    checkpoint_hist: int = option(
        "--checkpoint-hist", default=10, resume=True, allowed=NOT_NEGATIVE, help="numbered checkpoints to keep"
    )
    recovery_interval: int | str = option(
        "--recovery-interval",
        default=0,
        type=values.recovery_interval,
        metavar="N|TIME",
        resume=True,
        help="also save a recovery checkpoint every N updates, or every TIME of training (900s, 30m, 2h), "
        "written in the background; --resume auto continues from the newest checkpoint (default: 0, off)",
    )
    recovery_keep: int = option(
        "--recovery-keep",
        default=2,
        metavar="K",
        resume=True,
        allowed=POSITIVE,
        help="recovery checkpoints to keep (default: 2)",
    )
    eval_metric: str = option(
        "--eval-metric",
        default="top1",
        choices=("top1", "top5", "loss", "map"),
        help="metric that picks the best checkpoint; map (mean average precision) for multi-label data, which "
        "takes it whatever is given (default: top1)",
    )
    threshold: float  # multi-label data: the probability from which a class counts as predicted
    early_stop_patience: int = option(
        "--early-stop-patience",
        default=0,
        metavar="N",
        resume=True,
        allowed=NOT_NEGATIVE,
        help="stop the run once --eval-metric has not improved for N validations in a row (epochs that "
        "--val-interval skips do not count); the best model folder is still exported (default: 0, off)",
    )
    early_stop_min_delta: float = option(
        "--early-stop-min-delta",
        default=0.0,
        metavar="D",
        resume=True,
        allowed=NOT_NEGATIVE,
        help="an improvement for --early-stop-patience must beat the best by more than D (default: 0.0)",
    )
    val_interval: int = option(
        "--val-interval",
        default=1,
        metavar="N",
        resume=True,
        allowed=POSITIVE,
        help="validate and keep numbered checkpoints every N epochs and after the last (default: 1)",
    )
    seed: int
    no_cpu_fallback: bool  # an operator that falls back to the cpu stops the run
    config: str  # the -c run file the options came from ('' for none); config.yaml leaves it out


@dataclass(frozen=True, kw_only=True)
class DistributedOptions:
    """How the processes of a distributed run talk and share BatchNorm statistics."""

    title: ClassVar[str] = "distributed"  # its group in --help

    dist_backend: str | None = option(
        "--dist-backend", default=None, resume=True, help="override the collective backend (default: per device)"
    )
    dist_timeout: float = option(
        "--dist-timeout",
        default=1800.0,
        type=values.collective_seconds,
        metavar="SECONDS",
        resume=True,
        help="under torchrun: how long a collective, or a rank's silence, may last before the job ends "
        "naming the rank that stopped (default: 1800, torch's own)",
    )
    sync_bn: bool = option("--sync-bn", default=False, help="synchronized BatchNorm under DDP")
    dist_bn: str = option(
        "--dist-bn",
        default="reduce",
        choices=("reduce", "broadcast", ""),
        help="after each epoch under DDP, average (reduce) BatchNorm statistics over the processes, or copy "
        "rank 0's (broadcast), or leave each rank's ('') (default: reduce)",
    )
    no_ddp_bb: bool = option("--no-ddp-bb", default=False, help="DDP does not broadcast buffers before each forward")


@dataclass(frozen=True, kw_only=True)
class LoggingOptions:
    """What the run reports while it trains."""

    title: ClassVar[str] = "logging"  # its group in --help

    log_interval: int = option(
        "--log-interval",
        default=50,
        resume=True,
        allowed=POSITIVE,
        help="batches between loss checks and bar updates; under torchrun also the updates "
        "between the ranks' checks for a stop signal (default: 50)",
    )
    profile: int  # steps profiled (0: none)


@dataclass(frozen=True, kw_only=True)
class DistillOptions:
    """Logit distillation from a teacher model (off without --kd-model-name)."""

    title: ClassVar[str] = "knowledge distillation (timm.task)"  # its group in --help

    kd_model_name: str | None = option(
        "--kd-model-name",
        default=None,
        metavar="NAME",
        help="teacher model (pretrained): a timm name, hf-hub:..., or a model folder; it is rebuilt, "
        "not saved, on resume",
    )
    kd_loss_type: str = option("--kd-loss-type", default="kl", choices=("kl",), help="distillation loss (default: kl)")
    distill_loss_weight: float | None = option(
        "--distill-loss-weight",
        default=None,
        allowed=NOT_NEGATIVE,
        help="weight of the distillation loss (default: 1, or 1 - --task-loss-weight when only that is given)",
    )
    task_loss_weight: float | None = option(
        "--task-loss-weight", default=None, allowed=NOT_NEGATIVE, help="weight of the task loss (default: 1)"
    )
    kd_temperature: float = option(
        "--kd-temperature", default=4.0, allowed=ABOVE_ZERO, help="softmax temperature (default: 4)"
    )


@dataclass(frozen=True, kw_only=True)
class TimmOnlyOptions:
    """timm's train.py flags that act on nothing here: refused at any value but timm's default, or accepted
    without effect (each declaration says why). No training code reads them; the job keeps their values so
    that config.yaml holds every key of timm's args.yaml and a timm user's file round-trips."""

    title: ClassVar[str] = "timm's flags without effect here"

    train: TimmTrainFlags
    feature_distill: FeatureDistillFlags
    pin_mem: bool
    no_prefetcher: bool
    torchscript: bool
    fuser: str
    dataset_trust_remote_code: bool
    naflex_loader: bool
    naflex_train_seq_lens: list[int]
    naflex_max_seq_len: int
    naflex_patch_sizes: list[int] | None
    naflex_patch_size_probs: list[float] | None
    naflex_patchify_channels_first: bool
    naflex_loss_scale: str


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    """Every option of a training run, by concern: the only carrier of train.py's options below the command
    line (config.yaml, the checkpoints' options, the trackers' parameters and the resume check are made
    from it, :meth:`values`)."""

    data: DataOptions
    model: ModelOptions
    optim: OptimOptions
    augment: AugmentOptions
    run: RunOptions
    distributed: DistributedOptions
    logging: LoggingOptions
    tracking: TrackingFlags  # the trackers, the concern validate.py has too (vtools/observe/run_trackers.py)
    distill: DistillOptions
    runtime: RuntimeOptions
    timm: TimmOnlyOptions

    def values(self) -> dict[str, Any]:
        """Every option by its flag's name (timm's args.yaml keys), as config.yaml and the checkpoints hold them."""
        return flat_values(self)


def job_concerns() -> tuple[type, ...]:
    """The concerns :class:`TrainJob` is made of, in its order."""
    hints = typing.get_type_hints(TrainJob)
    return tuple(hints[field.name] for field in dataclasses.fields(TrainJob))


# the shared declarations train.py's flags draw from (vtools/cli/train_flags.py), beside the job's own
SHARED_CONCERNS = (
    RunFileFlags,
    DeviceFlags,
    ModelFlags,
    PreprocessFlags,
    SourceFlags,
    LoadingFlags,
    NaflexFlags,
    EvalModelFlags,
    ResultFlags,
    TrackingFlags,
)


def resume_changeable() -> frozenset[str]:
    """The options a resumed run may give another value than the run it continues, as their declarations
    mark them (``resume=True``): where things go, how fast they run, how much is logged. Every other
    option is compared with the checkpoint's (vtools/train/resume.py)."""
    marked = {field.name for concern in SHARED_CONCERNS for field, found in declared_fields(concern) if found.resume}
    return frozenset((marked | _marked_in(TrainJob)) & option_names(TrainJob))


def _marked_in(cls: type) -> set[str]:
    """The names of ``cls``'s fields declared ``resume=True``, in its nested concerns too."""
    hints = typing.get_type_hints(cls)
    marked = {field.name for field, found in declared_fields(cls) if found.resume}
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[field.name]):
            marked |= _marked_in(hints[field.name])
    return marked

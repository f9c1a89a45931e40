"""A training job's options as frozen dataclasses, one per concern, composed into :class:`TrainJob`.

As torchtitan's ``job_config`` does, the training code takes the concern it reads (the model builder a
:class:`ModelOptions`, the recipe an :class:`OptimOptions`), not a bag of flags. The command edge
(vtools/commands/train.py) fills these once from the parsed Namespace with ``vtools.cli.typed.typed_options``;
field names are train.py's argparse dests. There are no defaults here: every flag's default lives in its
definition (vtools/cli/train_flags.py, vtools/cli/options.py), once. timm's refused and no-op flags
(vtools/cli/timm_compat.py) change nothing, so no concern holds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vtools.runtime.resolve import RuntimeOptions


@dataclass(frozen=True)
class DataOptions:
    """Where the images come from, how they are read, and the batch sizes the loaders make."""

    data: str | None  # the positional DIR; --data-dir is its timm spelling
    data_dir: str | None
    dataset: str  # '' for image folders, else a reader prefix (torch/, hfds/, wds/, ...)
    dataset_download: bool
    input_key: str | None
    target_key: str | None
    class_map: str  # a file naming the classes, '' for the folders' own
    input_img_mode: str | None  # the Pillow mode images are decoded to; None: the model's
    train_split: str
    val_split: str
    on_bad_image: str  # error or skip
    batch_size: int  # per process; the run may fit it to a tiny set (fit_batch_to_set)
    validation_batch_size: int | None  # None: --batch-size
    balanced_sampler: bool  # draw training images by inverse class frequency
    wds_shuffle_size: int  # shards streamed from a server: each worker's shuffle buffer, in samples


@dataclass(frozen=True)
class ModelOptions:
    """The architecture, its weights, the layers' regularisation, the input it expects and how it is
    compiled and laid out."""

    model: str
    pretrained: bool
    pretrained_path: str | None  # weights whose classifier is adapted to this run's classes
    initial_checkpoint: str  # weights loaded as they are ('' for none)
    num_classes: int | None  # None: the data's class count
    in_chans: int | None
    model_kwargs: dict[str, Any]
    gp: str | None  # global pool type
    grad_checkpointing: bool
    head_init_scale: float | None
    head_init_bias: float | None
    bn_momentum: float | None
    bn_eps: float | None
    drop: float  # dropout rate
    drop_connect: float | None  # drop-path's old name
    drop_path: float | None
    drop_block: float | None
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


@dataclass(frozen=True)
class OptimOptions:
    """The optimizer, the update step, the learning-rate schedule and the weights' moving average."""

    opt: str
    opt_eps: float | None
    opt_betas: list[float] | None
    momentum: float
    weight_decay: float
    layer_decay: float | None
    layer_decay_min_scale: float
    layer_decay_no_opt_scale: float | None
    opt_kwargs: dict[str, Any]
    clip_grad: float | None
    clip_mode: str
    grad_accum_steps: int
    synchronize_step: bool  # wait for the device after every step (timm's --synchronize-step)
    sched: str
    sched_on_updates: bool
    lr: float | None  # None: --lr-base scaled by the global batch
    lr_base: float
    lr_base_size: int
    lr_base_scale: str  # '' (by the optimizer), linear or sqrt
    warmup_lr: float
    min_lr: float
    epochs: int
    decay_epochs: float
    decay_milestones: list[int]
    decay_rate: float
    warmup_epochs: int
    warmup_prefix: bool
    cooldown_epochs: int
    patience_epochs: int
    lr_noise: list[float] | None
    lr_noise_pct: float
    lr_noise_std: float
    lr_cycle_mul: float
    lr_cycle_decay: float
    lr_cycle_limit: int
    lr_k_decay: float
    model_ema: bool
    model_ema_decay: float
    model_ema_warmup: bool
    model_ema_force_cpu: bool  # the EMA kept on the host; validation then uses the trained weights


@dataclass(frozen=True)
class AugmentOptions:
    """Training-time augmentation (timm's transform, random erasing, mixup/CutMix, repeated order) and the
    loss's label regularisation."""

    no_aug: bool
    train_crop_mode: str | None
    scale: list[float]
    ratio: list[float]
    hflip: float
    vflip: float
    color_jitter: float
    color_jitter_prob: float | None
    grayscale_prob: float | None
    gaussian_blur_prob: float | None
    aa: str | None  # auto-augment policy
    train_interpolation: str
    reprob: float  # random erasing probability
    remode: str
    recount: int
    mixup: float  # mixup alpha
    cutmix: float  # CutMix alpha
    cutmix_minmax: list[float] | None
    mixup_prob: float
    mixup_switch_prob: float
    mixup_mode: str
    mixup_off_epoch: int  # 0: never off
    smoothing: float  # label smoothing
    bce_loss: bool
    bce_sum: bool
    bce_target_thresh: float | None
    bce_pos_weight: float | None
    class_weights: str  # 'balanced', a weights file, or '' for none
    aug_repeats: float  # timm's repeated-augmentation order (0: off)


@dataclass(frozen=True)
class RunOptions:
    """Where the run writes, how it resumes and checkpoints, its seed and its validation."""

    output: str  # the folder of runs ('' for runs/)
    experiment: str  # the run folder's name ('' for <model>-<time>)
    resume: str  # a checkpoint, 'auto', or '' for a new run
    no_resume_opt: bool
    start_epoch: int | None
    checkpoint_hist: int  # numbered checkpoints kept
    recovery_interval: int | str  # updates (int) or a time of training ('30m') between recovery checkpoints
    recovery_keep: int  # recovery checkpoints kept
    eval_metric: str  # what makes an epoch the best
    threshold: float  # multi-label data: the probability from which a class counts as predicted
    early_stop_patience: int  # validations without improvement of eval_metric that end the run (0: off)
    early_stop_min_delta: float  # how much eval_metric must beat its best by to count as an improvement
    val_interval: int  # validate every N epochs (and the last)
    seed: int
    no_cpu_fallback: bool  # an operator that falls back to the cpu stops the run


@dataclass(frozen=True)
class DistributedOptions:
    """How the processes of a distributed run talk and share BatchNorm statistics."""

    dist_backend: str | None  # None: the device type's own
    dist_timeout: float  # seconds a collective or a silent rank may take before the job ends
    sync_bn: bool
    dist_bn: str  # reduce, broadcast or '' after each epoch
    no_ddp_bb: bool  # DDP without broadcasting buffers


@dataclass(frozen=True)
class LoggingOptions:
    """What the run reports while it trains."""

    log_interval: int  # steps between log lines
    log_tensorboard: bool
    log_wandb: bool
    wandb_project: str | None  # None: W&B's default project
    wandb_tags: list[str]
    wandb_resume_id: str  # '' for the run folder's own W&B run
    log_mlflow: str | None  # a tracking URI, '' for MLflow's default, None: off
    mlflow_experiment: str | None  # None: MLFLOW_EXPERIMENT_NAME, else MLflow's Default
    mlflow_artifacts: bool  # upload the model folder and the class report at the end
    profile: int  # steps profiled (0: none)


@dataclass(frozen=True)
class DistillOptions:
    """Logit distillation from a teacher model (off without --kd-model-name)."""

    kd_model_name: str | None
    kd_loss_type: str
    distill_loss_weight: float | None
    task_loss_weight: float | None
    kd_temperature: float


@dataclass(frozen=True)
class TrainJob:
    """Every option of a training run, by concern."""

    data: DataOptions
    model: ModelOptions
    optim: OptimOptions
    augment: AugmentOptions
    run: RunOptions
    distributed: DistributedOptions
    logging: LoggingOptions
    distill: DistillOptions
    runtime: RuntimeOptions

"""timm's train.py flags that change nothing here or stop the run unless left at timm's default, each
declared once with its reason (vtools/cli/timm_compat.py acts on the marks; the README's compatibility
table lists them). No training concern holds them: the training code never reads them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vtools.options.declare import no_op, refused
from vtools.options.shared import LOADER_NO_OP_REASON

FEATURE_KD_REASON = (
    "feature and token distillation train a projection or token that vtools' checkpoints and model "
    "folders do not hold yet; use --kd-distill-type logit"
)
VARIABLE_SIZE_REASON = (
    "variable-resolution and NaFlex batches need timm's scheduled/NaFlex loaders, which vtools' exact-resume "
    "sampler does not drive yet; train at one --input-size (use timm's train.py for these recipes)"
)
AUGMIX_SPLIT_REASON = (
    "AugMix split batches (--aug-splits, --jsd-loss, --split-bn, --resplit) are not supported by vtools' "
    "device-side batch pipeline yet; use --aa augmix-m9 with the default loss"
)
NUM_SAMPLES_REASON = (
    "timm needs it to size streamed datasets; every vtools source knows its length (shards "
    "streamed from a server: their _info.json, or a |<num_samples> suffix on the split, timm's spelling)"
)


@dataclass(frozen=True, kw_only=True)
class FeatureDistillFlags:
    """timm's feature and token distillation, refused (logit distillation works: DistillOptions)."""

    title: ClassVar[str] = "knowledge distillation (timm.task)"

    kd_distill_type: str = refused(
        "--kd-distill-type", default="logit", choices=("logit", "feature", "token"), reason=FEATURE_KD_REASON
    )
    kd_student_feature_dim: int | None = refused("--kd-student-feature-dim", default=None, reason=FEATURE_KD_REASON)
    kd_teacher_feature_dim: int | None = refused("--kd-teacher-feature-dim", default=None, reason=FEATURE_KD_REASON)
    kd_token_distill_type: str = refused(
        "--kd-token-distill-type", default="soft", choices=("soft", "hard"), reason=FEATURE_KD_REASON
    )


@dataclass(frozen=True, kw_only=True)
class TimmTrainFlags:
    """timm train.py flags accepted for compatibility: no-ops here, or refused unless at timm's default."""

    title: ClassVar[str] = "timm compatibility (see the README's table)"

    train_num_samples: int | None = no_op("--train-num-samples", default=None, reason=NUM_SAMPLES_REASON)
    val_num_samples: int | None = no_op("--val-num-samples", default=None, reason=NUM_SAMPLES_REASON)
    epoch_repeats: float = refused(
        "--epoch-repeats",
        default=0.0,
        reason="timm repeats only streamed (iterable) datasets; every vtools source is indexed: train more "
        "--epochs instead",
    )
    use_multi_epochs_loader: bool = no_op(
        "--use-multi-epochs-loader", default=False, resume=True, reason=LOADER_NO_OP_REASON
    )
    local_rank: int = no_op(
        "--local_rank",
        default=0,
        resume=True,
        reason="the legacy torch.distributed.launch argument; the local rank comes from LOCAL_RANK",
    )
    worker_seeding: str = refused(
        "--worker-seeding",
        default="all",
        reason="vtools seeds every sample from (seed, epoch, index), which keeps resume exact; timm's 'all' "
        "is the only mode that matches that",
    )
    tta: int = refused(
        "--tta",
        default=0,
        reason="timm's train.py test-time augmentation needs a TTA loader that it does not build either",
    )
    save_images: bool = refused(
        "--save-images",
        default=False,
        reason="vtools does not write batch images; look at the augmentation with python3 -m benchmarks "
        "--profile, or with timm's transforms directly",
    )
    aug_splits: int = refused("--aug-splits", default=0, reason=AUGMIX_SPLIT_REASON)
    jsd_loss: bool = refused("--jsd-loss", default=False, reason=AUGMIX_SPLIT_REASON)
    split_bn: bool = refused("--split-bn", default=False, reason=AUGMIX_SPLIT_REASON)
    resplit: bool = refused("--resplit", default=False, reason=AUGMIX_SPLIT_REASON)
    train_img_sizes: list[int] | None = refused(
        "--train-img-sizes", default=None, nargs="+", reason=VARIABLE_SIZE_REASON
    )
    train_batch_sizes: list[int] | None = refused(
        "--train-batch-sizes", default=None, nargs="+", reason=VARIABLE_SIZE_REASON
    )
    train_size_probs: list[float] | None = refused(
        "--train-size-probs", default=None, nargs="+", reason=VARIABLE_SIZE_REASON
    )
    train_size_schedule: str = refused(
        "--train-size-schedule", default="constant", choices=("constant", "progressive"), reason=VARIABLE_SIZE_REASON
    )
    train_size_schedule_spread: float = refused(
        "--train-size-schedule-spread", default=0.65, reason=VARIABLE_SIZE_REASON
    )
    train_size_random_mix: float = refused("--train-size-random-mix", default=0.1, reason=VARIABLE_SIZE_REASON)
    train_batches_per_epoch: int | None = refused(
        "--train-batches-per-epoch", "--train-steps-per-epoch", default=None, reason=VARIABLE_SIZE_REASON
    )
    variable_batch_loss_scale: str = refused(
        "--variable-batch-loss-scale", default="none", choices=("none", "sqrt", "linear"), reason=VARIABLE_SIZE_REASON
    )

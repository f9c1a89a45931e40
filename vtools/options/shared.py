"""The options several commands share, each declared once: the device, the model, its preprocessing, the
data source and the loaders, the evaluation and tracking flags.

A command's parser takes the concerns it has (vtools/cli/declared.py ``add_declared``), with its own
default or help where timm's scripts give one (validate.py's batch of 256 against train.py's 128), never
its own range: ``--img-size 0`` stops in every command that has ``--img-size``, with the same words. Each
concern is a frozen dataclass whose fields are the flags' dests, as the training job's concerns are
(vtools/options/train_job.py).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from vtools.options.declare import (
    FRACTION,
    POSITIVE,
    Allowed,
    between,
    no_op,
    option,
    refused,
)
from vtools.options.values import (
    AMP_DTYPE_CHOICES,
    INTERPOLATIONS,
    KEY_VALUE_PAIRS,
    MAX_THREADS,
    ON_BAD_IMAGE_CHOICES,
    interpolation_name,
    model_dtype_name,
)

# timm's own pretrained configs go up to 1.15 (VOLO at 448 px: a thin border around the whole image)
MAX_CROP_PCT = 2.0


def _percentage_hint(crop_pct: float) -> str:
    return f" (a percentage? {crop_pct:g} % is {crop_pct / 100:g})" if 10 <= crop_pct <= 100 else ""


# --crop-pct is the crop's side over the resized image's side: timm resizes to input size / crop_pct and cuts
# the centre. 0 is no size at all (timm silently takes its default 0.875 instead); above 1 the image is smaller
# than the crop and the rest is border; above 2 it would fill less than a quarter of the input (50: a percentage)
CROP_PCT = Allowed(
    lambda v: 0 < v <= MAX_CROP_PCT,
    f"must be above 0 and at most {MAX_CROP_PCT:g}: the crop's share of the resized image's side (0.875 keeps "
    "the centre 87.5 %, 1 the whole image)",
    hint=_percentage_hint,
)
INPUT_SIZE = Allowed(lambda v: min(v) > 0, "needs three positive numbers (channels height width)")
NOT_ZERO = Allowed(lambda v: min(abs(x) for x in v) != 0, "must not be 0 (normalization divides by it)")
WORKERS = Allowed(lambda v: v >= 0, "must be 0 (load in the main process) or more")
PROFILE_STEPS = Allowed(lambda v: v >= 0, "must be 0 (off) or a number of steps")

WORKERS_HELP = (
    "loader processes (default: from the cpu budget: one per 4 cores on cpu, all cores but one on an "
    "accelerator; at most 8)"
)
TORCHSCRIPT_REASON = "TorchScript is deprecated in torch 2.x and not supported here; use --torchcompile"
FUSER_REASON = "selects a TorchScript fuser, and TorchScript is not supported here; use --torchcompile"
NUM_GPU_REASON = (
    "wraps the model in DataParallel over several GPUs, which is not supported here: one process runs "
    "on one device; choose it with --device (e.g. cuda:1, npu:1)"
)
AOT_AUTOGRAD_REASON = (
    "functorch's memory_efficient_fusion (AOT Autograd) is deprecated in torch 2.x and not supported here; "
    "use --torchcompile"
)
TRUST_REMOTE_CODE_REASON = (
    "hfds/ reads datasets' own formats (save_to_disk folders, Parquet), which run no dataset "
    "script; convert a script-based dataset with the datasets library first"
)
LOADER_NO_OP_REASON = (
    "vtools always pins host batches where the device benefits, normalizes on the device, "
    "and keeps its loader workers across epochs"
)
MLFLOW_DEFAULT = ""  # --log-mlflow without a URI: MLFLOW_TRACKING_URI, else MLflow's local default


def mlflow_target(text: str) -> str | None:
    """--log-mlflow's value: a tracking URI, or '' for the default. YAML's ``log_mlflow: true`` means the
    default and ``false`` means off, as they read."""
    lowered = text.strip().lower()
    if lowered == "true":
        return MLFLOW_DEFAULT
    if lowered == "false":
        return None
    return text


# torch seeds its generators from a 64-bit number (and each rank from --seed plus its rank): a larger one
# stops the run inside torch.manual_seed; numpy takes the seed modulo 2**32 (vtools.runtime.device.seed_everything)
SEED = Allowed(lambda v: -(2**63) <= v < 2**63, "must fit in 64 bits (from -2**63 up to 2**63)")


@dataclass(frozen=True, kw_only=True)
class RunFileFlags:
    """The YAML file of options read first (vtools/cli/config.py): defaults < the file < the flags."""

    title: ClassVar[str] = "run file"

    config: str = option(
        "-c", "--config", default="", resume=True, metavar="FILE", help="YAML file of options (keys = flag names)"
    )


@dataclass(frozen=True, kw_only=True)
class DeviceFlags:
    """The device and precision every command that runs a model takes."""

    title: ClassVar[str] = "device and precision"

    no_cpu_fallback: bool = option(
        "--no-cpu-fallback",
        default=False,
        help="stop (exit 3) at the first operator the device backend runs on the host CPU instead "
        "(without it such operators are counted and reported at the end)",
    )
    device: str = option(
        "--device",
        default="auto",
        resume=True,
        metavar="SPEC",
        help="auto (the available accelerator, else cpu), cpu, cuda[:N], npu[:N], xpu[:N], mps, "
        "or any registered PrivateUse1 backend; under torchrun LOCAL_RANK picks N "
        "(default: auto)",
    )
    device_modules: list[str] | None = option(
        "--device-modules",
        default=None,
        resume=True,
        nargs="+",
        metavar="MODULE",
        help="Python modules to import first, for devices that register themselves on import",
    )
    amp: bool = option("--amp", default=False, help="mixed precision through torch.autocast")
    amp_dtype: str = option(
        "--amp-dtype",
        default="auto",
        choices=AMP_DTYPE_CHOICES,
        help="autocast dtype: auto = bfloat16 where the device supports it (a CPU: natively, else float32), "
        "else float16 with a GradScaler (default: auto)",
    )
    device_settings: bool = option(
        "--device-settings",
        default=False,
        help="apply the backend's recommended settings for changing input shapes where the chip does not default "
        "to them (npu: jit_compile off on the Atlas training series, so a new shape does not recompile operators)",
    )
    device_kwargs: dict[str, Any] = option(
        "--device-kwargs",
        default={},
        nargs="*",
        action=KEY_VALUE_PAIRS,
        metavar="NAME=VALUE",
        help="set backend settings by name (npu: jit_compile, allow_hf32, allow_internal_format, each true or "
        "false); python -m vtools env lists them",
    )
    threads: int | None = option(
        "--threads",
        default=None,
        resume=True,
        allowed=between(1, MAX_THREADS),
        metavar="N",
        help=f"intra-op threads of the main process, 1 to {MAX_THREADS} (default: OMP_NUM_THREADS when set, "
        "else the cores this process may use less those other processes keep busy as it starts, and on an "
        "accelerator less the loader workers' cores too)",
    )
    bind_cores: bool = option(
        "--bind-cores",
        default=False,
        resume=True,
        help="pin each process (under torchrun: each rank, to its own share of the cores) and "
        "its loader workers to fixed cores; a backend variable such as CPU_AFFINITY_CONF "
        "takes precedence",
    )
    profile: int = option(
        "--profile",
        default=0,
        resume=True,
        allowed=PROFILE_STEPS,
        metavar="N",
        help="profile N steps of the loop (after 2 warm-up steps) with torch.profiler: a trace "
        "for TensorBoard/Perfetto and the top operators (default: 0, off)",
    )


DEVICE_CHOICE = ("device", "device_modules", "amp", "amp_dtype")  # what every command that runs a model has
DEVICE_TUNING = ("device_settings", "device_kwargs", "threads", "bind_cores", "profile")


@dataclass(frozen=True, kw_only=True)
class ModelFlags:
    """timm's model flags: which model, its weights, its head and how it runs."""

    title: ClassVar[str] = "model"

    model: str | None = option(
        "--model",
        "-m",
        default=None,
        metavar="NAME",
        help="timm model name (optionally with a pretrained tag), hf-hub:ORG/NAME, "
        "local-dir:PATH, or a path to a model folder (config.json + model.safetensors)",
    )
    pretrained: bool = option(
        "--pretrained",
        default=False,
        resume=True,
        help="load pretrained weights (implied for model folders and hub names)",
    )
    checkpoint: str = option(
        "--checkpoint",
        default="",
        metavar="PATH",
        help="weights to load: .safetensors, a timm .pth.tar, or a plain state dict; a folder or glob validates each",
    )
    use_ema: bool = option("--use-ema", default=False, help="load the checkpoint's EMA weights (state_dict_ema)")
    num_classes: int | None = option(
        "--num-classes", default=None, allowed=POSITIVE, help="number of classifier outputs"
    )
    in_chans: int | None = option("--in-chans", default=None, allowed=POSITIVE, help="number of input image channels")
    model_kwargs: dict[str, Any] = option(
        "--model-kwargs",
        default={},
        nargs="*",
        action=KEY_VALUE_PAIRS,
        metavar="KEY=VALUE",
        help="extra keyword arguments for timm.create_model",
    )
    channels_last: bool | None = option(
        "--channels-last",
        default=None,
        resume=True,
        action=argparse.BooleanOptionalAction,
        help="channels_last memory layout (default: on for convolutional models on cpu, cuda "
        "and xpu, where it is faster; off elsewhere)",
    )
    torchcompile: str | None = option(
        "--torchcompile",
        default=None,
        resume=True,
        nargs="?",
        const="inductor",
        metavar="BACKEND",
        help="compile the model with torch.compile (default backend: inductor)",
    )
    torchcompile_mode: str | None = option(
        "--torchcompile-mode",
        default=None,
        resume=True,
        metavar="MODE",
        help="torch.compile mode (default, reduce-overhead, max-autotune, ...)",
    )
    gp: str | None = option("--gp", default=None, metavar="POOL", help="global pool type (avg, max, avgmax, ...)")
    fast_norm: bool = option("--fast-norm", default=False, help="timm's fast (low-precision) norm layers")
    model_dtype: str | None = option(
        "--model-dtype",
        default=None,
        type=model_dtype_name,
        metavar="DTYPE",
        help="cast the model and its inputs to this dtype (float32, bfloat16, float16); "
        "unlike --amp, no float32 master weights",
    )
    torchscript: bool = refused("--torchscript", default=False, reason=TORCHSCRIPT_REASON)
    fuser: str = refused("--fuser", default="", reason=FUSER_REASON)


@dataclass(frozen=True, kw_only=True)
class PreprocessFlags:
    """Overrides of the model's pretrained preprocessing, as in timm's scripts."""

    title: ClassVar[str] = "preprocessing (default: the model's pretrained config)"

    img_size: int | None = option("--img-size", default=None, allowed=POSITIVE, metavar="N", help="input image size")
    input_size: list[int] | None = option(
        "--input-size",
        default=None,
        allowed=INPUT_SIZE,
        nargs=3,
        metavar=("C", "H", "W"),
        help="full input size, e.g. 3 224 224",
    )
    crop_pct: float | None = option("--crop-pct", default=None, allowed=CROP_PCT, help="center crop fraction")
    crop_mode: Literal["center", "squash", "border"] | None = option("--crop-mode", default=None, help="crop mode")
    mean: list[float] | None = option("--mean", default=None, nargs="+", metavar="MEAN", help="normalization mean")
    std: list[float] | None = option(
        "--std", default=None, allowed=NOT_ZERO, nargs="+", metavar="STD", help="normalization std"
    )
    interpolation: str = option(
        "--interpolation",
        default="",
        type=interpolation_name,
        metavar="NAME",
        help=f"resize interpolation: {', '.join(INTERPOLATIONS)} (default: the model's)",
    )


@dataclass(frozen=True, kw_only=True)
class SourceFlags:
    """Where the images are: the positional folder (or source) and its timm spelling --data-dir, and
    timm's --dataset with its options (vtools/data/readers/registry.py)."""

    title: ClassVar[str] = "data"

    data: str | None = option(
        "data", default=None, resume=True, nargs="?", metavar="DIR", help="the images: a folder of class folders"
    )
    data_dir: str | None = option(
        "--data-dir", default=None, resume=True, metavar="DIR", help="same as DIR (timm's flag)"
    )
    dataset: str = option(
        "--dataset",
        "-d",
        default="",
        metavar="NAME",
        help="empty for image folders; torch/<name> (torchvision), wds/<name> (tar shards in "
        "--data-dir), hfds/<name> (a local Hugging Face dataset copy)",
    )
    dataset_download: bool = option(
        "--dataset-download",
        default=False,
        resume=True,
        help="let torchvision (torch/) or the Hub (hfds/) download the dataset",
    )
    input_key: str | None = option(
        "--input-key",
        default=None,
        metavar="KEY",
        help="hfds: image column (default: image); wds: image extensions (default: jpg;png;webp...)",
    )
    class_map: str = option(
        "--class-map",
        default="",
        metavar="FILE",
        help="text file of class names, one per line: line number = label index",
    )
    input_img_mode: str | None = option(
        "--input-img-mode",
        default=None,
        metavar="MODE",
        help="PIL mode images are converted to (RGB, L, ...) (default: from the model's input channels)",
    )
    dataset_trust_remote_code: bool = refused(
        "--dataset-trust-remote-code", default=False, reason=TRUST_REMOTE_CODE_REASON
    )
    target_key: str | None = option(
        "--target-key",
        default=None,
        metavar="KEY",
        help="hfds: label column (default: label); wds: label extension (default: cls)",
    )
    split: str = option(
        "--split",
        default="validation",
        help="the split to read: folder, split name or shard pattern (default: validation)",
    )


@dataclass(frozen=True, kw_only=True)
class LoadingFlags:
    """How batches are made: their size, the loader processes, unreadable images, the log and the seed."""

    title: ClassVar[str] = "loading"

    batch_size: int = option(
        "--batch-size", "-b", default=256, resume=True, allowed=POSITIVE, metavar="N", help="batch size (default: 256)"
    )
    workers: int | None = option(
        "--workers", "-j", default=None, resume=True, allowed=WORKERS, metavar="N", help=WORKERS_HELP
    )
    on_bad_image: str = option(
        "--on-bad-image",
        default="error",
        resume=True,
        choices=ON_BAD_IMAGE_CHOICES,
        help="an unreadable image stops the run naming the file (error), or is logged and "
        "counted (skip) (default: error)",
    )
    log_freq: int = option("--log-freq", default=10, allowed=POSITIVE, metavar="N", help="batches between log lines")
    seed: int = option("--seed", default=42, allowed=SEED, metavar="S", help="random seed (default: 42)")
    pin_mem: bool = no_op("--pin-mem", default=False, resume=True, reason=LOADER_NO_OP_REASON)
    no_prefetcher: bool = no_op("--no-prefetcher", default=False, resume=True, reason=LOADER_NO_OP_REASON)


NAFLEX_REASON = (
    "NaFlex batches (variable-resolution patch sequences) need timm's NaFlex loader, which vtools' exact-resume "
    "sampler does not drive yet; train and validate NaFlexVit models at a fixed size (--img-size)"
)


@dataclass(frozen=True, kw_only=True)
class NaflexFlags:
    """timm's NaFlex flags (native-aspect, variable-sequence ViT batches): refused until vtools' loader
    drives them; train.py has all of them, validate.py the loader and its longest sequence."""

    title: ClassVar[str] = "NaFlex"

    naflex_loader: bool = refused("--naflex-loader", default=False, reason=NAFLEX_REASON)
    naflex_train_seq_lens: list[int] = refused(
        "--naflex-train-seq-lens", default=[128, 256, 576, 784, 1024], nargs="+", reason=NAFLEX_REASON
    )
    naflex_max_seq_len: int = refused("--naflex-max-seq-len", default=576, reason=NAFLEX_REASON)
    naflex_patch_sizes: list[int] | None = refused(
        "--naflex-patch-sizes", default=None, nargs="+", reason=NAFLEX_REASON
    )
    naflex_patch_size_probs: list[float] | None = refused(
        "--naflex-patch-size-probs", default=None, nargs="+", reason=NAFLEX_REASON
    )
    naflex_loss_scale: str = refused(
        "--naflex-loss-scale", default="linear", choices=("none", "sqrt", "linear"), reason=NAFLEX_REASON
    )
    naflex_patchify_channels_first: bool = refused(
        "--naflex-patchify-channels-first", default=False, reason=NAFLEX_REASON
    )


@dataclass(frozen=True, kw_only=True)
class EvalModelFlags:
    """The model flags of timm's evaluation scripts (vtools/evaluation/model_flags.py acts on them)."""

    title: ClassVar[str] = "timm's evaluation model flags"

    use_train_size: bool = option(
        "--use-train-size",
        default=False,
        help="use the model's train input size and crop even when its pretrained config has a test size "
        "(default: the test size, as timm's validate.py)",
    )
    reparam: bool = option(
        "--reparam",
        default=False,
        help="fuse re-parameterizable branches (RepVGG, MobileOne, FastViT...) before validating",
    )
    test_pool: bool = option(
        "--test-pool",
        default=False,
        help="test-time pooling when the input is larger than the model's pretrained size (crop 1.0 then)",
    )
    num_gpu: int = refused("--num-gpu", default=1, reason=NUM_GPU_REASON)
    aot_autograd: bool = refused("--aot-autograd", default=False, reason=AOT_AUTOGRAD_REASON)


@dataclass(frozen=True, kw_only=True)
class ResultFlags:
    """Where a command's rows go: a file, in csv or json, and the multi-label threshold they are scored at."""

    title: ClassVar[str] = "results"

    results_file: str = option("--results-file", default="", metavar="PATH", help="write one row per model here")
    results_format: Literal["csv", "json"] = option("--results-format", default="csv", help="(default: csv)")
    threshold: float = option(
        "--threshold",
        default=0.5,
        resume=True,
        allowed=FRACTION,
        metavar="P",
        help="multi-label models: a class counts as predicted when its probability is at least P (default: 0.5)",
    )


@dataclass(frozen=True, kw_only=True)
class TrackingFlags:
    """The experiment trackers: timm's W&B flags and MLflow's. They choose where figures are sent, never how
    a run trains: a resumed run may change every one of them (vtools/observe/ holds the trackers)."""

    title: ClassVar[str] = "experiment tracking"

    log_tensorboard: bool = option(
        "--log-tensorboard",
        default=False,
        resume=True,
        help="write TensorBoard scalars (per epoch and per log step) to <run>/tensorboard",
    )
    log_wandb: bool = option(
        "--log-wandb",
        default=False,
        resume=True,
        help="log to Weights & Biases: the options, every log step and epoch, the best epoch's per-class "
        "table and the run's summary, into <run>/wandb (WANDB_MODE=offline: there only)",
    )
    wandb_project: str | None = option(
        "--wandb-project", default=None, resume=True, metavar="NAME", help="W&B project (default: W&B's)"
    )
    wandb_tags: list[str] = option("--wandb-tags", default=[], resume=True, nargs="+", metavar="TAG", help="W&B tags")
    wandb_resume_id: str = option(
        "--wandb-resume-id",
        default="",
        resume=True,
        metavar="ID",
        help="continue this W&B run (default: the run folder's own, so that --resume continues its W&B run)",
    )
    log_mlflow: str | None = option(
        "--log-mlflow",
        default=None,
        resume=True,
        nargs="?",
        const=MLFLOW_DEFAULT,
        type=mlflow_target,
        metavar="URI",
        help="log to MLflow at URI (a server's http://host:port, sqlite:///file.db, databricks; "
        "default: $MLFLOW_TRACKING_URI, else MLflow's local mlflow.db and ./mlruns)",
    )
    mlflow_experiment: str | None = option(
        "--mlflow-experiment",
        default=None,
        resume=True,
        metavar="NAME",
        help="MLflow experiment (made if new; default: $MLFLOW_EXPERIMENT_NAME, else MLflow's Default)",
    )
    mlflow_artifacts: bool = option(
        "--mlflow-artifacts",
        default=False,
        resume=True,
        help="with --log-mlflow: also upload the model folder and the class report when the run ends",
    )

"""Command-line options that the scripts share, with timm's flag names, defaults and meanings.

Each flag is added in one function here or in its script's flags module (vtools/cli/*_flags.py); where
timm's scripts give a shared flag a different default or help, the function takes it as an argument.
Nothing here imports torch (vtools/options/values.py says why).
"""

from __future__ import annotations

import argparse

from vtools.cli.parser import MAX_THREADS, KeyValuePairs
from vtools.cli.timm_compat import add_no_op, add_refused
from vtools.options.values import (
    AMP_DTYPE_CHOICES,
    INTERPOLATIONS,
    ON_BAD_IMAGE_CHOICES,
    interpolation_name,
    model_dtype_name,
)

_MAY_CHANGE_ON_RESUME = "vtools_may_change_on_resume"


def may_change_on_resume(action: argparse.Action) -> argparse.Action:
    """Declare, where a flag is defined, that a resumed run may give it another value than the run it
    continues: where things go, how fast they run, how much is logged (vtools/train/resume.py compares
    every other option with the checkpoint's)."""
    setattr(action, _MAY_CHANGE_ON_RESUME, True)
    return action


def resume_changeable(parser: argparse.ArgumentParser) -> frozenset[str]:
    """The dests of ``parser``'s flags declared :func:`may_change_on_resume`."""
    return frozenset(action.dest for action in parser._actions if getattr(action, _MAY_CHANGE_ON_RESUME, False))


WORKERS_HELP = (
    "loader processes (default: from the cpu budget: one per 4 cores on cpu, all cores but one on an "
    "accelerator; at most 8)"
)


def add_device_choice(group: argparse._ArgumentGroup) -> None:
    """--device, --device-modules, --amp and --amp-dtype: the device and precision every command that runs
    a model takes (vtools benchmark too)."""
    may_change_on_resume(
        group.add_argument(
            "--device",
            default="auto",
            metavar="SPEC",
            help="auto (the available accelerator, else cpu), cpu, cuda[:N], npu[:N], xpu[:N], mps, "
            "or any registered PrivateUse1 backend; under torchrun LOCAL_RANK picks N "
            "(default: auto)",
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--device-modules",
            nargs="+",
            default=None,
            metavar="MODULE",
            help="Python modules to import first, for devices that register themselves on import",
        )
    )
    group.add_argument("--amp", action="store_true", default=False, help="mixed precision through torch.autocast")
    group.add_argument(
        "--amp-dtype",
        default="auto",
        choices=AMP_DTYPE_CHOICES,
        help="autocast dtype: auto = bfloat16 where the device supports it (a CPU: natively, else float32), "
        "else float16 with a GradScaler (default: auto)",
    )


def add_device_args(parser: argparse.ArgumentParser, cpu_fallback: bool = False) -> None:
    """--device, --device-modules, --amp, --amp-dtype (as in timm's scripts, plus auto); ``cpu_fallback``:
    also --no-cpu-fallback (for the scripts that watch host fallbacks: vtools/observe/fallback.py)."""
    group = parser.add_argument_group("device and precision")
    if cpu_fallback:
        group.add_argument(
            "--no-cpu-fallback",
            action="store_true",
            default=False,
            help="stop (exit 3) at the first operator the device backend runs on the host CPU instead "
            "(without it such operators are counted and reported at the end)",
        )
    add_device_choice(group)
    group.add_argument(
        "--device-settings",
        action="store_true",
        default=False,
        help="apply the backend's recommended settings for changing input shapes where the chip does not default "
        "to them (npu: jit_compile off on the Atlas training series, so a new shape does not recompile operators)",
    )
    group.add_argument(
        "--device-kwargs",
        nargs="*",
        default={},
        action=KeyValuePairs,
        metavar="NAME=VALUE",
        help="set backend settings by name (npu: jit_compile, allow_hf32, allow_internal_format, each true or "
        "false); python -m vtools env lists them",
    )
    may_change_on_resume(
        group.add_argument(
            "--threads",
            type=int,
            default=None,
            metavar="N",
            help=f"intra-op threads of the main process, 1 to {MAX_THREADS} (default: OMP_NUM_THREADS when set, "
            "else the cores this process may use less those other processes keep busy as it starts, and on an "
            "accelerator less the loader workers' cores too)",
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--bind-cores",
            action="store_true",
            default=False,
            help="pin each process (under torchrun: each rank, to its own share of the cores) and "
            "its loader workers to fixed cores; a backend variable such as CPU_AFFINITY_CONF "
            "takes precedence",
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--profile",
            type=int,
            default=0,
            metavar="N",
            help="profile N steps of the loop (after 2 warm-up steps) with torch.profiler: a trace "
            "for TensorBoard/Perfetto and the top operators (default: 0, off)",
        )
    )


def add_model_args(
    parser: argparse.ArgumentParser, default_model: str | None = None, checkpoint_flags: bool = True
) -> None:
    """timm's model flags: --model, --pretrained, --checkpoint, --use-ema, --num-classes, ...

    train.py starts from --initial-checkpoint and resumes with --resume instead
    of --checkpoint/--use-ema, so it asks for the model flags without them.
    """
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        "-m",
        default=default_model,
        metavar="NAME",
        help="timm model name (optionally with a pretrained tag), hf-hub:ORG/NAME, "
        "local-dir:PATH, or a path to a model folder (config.json + model.safetensors)",
    )
    may_change_on_resume(
        group.add_argument(
            "--pretrained",
            action="store_true",
            default=False,
            help="load pretrained weights (implied for model folders and hub names)",
        )
    )
    if checkpoint_flags:
        group.add_argument(
            "--checkpoint",
            default="",
            metavar="PATH",
            help="weights to load: .safetensors, a timm .pth.tar, or a plain state dict; "
            "a folder or glob validates each",
        )
        group.add_argument(
            "--use-ema", action="store_true", default=False, help="load the checkpoint's EMA weights (state_dict_ema)"
        )
    group.add_argument("--num-classes", type=int, default=None, help="number of classifier outputs")
    group.add_argument("--in-chans", type=int, default=None, help="number of input image channels")
    group.add_argument(
        "--model-kwargs",
        nargs="*",
        default={},
        action=KeyValuePairs,
        metavar="KEY=VALUE",
        help="extra keyword arguments for timm.create_model",
    )
    may_change_on_resume(
        group.add_argument(
            "--channels-last",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="channels_last memory layout (default: on for convolutional models on cpu, cuda "
            "and xpu, where it is faster; off elsewhere)",
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--torchcompile",
            nargs="?",
            const="inductor",
            default=None,
            metavar="BACKEND",
            help="compile the model with torch.compile (default backend: inductor)",
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--torchcompile-mode",
            default=None,
            metavar="MODE",
            help="torch.compile mode (default, reduce-overhead, max-autotune, ...)",
        )
    )
    group.add_argument("--gp", default=None, metavar="POOL", help="global pool type (avg, max, avgmax, ...)")
    group.add_argument(
        "--fast-norm", action="store_true", default=False, help="timm's fast (low-precision) norm layers"
    )
    group.add_argument(
        "--model-dtype",
        default=None,
        type=model_dtype_name,
        metavar="DTYPE",
        help="cast the model and its inputs to this dtype (float32, bfloat16, float16); "
        "unlike --amp, no float32 master weights",
    )
    add_refused(
        group,
        "--torchscript",
        action="store_true",
        default=False,
        reason="TorchScript is deprecated in torch 2.x and not supported here; use --torchcompile",
    )
    add_refused(
        group,
        "--fuser",
        default="",
        reason="selects a TorchScript fuser, and TorchScript is not supported here; use --torchcompile",
    )


def add_preprocess_args(parser: argparse.ArgumentParser) -> None:
    """Overrides of the model's pretrained preprocessing, as in timm's scripts."""
    group = parser.add_argument_group("preprocessing (default: the model's pretrained config)")
    group.add_argument("--img-size", type=int, default=None, metavar="N", help="input image size")
    group.add_argument(
        "--input-size", type=int, nargs=3, default=None, metavar=("C", "H", "W"), help="full input size, e.g. 3 224 224"
    )
    group.add_argument("--crop-pct", type=float, default=None, help="center crop fraction")
    group.add_argument("--crop-mode", default=None, choices=("center", "squash", "border"), help="crop mode")
    group.add_argument("--mean", type=float, nargs="+", default=None, metavar="MEAN", help="normalization mean")
    group.add_argument("--std", type=float, nargs="+", default=None, metavar="STD", help="normalization std")
    group.add_argument(
        "--interpolation",
        default="",
        type=interpolation_name,
        metavar="NAME",
        help=f"resize interpolation: {', '.join(INTERPOLATIONS)} (default: the model's)",
    )


def add_loader_args(parser: argparse.ArgumentParser, batch_size: int) -> None:
    """validate.py's and inference.py's loading group."""
    group = parser.add_argument_group("loading")
    add_batch_size(group, batch_size, f"batch size (default: {batch_size})")
    add_workers(group)
    add_on_bad_image(group)
    group.add_argument("--log-freq", type=int, default=10, metavar="N", help="batches between log lines")


def add_batch_size(group: argparse._ArgumentGroup, default: int, help_text: str) -> None:
    may_change_on_resume(
        group.add_argument("--batch-size", "-b", type=int, default=default, metavar="N", help=help_text)
    )


def add_workers(group: argparse._ArgumentGroup) -> None:
    may_change_on_resume(group.add_argument("--workers", "-j", type=int, default=None, metavar="N", help=WORKERS_HELP))


def add_on_bad_image(group: argparse._ArgumentGroup) -> None:
    may_change_on_resume(
        group.add_argument(
            "--on-bad-image",
            default="error",
            choices=ON_BAD_IMAGE_CHOICES,
            help="an unreadable image stops the run naming the file (error), or is logged and "
            "counted (skip) (default: error)",
        )
    )


def add_seed(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--seed", type=int, default=42, metavar="S", help="random seed (default: 42)")


def add_loader_no_ops(group: argparse._ArgumentGroup, pin_mem_reason: str, no_prefetcher_reason: str) -> None:
    """timm's --pin-mem and --no-prefetcher: vtools' loader pins and normalizes on the device on its own."""
    may_change_on_resume(add_no_op(group, "--pin-mem", action="store_true", default=False, reason=pin_mem_reason))
    may_change_on_resume(
        add_no_op(group, "--no-prefetcher", action="store_true", default=False, reason=no_prefetcher_reason)
    )


def add_naflex_refusals(
    group: argparse._ArgumentGroup, reason: str, seq_len_reason: str | None = None, training: bool = False
) -> None:
    """timm's NaFlex flags (variable-resolution patch sequences), refused: validate.py takes --naflex-loader
    and --naflex-max-seq-len (``seq_len_reason``: the latter's own reason), train.py all of them."""
    add_refused(group, "--naflex-loader", action="store_true", default=False, reason=reason)
    if training:
        add_refused(
            group, "--naflex-train-seq-lens", type=int, nargs="+", default=[128, 256, 576, 784, 1024], reason=reason
        )
    add_refused(group, "--naflex-max-seq-len", type=int, default=576, reason=seq_len_reason or reason)
    if not training:
        return
    for flag, spec in {
        "--naflex-patch-sizes": {"type": int, "nargs": "+", "default": None},
        "--naflex-patch-size-probs": {"type": float, "nargs": "+", "default": None},
        "--naflex-loss-scale": {"default": "linear", "choices": ("none", "sqrt", "linear")},
        "--naflex-patchify-channels-first": {"action": "store_true", "default": False},
    }.items():
        add_refused(group, flag, reason=reason, **spec)


def add_data_source_args(group: argparse._ArgumentGroup, metavar: str, help_text: str) -> None:
    """The positional data argument and its timm spelling --data-dir (either may be given)."""
    may_change_on_resume(group.add_argument("data", nargs="?", default=None, metavar=metavar, help=help_text))
    may_change_on_resume(
        group.add_argument("--data-dir", default=None, metavar=metavar, help=f"same as {metavar} (timm's flag)")
    )


def add_dataset_args(group: argparse._ArgumentGroup) -> None:
    """--dataset and its options, as timm's scripts spell them (see vtools/data/readers/registry.py)."""
    group.add_argument(
        "--dataset",
        "-d",
        default="",
        metavar="NAME",
        help="empty for image folders; torch/<name> (torchvision), wds/<name> (tar shards in "
        "--data-dir), hfds/<name> (a local Hugging Face dataset copy)",
    )
    may_change_on_resume(
        group.add_argument(
            "--dataset-download",
            action="store_true",
            default=False,
            help="let torchvision (torch/) or the Hub (hfds/) download the dataset",
        )
    )
    group.add_argument(
        "--input-key",
        default=None,
        metavar="KEY",
        help="hfds: image column (default: image); wds: image extensions (default: jpg;png;webp...)",
    )
    group.add_argument(
        "--class-map",
        default="",
        metavar="FILE",
        help="text file of class names, one per line: line number = label index",
    )
    group.add_argument(
        "--input-img-mode",
        default=None,
        metavar="MODE",
        help="PIL mode images are converted to (RGB, L, ...) (default: from the model's input channels)",
    )
    add_refused(
        group,
        "--dataset-trust-remote-code",
        action="store_true",
        default=False,
        reason="hfds/ reads datasets' own formats (save_to_disk folders, Parquet), which run no dataset "
        "script; convert a script-based dataset with the datasets library first",
    )
    group.add_argument(
        "--target-key",
        default=None,
        metavar="KEY",
        help="hfds: label column (default: label); wds: label extension (default: cls)",
    )

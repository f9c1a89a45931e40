"""Command-line options that every script shares, with timm's flag names and meanings."""

from __future__ import annotations

import argparse
import difflib
import math
import re
from dataclasses import dataclass
from typing import NoReturn

import torch
from timm.utils import ParseKwargs

from vtools.amp import AMP_DTYPES, AmpPolicy, resolve_amp
from vtools.device import apply_tuning, resolve_device
from vtools.errors import UsageError
from vtools.host import CpuBudget, setup_cpu_budget

WORKERS_HELP = ("loader processes (default: from the cpu budget: one per 4 cores on cpu, all cores but one on an "
                "accelerator; at most 8)")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (exit 2, no usage block), naming the closest real flag."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message + self._closest_flag(message))

    def _closest_flag(self, message: str) -> str:
        match = re.search(r"unrecognized arguments: (\S+)", message)
        if not match:
            return ""
        flag = match.group(1).split("=")[0]
        close = difflib.get_close_matches(flag, list(self._option_string_actions), n=1, cutoff=0.6)
        return f" (did you mean {close[0]}?)" if close else ""


def check_values(args: argparse.Namespace) -> None:
    """Values argparse's types let through but no run can use: checked before any device or model work,
    for flags and YAML keys alike."""
    for name, value in vars(args).items():
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number, got {value}")
    for name in ("batch_size", "validation_batch_size", "img_size", "in_chans", "num_classes", "epochs"):
        check_positive(getattr(args, name, None), "--" + name.replace("_", "-"))
    if getattr(args, "workers", None) is not None and args.workers < 0:
        raise UsageError(f"--workers must be 0 (load in the main process) or more, got {args.workers}")
    if getattr(args, "profile", 0) < 0:
        raise UsageError(f"--profile must be 0 (off) or a number of steps, got {args.profile}")
    input_size = getattr(args, "input_size", None)
    if input_size is not None and min(input_size) <= 0:
        raise UsageError(f"--input-size needs three positive numbers (channels height width), got "
                         f"{' '.join(map(str, input_size))}")
    channels = input_size[0] if input_size is not None else getattr(args, "in_chans", None)
    for name in ("mean", "std"):
        values = getattr(args, name, None)
        if values is None:
            continue
        if len(values) not in {1, 3, channels or 3}:
            raise UsageError(f"--{name} needs one value per input channel ({channels or 3}) or a single value, "
                             f"got {len(values)}")
    if getattr(args, "std", None) is not None and min(abs(v) for v in args.std) == 0:
        raise UsageError("--std must not be 0: normalization divides by it")


def add_device_args(parser: argparse.ArgumentParser) -> None:
    """--device, --device-modules, --amp, --amp-dtype (as in timm's scripts, plus auto)."""
    group = parser.add_argument_group("device and precision")
    group.add_argument("--device", default="auto", metavar="SPEC",
                       help="auto (the available accelerator, else cpu), cpu, cuda[:N], npu[:N], xpu[:N], mps, "
                            "or any registered PrivateUse1 backend; under torchrun LOCAL_RANK picks N "
                            "(default: auto)")
    group.add_argument("--device-modules", nargs="*", default=[], metavar="MODULE",
                       help="Python modules to import first, for devices that register themselves on import")
    group.add_argument("--amp", action="store_true", default=False,
                       help="mixed precision through torch.autocast")
    group.add_argument("--amp-dtype", default="auto", choices=AMP_DTYPES,
                       help="autocast dtype: auto = bfloat16 where the device supports it, else float16 "
                            "with a GradScaler (default: auto)")
    group.add_argument("--threads", type=int, default=None, metavar="N",
                       help="intra-op threads of the main process (default: all its cores on cpu, the cores "
                            "the loader workers leave on an accelerator; OMP_NUM_THREADS when set)")
    group.add_argument("--bind-cores", action="store_true", default=False,
                       help="pin each process (under torchrun: each rank, to its own share of the cores) and "
                            "its loader workers to fixed cores; a backend variable such as CPU_AFFINITY_CONF "
                            "takes precedence")
    group.add_argument("--profile", type=int, default=0, metavar="N",
                       help="profile N steps of the loop (after 2 warm-up steps) with torch.profiler: a trace "
                            "for TensorBoard/Perfetto and the top operators (default: 0, off)")


@dataclass(frozen=True)
class Runtime:
    """The resolved device and precision policy a script runs with."""

    device: torch.device
    amp: AmpPolicy
    budget: CpuBudget


def setup_runtime(args: argparse.Namespace) -> Runtime:
    """Resolve --device/--device-modules and --amp/--amp-dtype into a :class:`Runtime`, apply the
    device type's speed settings (TF32 and cuDNN autotuning on CUDA, as timm's train.py does) and
    split the host's cores between loader workers and the main process (vtools/host.py)."""
    device = resolve_device(args.device, args.device_modules)
    apply_tuning(device)
    budget = setup_cpu_budget(device, getattr(args, "workers", None), args.threads, args.bind_cores)
    return Runtime(device=device, amp=resolve_amp(device, args.amp, args.amp_dtype), budget=budget)


def add_model_args(parser: argparse.ArgumentParser, default_model: str | None = None,
                   checkpoint_flags: bool = True) -> None:
    """timm's model flags: --model, --pretrained, --checkpoint, --use-ema, --num-classes, ...

    train.py starts from --initial-checkpoint and resumes with --resume instead
    of --checkpoint/--use-ema, so it asks for the model flags without them.
    """
    group = parser.add_argument_group("model")
    group.add_argument("--model", "-m", default=default_model, metavar="NAME",
                       help="timm model name (optionally with a pretrained tag), hf-hub:ORG/NAME, "
                            "local-dir:PATH, or a path to a model folder (config.json + model.safetensors)")
    group.add_argument("--pretrained", action="store_true", default=False,
                       help="load pretrained weights (implied for model folders and hub names)")
    if checkpoint_flags:
        group.add_argument("--checkpoint", default="", metavar="PATH",
                           help="weights to load: .safetensors, a timm .pth.tar, or a plain state dict; "
                                "a folder or glob validates each")
        group.add_argument("--use-ema", action="store_true", default=False,
                           help="load the checkpoint's EMA weights (state_dict_ema)")
    group.add_argument("--num-classes", type=int, default=None, help="number of classifier outputs")
    group.add_argument("--in-chans", type=int, default=None, help="number of input image channels")
    group.add_argument("--model-kwargs", nargs="*", default={}, action=ParseKwargs, metavar="KEY=VALUE",
                       help="extra keyword arguments for timm.create_model")
    group.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                       help="channels_last memory layout (default: on for convolutional models on cpu, cuda "
                            "and xpu, where it is faster; off elsewhere)")
    group.add_argument("--torchcompile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                       help="compile the model with torch.compile (default backend: inductor)")


def add_preprocess_args(parser: argparse.ArgumentParser) -> None:
    """Overrides of the model's pretrained preprocessing, as in timm's scripts."""
    group = parser.add_argument_group("preprocessing (default: the model's pretrained config)")
    group.add_argument("--img-size", type=int, default=None, metavar="N", help="input image size")
    group.add_argument("--input-size", type=int, nargs=3, default=None, metavar=("C", "H", "W"),
                       help="full input size, e.g. 3 224 224")
    group.add_argument("--crop-pct", type=float, default=None, help="center crop fraction")
    group.add_argument("--crop-mode", default=None, choices=("center", "squash", "border"), help="crop mode")
    group.add_argument("--mean", type=float, nargs="+", default=None, metavar="MEAN", help="normalization mean")
    group.add_argument("--std", type=float, nargs="+", default=None, metavar="STD", help="normalization std")
    group.add_argument("--interpolation", default=None, choices=("bilinear", "bicubic", "nearest", "random"),
                       help="resize interpolation")


def add_loader_args(parser: argparse.ArgumentParser, batch_size: int) -> None:
    group = parser.add_argument_group("loading")
    group.add_argument("--batch-size", "-b", type=int, default=batch_size, metavar="N",
                       help=f"batch size (default: {batch_size})")
    group.add_argument("--workers", "-j", type=int, default=None, metavar="N",
                       help=WORKERS_HELP)
    group.add_argument("--on-bad-image", default="error", choices=("error", "skip"),
                       help="an unreadable image stops the run naming the file (error), or is logged and "
                            "counted (skip) (default: error)")
    group.add_argument("--log-freq", type=int, default=10, metavar="N", help="batches between log lines")


def preprocess_overrides(args: argparse.Namespace) -> dict:
    """The preprocessing flags in the form timm's resolve_data_config reads."""
    return {key: getattr(args, key, None) for key in
            ("img_size", "input_size", "in_chans", "crop_pct", "crop_mode", "mean", "std", "interpolation")}


def check_positive(value: int | None, flag: str) -> None:
    if value is not None and value <= 0:
        raise UsageError(f"{flag} must be a positive integer, got {value}")


def add_data_source_args(group: argparse._ArgumentGroup, metavar: str, help_text: str) -> None:
    """The positional data argument and its timm spelling --data-dir (either may be given)."""
    group.add_argument("data", nargs="?", default=None, metavar=metavar, help=help_text)
    group.add_argument("--data-dir", default=None, metavar=metavar, help=f"same as {metavar} (timm's flag)")


def add_dataset_args(group: argparse._ArgumentGroup) -> None:
    """--dataset and its options, as timm's scripts spell them (see vtools/sources.py)."""
    group.add_argument("--dataset", "-d", default="", metavar="NAME",
                       help="empty for image folders; torch/<name> (torchvision), wds/<name> (tar shards in "
                            "--data-dir), hfds/<name> (a local Hugging Face dataset copy)")
    group.add_argument("--dataset-download", action="store_true", default=False,
                       help="let torchvision (torch/) or the Hub (hfds/) download the dataset")
    group.add_argument("--input-key", default=None, metavar="KEY",
                       help="hfds: image column (default: image); wds: image extensions (default: jpg;png;webp...)")
    group.add_argument("--target-key", default=None, metavar="KEY",
                       help="hfds: label column (default: label); wds: label extension (default: cls)")

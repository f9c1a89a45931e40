"""The flag groups the scripts share, generated from their declarations (vtools/options/shared.py).

Each function adds one group to a command's parser: which of a concern's flags the command has, and its
own default, help or reason where timm's scripts give one. Nothing here imports torch
(vtools/options/values.py says why).
"""

from __future__ import annotations

import argparse
import dataclasses

from vtools.cli.declared import add_declared
from vtools.options.shared import (
    DEVICE_CHOICE,
    DEVICE_TUNING,
    DeviceFlags,
    LoadingFlags,
    ModelFlags,
    NaflexFlags,
    PreprocessFlags,
    SourceFlags,
)

CHECKPOINT_FLAGS = ("checkpoint", "use_ema")  # train.py starts from --initial-checkpoint and resumes instead
DATASET_FLAGS = (
    "dataset",
    "dataset_download",
    "input_key",
    "class_map",
    "input_img_mode",
    "dataset_trust_remote_code",
    "target_key",
)


def add_device_choice(group: argparse._ArgumentGroup) -> None:
    """--device, --device-modules, --amp and --amp-dtype: what every command that runs a model takes."""
    add_declared(group, DeviceFlags, only=DEVICE_CHOICE)


def add_device_args(parser: argparse.ArgumentParser, cpu_fallback: bool = False) -> None:
    """The device, its precision and its tuning; ``cpu_fallback``: also --no-cpu-fallback (for the scripts
    that watch host fallbacks: vtools/observe/fallback.py)."""
    names = ("no_cpu_fallback",) * cpu_fallback + DEVICE_CHOICE + DEVICE_TUNING
    add_declared(parser.add_argument_group(DeviceFlags.title), DeviceFlags, only=names)


def add_model_args(
    parser: argparse.ArgumentParser, default_model: str | None = None, checkpoint_flags: bool = True
) -> None:
    """timm's model flags: --model, --pretrained, --checkpoint, --use-ema, --num-classes, ... (train.py's
    without --checkpoint and --use-ema)."""
    names = [name for name in _names(ModelFlags) if checkpoint_flags or name not in CHECKPOINT_FLAGS]
    group = parser.add_argument_group(ModelFlags.title)
    add_declared(group, ModelFlags, only=names, changes={"model": {"default": default_model}})


def add_preprocess_args(parser: argparse.ArgumentParser) -> None:
    """Overrides of the model's pretrained preprocessing, as in timm's scripts."""
    add_declared(parser.add_argument_group(PreprocessFlags.title), PreprocessFlags)


def add_loader_args(parser: argparse.ArgumentParser, batch_size: int) -> None:
    """validate.py's and inference.py's loading group."""
    group = parser.add_argument_group(LoadingFlags.title)
    add_loading(group, batch_size, f"batch size (default: {batch_size})")
    add_declared(group, LoadingFlags, only=("log_freq",))


def add_loading(group: argparse._ArgumentGroup, batch_size: int, batch_help: str) -> None:
    """--batch-size (with the command's default and help), --workers and --on-bad-image."""
    changes = {"batch_size": {"default": batch_size, "help": batch_help}}
    add_declared(group, LoadingFlags, only=("batch_size", "workers", "on_bad_image"), changes=changes)


def add_seed(group: argparse._ArgumentGroup) -> None:
    add_declared(group, LoadingFlags, only=("seed",))


def add_loader_no_ops(group: argparse._ArgumentGroup, pin_mem_reason: str, no_prefetcher_reason: str) -> None:
    """timm's --pin-mem and --no-prefetcher: vtools' loader pins and normalizes on the device on its own."""
    changes = {"pin_mem": {"reason": pin_mem_reason}, "no_prefetcher": {"reason": no_prefetcher_reason}}
    add_declared(group, LoadingFlags, only=("pin_mem", "no_prefetcher"), changes=changes)


def add_naflex_refusals(
    group: argparse._ArgumentGroup, reason: str, seq_len_reason: str | None = None, training: bool = False
) -> None:
    """timm's NaFlex flags (variable-resolution patch sequences), refused: validate.py takes --naflex-loader
    and --naflex-max-seq-len (``seq_len_reason``: the latter's own reason), train.py all of them."""
    names = _names(NaflexFlags) if training else ("naflex_loader", "naflex_max_seq_len")
    changes = {name: {"reason": reason} for name in names}
    changes["naflex_max_seq_len"] = {"reason": seq_len_reason or reason}
    add_declared(group, NaflexFlags, only=names, changes=changes)


def add_data_source_args(group: argparse._ArgumentGroup, metavar: str, help_text: str) -> None:
    """The positional data argument and its timm spelling --data-dir (either may be given)."""
    changes = {
        "data": {"metavar": metavar, "help": help_text},
        "data_dir": {"metavar": metavar, "help": f"same as {metavar} (timm's flag)"},
    }
    add_declared(group, SourceFlags, only=("data", "data_dir"), changes=changes)


def add_dataset_args(group: argparse._ArgumentGroup) -> None:
    """--dataset and its options, as timm's scripts spell them (see vtools/data/readers/registry.py)."""
    add_declared(group, SourceFlags, only=DATASET_FLAGS)


def _names(concern: type) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(concern))

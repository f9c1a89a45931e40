"""Weights out of training checkpoints, as timm's ``avg_checkpoints.py`` and ``clean_checkpoint.py`` take them.

Both of timm's scripts read a checkpoint's EMA weights when it has them (``state_dict_ema``, then
``model_ema``), else its ``state_dict`` (or ``model``), with DDP and torch.compile prefixes removed
(timm's ``clean_state_dict``). Averaging follows timm's arithmetic exactly, so the result equals its
script's bit for bit: the checkpoints in ascending order of their metric, each tensor summed in float64,
divided by the count, clamped to float32's range and stored as float32. Reading never runs pickled
code (vtools/models/weights.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save
from timm.models import clean_state_dict

from vtools.atomic import atomic_write
from vtools.errors import UsageError
from vtools.models.weights import safe_load

EMA_KEYS = ("state_dict_ema", "model_ema")
PLAIN_KEYS = ("state_dict", "model")


def checkpoint_metric(checkpoint: Mapping[str, Any]) -> float | None:
    """The metric a checkpoint was saved with: ``metric``, else ``metrics[metric_name]`` (timm's saver)."""
    if checkpoint.get("metric") is not None:
        return float(checkpoint["metric"])
    metrics, name = checkpoint.get("metrics"), checkpoint.get("metric_name")
    if isinstance(metrics, Mapping) and name in metrics:
        return float(metrics[name])
    return None


def read_training_checkpoint(path: Path) -> Mapping[str, Any]:
    """A checkpoint file's contents, read without running code (its tensors mapped, read when used: ranking
    ten checkpoints by metric reads their small entries, not their weights and optimizer state); one line
    where it is not a checkpoint."""
    checkpoint = safe_load(path, mmap=True)
    if not isinstance(checkpoint, Mapping):
        raise UsageError(f"checkpoint {path} holds a {type(checkpoint).__name__}, not a state dict")
    return checkpoint


def checkpoint_weights(checkpoint: Mapping[str, Any], path: Path, use_ema: bool) -> dict[str, torch.Tensor]:
    """The weights timm's scripts take from ``checkpoint``: EMA first where ``use_ema`` and present."""
    keys = (*EMA_KEYS, *PLAIN_KEYS) if use_ema else PLAIN_KEYS
    state = next((checkpoint[key] for key in keys if isinstance(checkpoint.get(key), Mapping)), checkpoint)
    if not state or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise UsageError(f"checkpoint {path} has no state dict of tensors")
    return clean_state_dict(dict(state))


def average_weights(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The mean of ``states``, key by key, in timm's arithmetic (see the module docstring)."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    for state in states:
        for key, value in state.items():
            if key in sums:
                sums[key] += value.to(dtype=torch.float64)
                counts[key] += 1
            else:
                sums[key] = value.clone().to(dtype=torch.float64)
                counts[key] = 1
    limits = torch.finfo(torch.float32)
    return {
        key: total.div_(counts[key]).clamp(limits.min, limits.max).to(dtype=torch.float32)
        for key, total in sums.items()
    }


def without_aux_bn(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` less the auxiliary batch-norm layers of timm's split-BN training (--clean-aux-bn)."""
    return {key: value for key, value in state.items() if "aux_bn" not in key}


def write_weights(state: dict[str, torch.Tensor], path: Path, safetensors: bool) -> None:
    """``state`` to ``path`` atomically, as safetensors or as torch.save writes it. safetensors stores
    contiguous tensors only: weights trained channels-last are packed first (same values)."""
    if safetensors:
        packed = {key: value.contiguous() for key, value in state.items()}
        atomic_write(path, lambda stream: stream.write(save(packed)))
    else:
        atomic_write(path, lambda stream: torch.save(state, stream))


def sha256_of(path: Path) -> str:
    """The file's SHA-256, as timm prints it and puts its first 8 digits in cleaned names."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()

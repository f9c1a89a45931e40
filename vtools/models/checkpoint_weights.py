"""Weights out of training checkpoints, as timm's ``avg_checkpoints.py`` and ``clean_checkpoint.py`` take them.

Both of timm's scripts read a checkpoint's EMA weights when it has them (``state_dict_ema``, then
``model_ema``), else its ``state_dict`` (or ``model``), with DDP and torch.compile prefixes removed
(timm's ``clean_state_dict``). Averaging follows timm's arithmetic exactly, so the result equals its
script's bit for bit: the checkpoints in ascending order of their metric, each tensor summed in float64,
divided by the count, clamped to float32's range and stored as float32. One departure: integer buffers
(batch norm's ``num_batches_tracked``) are rounded back to their integer type, where timm's script leaves
them float32 and relies on its loader to cast them; vtools' scripts, and any strict reader, then take the
result as it is. Reading never runs pickled code (vtools/models/weights.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import torch
from safetensors.torch import save
from timm.models import clean_state_dict

from vtools.atomic import atomic_write
from vtools.errors import UsageError
from vtools.models.weights import safe_load

EMA_KEYS = ("state_dict_ema", "model_ema")
PLAIN_KEYS = ("state_dict", "model")


def checkpoint_metric(checkpoint: Mapping[str, Any], path: Path | str = "checkpoint") -> float | None:
    """The metric a checkpoint was saved with: ``metric``, else ``metrics[metric_name]`` (timm's saver);
    one line where it is not a single number (a string, a tensor of several values). NaN is returned as
    it is: the caller leaves it out of the ranking."""
    value = checkpoint.get("metric")
    if value is None:
        metrics, name = checkpoint.get("metrics"), checkpoint.get("metric_name")
        if not (isinstance(metrics, Mapping) and name in metrics):
            return None
        value = metrics[name]
    return as_number(value, path)


def as_number(value: Any, path: Path | str) -> float:
    """``value`` as a float: a Python or numpy number, or a tensor of one element; anything else is refused,
    since ranking by it would be a guess."""
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        shown = f"a tensor of {value.numel()} values"
    elif isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        shown = f"{value!r}"[:40]
    else:
        return float(value)
    raise UsageError(f"checkpoint {path}: its metric is {shown}, not a number; give --no-sort to average by order")


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
    """The mean of ``states``, key by key, in timm's arithmetic (see the module docstring): integer
    buffers come back float32 as timm's, and vtools' loaders cast them back as timm's do."""
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


def check_same_model(states: list[dict[str, torch.Tensor]], paths: list[Path]) -> None:
    """One line unless every state holds the same keys with the same shapes: checkpoints of two
    architectures or head sizes have no mean."""
    first = states[0]
    for state, path in zip(states[1:], paths[1:]):
        missing = sorted(set(first) ^ set(state))
        differing = [key for key in first if key in state and state[key].shape != first[key].shape]
        if missing or differing:
            key = (missing or differing)[0]
            detail = (
                f"{key} is in only one of them"
                if missing
                else f"{key} {tuple(first[key].shape)} vs {tuple(state[key].shape)}"
            )
            raise UsageError(
                f"checkpoints {paths[0]} and {path} hold different models ({detail}): average checkpoints of one "
                "architecture and head size"
            )


def without_aux_bn(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` less the auxiliary batch-norm layers of timm's split-BN training (--clean-aux-bn)."""
    return {key: value for key, value in state.items() if "aux_bn" not in key}


def write_weights(state: dict[str, torch.Tensor], path: Path, safetensors: bool) -> None:
    """``state`` to ``path`` atomically, as safetensors or as torch.save writes it. safetensors stores
    contiguous tensors only: weights trained channels-last are packed first (same values). Either way a
    full disk is the same one line (exit 3), and nothing is left behind."""
    if safetensors:
        packed = {key: value.contiguous() for key, value in state.items()}
        atomic_write(path, lambda stream: stream.write(save(packed)))
    else:
        atomic_write(path, lambda stream: torch_save(state, stream))


def torch_save(state: dict[str, torch.Tensor], stream: IO[bytes]) -> None:
    """torch.save into ``stream``, re-raising the OSError a write met: torch's zip writer reports a full disk
    as an internal ``enforce fail`` at a position, which :func:`atomic_write` would not know for a write error."""
    watched = _WatchedStream(stream)
    try:
        torch.save(state, watched)
    except RuntimeError as err:
        if watched.error is not None:
            raise watched.error from err
        raise


class _WatchedStream:
    """A binary stream that remembers the OSError its last write raised."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.stream.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.stream.flush()


def check_weights_name(flag: str, path: Path, safetensors: bool) -> None:
    """One line where the name says one format and the bytes would be the other: a ``.pth`` holding
    safetensors (torch cannot read it; timm only warns), or a ``.safetensors`` holding a pickle."""
    named_safetensors = path.suffix == ".safetensors"
    if safetensors and not named_safetensors:
        raise UsageError(
            f"{flag} {path}: --safetensors writes safetensors, which readers know by the .safetensors extension; "
            f"name it {path.with_suffix('.safetensors').name}, or leave out --safetensors for a torch.save file"
        )
    if named_safetensors and not safetensors:
        raise UsageError(f"{flag} {path} is named .safetensors: add --safetensors, or name it .pth")


def sha256_of(path: Path) -> str:
    """The file's SHA-256, as timm prints it and puts its first 8 digits in cleaned names."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()

"""The one checkpoint reader: weights from any file a user may hand us, never executing code.

``.safetensors`` is read with safetensors; everything else with
``torch.load(weights_only=True)`` through :func:`safe_load`, which training
checkpoints (``vtools.train.checkpoint``) use too, so a pickled file can never run
code and every refusal reads the same.
"""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from vtools.errors import UsageError


def read_state_dict(
    path: str | Path, use_ema: bool = False, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Read a checkpoint's weights straight onto ``device``, never executing pickled code.

    Accepts .safetensors, timm's training checkpoints (``state_dict`` /
    ``state_dict_ema``), and plain state dicts.
    """
    return read_checkpoint(path, use_ema, device)[0]


def read_checkpoint(
    path: str | Path, use_ema: bool = False, device: torch.device | str = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """:func:`read_state_dict`, plus the preprocessing a vtools training run stored with the weights."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"checkpoint {path} does not exist")
    if path.stat().st_size == 0:
        raise UsageError(f"checkpoint {path} is empty (0 bytes)")
    if path.suffix == ".safetensors":
        try:
            state = load_file(str(path), device=str(device))
        except (SafetensorError, OSError, ValueError) as err:
            raise UsageError(f"checkpoint {path} is not a readable safetensors file ({err})") from err
        if use_ema:
            raise UsageError(f"--use-ema: {path} is a plain safetensors file with no EMA weights")
        return state, None
    checkpoint = safe_load(path, device)
    data_config = checkpoint.get("data_config") if isinstance(checkpoint, Mapping) else None
    return _select_weights(checkpoint, path, use_ema), data_config if isinstance(data_config, dict) else None


def safe_load(path: Path, device: torch.device | str = "cpu", mmap: bool = False) -> Any:
    """``torch.load`` with ``weights_only=True`` (and timm's harmless checkpoint types allowed): a file that
    would run code is refused, and one that is not a checkpoint is a one-line :class:`UsageError`. ``mmap``:
    tensors are read from the file only when used (host memory; a metric read then skips the weights); torch
    maps only its zip format, so a legacy file (older torch and timm wrote them) is read whole instead."""
    mmap = mmap and is_zip_file(path)
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing; the error says it
            warnings.simplefilter("ignore")
            with torch.serialization.safe_globals(timm_checkpoint_globals()):
                return torch.load(path, map_location=device, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise unpickling_error(path, err) from err
    except Exception as err:  # truncated, not a zip, wrong magic: all mean "not a checkpoint"
        torch_says = whole_sentences(str(err)) or type(err).__name__
        raise UnreadableCheckpoint(path, unreadable_detail(path, torch_says)) from err


def is_zip_file(path: Path) -> bool:
    """Whether ``path`` is in torch.save's zip format (the only one torch can map), not its legacy pickle."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"PK\x03\x04"
    except OSError:
        return False  # torch.load then says what is wrong with the file


class UnreadableCheckpoint(UsageError):
    """A file torch cannot read as a checkpoint; ``detail`` says why, in whole sentences."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"checkpoint {path} is not a readable PyTorch checkpoint ({detail})")
        self.detail = detail


def whole_sentences(text: str, limit: int = 160) -> str:
    """The opening of an exception's message for a one-line error: its first line, in whole sentences up to
    ``limit`` characters (the first sentence whole, however long), never cut inside one; terminal
    colour codes (torch bolds its warnings) removed."""
    line = next((line.strip() for line in _ANSI.sub("", text).splitlines() if line.strip()), "")
    sentences = _SENTENCE_END.split(line)
    kept = sentences[0]
    for sentence in sentences[1:]:
        if len(kept) + 1 + len(sentence) > limit:
            break
        kept += " " + sentence
    return kept


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\[])")


def unreadable_detail(path: Path, torch_says: str) -> str:
    """Why ``path`` is no checkpoint: a file in neither of torch.save's formats says so (torch's own words
    are then about an internal step, a bare key such as ``101``); otherwise ``torch_says``."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(2)
    except OSError:
        return torch_says
    if not head.startswith((b"PK", b"\x80")):
        return "it is in neither of the formats torch.save writes: a zip archive, or a binary pickle"
    return torch_says


def timm_checkpoint_globals() -> list[Any]:
    """The harmless types timm's CheckpointSaver pickles beside the weights: its argparse.Namespace and
    numpy scalars (a metric). Allowing them keeps ``weights_only`` loading on: none of them runs code."""
    import argparse

    import numpy as np

    scalar = np._core.multiarray.scalar if hasattr(np, "_core") else np.core.multiarray.scalar
    return [argparse.Namespace, scalar, np.dtype, *(type(np.dtype(kind)) for kind in ("float64", "float32", "int64"))]


def unpickling_error(path: Path, err: pickle.UnpicklingError) -> UsageError:
    """Say whether torch's safe unpickler refused code, or the file is simply not a checkpoint. torch words
    its refusal as paragraphs of advice around one line that names the global: that line is the detail."""
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [
        line.strip() for line in str(err).splitlines() if line.strip() and not line.strip().startswith(boilerplate)
    ]
    markers = ("GLOBAL", "Unsupported global", "Unsupported class")
    naming = [line for line in lines if any(marker in line for marker in markers)]  # torch words it per version
    detail = whole_sentences((naming or lines or [type(err).__name__])[0])
    runs_code = bool(naming)
    if "Unsupported operand" in detail:  # a newer pickle protocol than torch.save writes: name what it imports
        calls = [name for name in pickled_globals(path) if not name.startswith(_WEIGHT_GLOBALS)]
        if calls:
            detail, runs_code = f"it imports {', '.join(sorted(set(calls))[:3])}", True
    if runs_code:
        return UsageError(
            f"checkpoint {path} was refused: loading it would run code ({detail.rstrip('.')}); "
            "vtools only loads weights (weights_only=True), never pickled code"
        )
    return UnreadableCheckpoint(path, unreadable_detail(path, detail))


_WEIGHT_GLOBALS = ("torch.", "collections.OrderedDict", "argparse.Namespace", "numpy.", "builtins.set")


def pickled_globals(path: Path, limit: int = 1 << 26) -> list[str]:
    """The ``module.name`` globals a plain pickle file imports, read with pickletools (nothing is run or
    imported); empty for what pickletools cannot read, such as torch's zip checkpoints."""
    import pickletools

    found: list[str] = []
    strings: list[str] = []
    try:
        with open(path, "rb") as handle:
            for opcode, arg, _ in pickletools.genops(handle):
                if opcode.name in ("GLOBAL", "INST"):
                    found.append(str(arg).replace(" ", "."))
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(f"{strings[-2]}.{strings[-1]}")
                elif isinstance(arg, str):
                    strings.append(arg)
                if handle.tell() > limit:
                    break
    except Exception:  # not a pickle, or a truncated one: nothing more to say than torch did
        return found
    return found


def _select_weights(checkpoint: Any, path: Path, use_ema: bool) -> dict[str, torch.Tensor]:
    if not isinstance(checkpoint, Mapping):
        raise UsageError(f"checkpoint {path} holds a {type(checkpoint).__name__}, not a state dict")
    keys = ("state_dict_ema", "model_ema") if use_ema else ("state_dict", "model")
    state = next((checkpoint[k] for k in keys if isinstance(checkpoint.get(k), Mapping)), None)
    if state is None and use_ema:
        raise UsageError(f"--use-ema: checkpoint {path} has no state_dict_ema")
    state = checkpoint if state is None else state
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UsageError(f"checkpoint {path} has no state dict of tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}


def load_checkpoint(
    model: torch.nn.Module, path: str | Path, use_ema: bool = False, device: torch.device | str = "cpu"
) -> None:
    """Load weights into ``model``, naming every missing, unexpected or mis-shaped key. A checkpoint of a
    vtools run also brings the run's preprocessing, which then comes before the model's defaults."""
    state, data_config = read_checkpoint(path, use_ema=use_ema, device=device)
    state = cast_integer_buffers(model.state_dict(), state)
    check_state_dict_fits(model, state, str(path))
    model.load_state_dict(state, strict=True)
    if data_config:
        model.pretrained_cfg = {**getattr(model, "pretrained_cfg", {}), **data_config}


def check_state_dict_fits(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise a one-line :class:`UsageError` unless ``state`` fits ``model`` exactly."""
    problems = fit_problems(model.state_dict(), state)
    if problems:
        raise UsageError(f"checkpoint {source} does not fit the model: " + "; ".join(problems))


def cast_integer_buffers(
    expected: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``state`` with floating-point tensors cast to the integer type of the model's buffers they load into
    (``num_batches_tracked``), as timm's loader casts them: timm's avg_checkpoints.py stores them as float32.
    Integer tensors for floating-point weights are left for :func:`fit_problems` to refuse."""
    return {
        key: value.to(expected[key].dtype) if _float_for_integer(value, expected.get(key)) else value
        for key, value in state.items()
    }


def _float_for_integer(value: torch.Tensor, expected: torch.Tensor | None) -> bool:
    return (
        expected is not None
        and value.is_floating_point()
        and not expected.is_floating_point()
        and not expected.is_complex()
        and expected.dtype != torch.bool
    )


def fit_problems(expected: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor], shown: int = 4) -> list[str]:
    """What keeps ``state`` from loading into a model whose state dict is ``expected``: missing, unexpected
    and mis-shaped keys, and integer tensors for floating-point ones (``shown`` of each kind named); empty
    when it fits exactly."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    # load_state_dict would cast integer weights into float parameters without a word
    kinds = [
        f"{k} {state[k].dtype} vs {v.dtype}"
        for k, v in expected.items()
        if k in state and v.is_floating_point() != state[k].is_floating_point()
    ]
    problems = []
    for label, items in (
        ("missing", missing),
        ("unexpected", unexpected),
        ("shape mismatch", mismatched),
        ("integer vs floating-point", kinds),
    ):
        if items:
            named = ", ".join(items[:shown]) + (f" (+{len(items) - shown} more)" if len(items) > shown else "")
            problems.append(f"{label}: {named}")
    return problems

"""Create timm models on the target device, with errors a user can act on.

Model names are timm's: registry names with optional pretrained tags
(``resnet50.a1_in1k``), ``hf-hub:org/name``, ``local-dir:/path``; a bare path to a
model folder (config.json + model.safetensors) also works, and so does an ``.onnx``
file (run through onnxruntime).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import timm
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from vtools.errors import UsageError
from vtools.models.onnx_model import is_onnx, load_onnx_model
from vtools.models.weights import load_checkpoint

_OFFLINE_ERRORS = (
    "LocalEntryNotFoundError",
    "ConnectError",
    "ConnectionError",
    "OfflineModeIsEnabled",
    "HfHubHTTPError",
    "RepositoryNotFoundError",
    "URLError",
    "ReadTimeout",
    "ConnectTimeout",
)


def normalize_model_name(name: str) -> str:
    """Turn a bare path to a model folder into timm's ``local-dir:`` form."""
    if ":" not in name.split("/")[0] and Path(name).expanduser().is_dir():
        return f"local-dir:{Path(name).expanduser()}"
    return name


def model_folder_of(name: str) -> Path | None:
    """The model folder ``name`` points to (a bare path or ``local-dir:``), or None."""
    normalized = normalize_model_name(name)
    return Path(normalized.split(":", 1)[1]) if normalized.startswith("local-dir:") else None


def weights_description(name: str, pretrained: bool, num_classes: int, initial_checkpoint: str = "") -> str:
    """Which weights a run starts from, and whether the classifier was re-initialised for new classes."""
    if initial_checkpoint:
        return f"weights from {initial_checkpoint}"
    folder = model_folder_of(name)
    if folder is None:
        return f"pretrained weights of {name}" if pretrained else "random initial weights"
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    stored = config.get("num_classes")
    if stored is not None and stored != num_classes:
        return f"weights from {folder}, classifier re-initialised ({stored} -> {num_classes} classes)"
    return f"weights from {folder}"


def create_model(
    name: str,
    *,
    pretrained: bool = False,
    num_classes: int | None = None,
    in_chans: int | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    checkpoint: str | None = None,
    use_ema: bool = False,
    device: torch.device | str = "cpu",
    **extra: Any,
) -> torch.nn.Module:
    """Build a timm model on ``device``, with pretrained weights and/or a checkpoint; an ``.onnx`` file
    gives the same interface over onnxruntime (vtools/onnx_model.py)."""
    if is_onnx(name):
        if checkpoint:
            raise UsageError(f"--model {name} is an exported ONNX file: it takes no --checkpoint")
        return load_onnx_model(name)
    normalized = normalize_model_name(name)
    kwargs = {
        k: v
        for k, v in {"num_classes": num_classes, "in_chans": in_chans, **(model_kwargs or {}), **extra}.items()
        if v is not None
    }
    folder = model_folder_of(name)
    if folder is not None:
        _check_model_folder(folder)
        pretrained = True  # a model folder is its weights: they are always loaded
        if (model := _from_folder_on_device(normalized, folder, kwargs, device)) is not None:
            if checkpoint:
                load_checkpoint(model, checkpoint, use_ema=use_ema, device=device)
            return model
    model = _timm_create(name, normalized, pretrained, kwargs)
    model.to(device)
    if checkpoint:
        load_checkpoint(model, checkpoint, use_ema=use_ema, device=device)
    return model


def _from_folder_on_device(
    normalized: str, folder: Path, kwargs: dict[str, Any], device: torch.device | str
) -> torch.nn.Module | None:
    """A model folder's safetensors read straight onto ``device``; None when timm must adapt the weights
    (another class count or channel count), which its own pretrained loader does on the host."""
    weights = folder / "model.safetensors"
    if not weights.is_file():
        return None
    model = _timm_create(normalized, normalized, False, kwargs).to(device)
    try:
        state = load_file(str(weights), device=str(device))
    except (SafetensorError, OSError, ValueError) as err:
        raise UsageError(f"model folder {folder}: model.safetensors is not readable ({err})") from err
    expected = model.state_dict()
    if state.keys() != expected.keys() or any(state[k].shape != v.shape for k, v in expected.items()):
        return None
    model.load_state_dict(state)
    return model


def _timm_create(name: str, normalized: str, pretrained: bool, kwargs: dict[str, Any]) -> torch.nn.Module:
    """timm.create_model with its failures turned into one-line errors."""
    try:
        return timm.create_model(normalized, pretrained=pretrained, **kwargs)
    except (RuntimeError, ValueError) as err:
        if str(err).startswith("Unknown model"):
            raise UsageError(_unknown_model_message(name)) from err
        if "looks like a Hugging Face Hub repo id or a local path" in str(err):
            raise UsageError(f"--model {name}: no such model folder (expected a folder holding config.json)") from err
        if type(err).__name__ in _OFFLINE_ERRORS or "No pretrained weights" in str(err):
            raise UsageError(_download_message(name, err)) from err
        raise
    except OSError as err:
        raise UsageError(_download_message(name, err)) from err
    except Exception as err:  # hub clients raise their own exception types
        if type(err).__name__ in _OFFLINE_ERRORS:
            raise UsageError(_download_message(name, err)) from err
        raise


def _check_model_folder(folder: Path) -> None:
    if not (folder / "config.json").is_file():
        raise UsageError(f"model folder {folder} has no config.json")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"model folder {folder}: config.json is not valid JSON ({err})") from err
    if not isinstance(config, dict):
        raise UsageError(
            f"model folder {folder}: config.json must hold an object (timm's model config), "
            f"not a {type(config).__name__}"
        )


def _unknown_model_message(name: str) -> str:
    base = name.split(".")[0]
    close = difflib.get_close_matches(base, timm.list_models(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models()"
    return f"unknown model {name!r}{hint}"


def _download_message(name: str, err: BaseException) -> str:
    detail = f"{type(err).__name__}: {err}".splitlines()[0][:200]
    return (
        f"--model {name}: pretrained weights could not be loaded ({detail}). Without network access, "
        "pass a local model folder (config.json + model.safetensors) or use a cached copy with HF_HUB_OFFLINE=1"
    )

"""Create timm models and load weights onto the target device, with errors a user can act on.

Model names are timm's: registry names with optional pretrained tags
(``resnet50.a1_in1k``), ``hf-hub:org/name``, ``local-dir:/path``; a bare path
to a model folder (config.json + model.safetensors) also works. Checkpoints
are read with safetensors or ``torch.load(weights_only=True)``, so a pickled
file can never run code.
"""

from __future__ import annotations

import difflib
import json
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import timm
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from vtools.errors import UsageError
from vtools.onnx_model import OnnxModel, is_onnx, load_onnx_model

_OFFLINE_ERRORS = ("LocalEntryNotFoundError", "ConnectError", "ConnectionError", "OfflineModeIsEnabled",
                   "HfHubHTTPError", "RepositoryNotFoundError", "URLError", "ReadTimeout", "ConnectTimeout")


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


def create_model(name: str, *, pretrained: bool = False, num_classes: int | None = None,
                 in_chans: int | None = None, model_kwargs: Mapping[str, Any] | None = None,
                 checkpoint: str | None = None, use_ema: bool = False,
                 device: torch.device | str = "cpu", **extra: Any) -> torch.nn.Module:
    """Build a timm model on ``device``, with pretrained weights and/or a checkpoint; an ``.onnx`` file
    gives the same interface over onnxruntime (vtools/onnx_model.py)."""
    if is_onnx(name):
        if checkpoint:
            raise UsageError(f"--model {name} is an exported ONNX file: it takes no --checkpoint")
        return load_onnx_model(name)
    normalized = normalize_model_name(name)
    kwargs = {k: v for k, v in {"num_classes": num_classes, "in_chans": in_chans, **(model_kwargs or {}),
                                **extra}.items() if v is not None}
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


def _from_folder_on_device(normalized: str, folder: Path, kwargs: dict[str, Any],
                           device: torch.device | str) -> torch.nn.Module | None:
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
        raise UsageError(f"model folder {folder}: config.json must hold an object (timm's model config), "
                         f"not a {type(config).__name__}")


def _unknown_model_message(name: str) -> str:
    base = name.split(".")[0]
    close = difflib.get_close_matches(base, timm.list_models(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models()"
    return f"unknown model {name!r}{hint}"


def _download_message(name: str, err: BaseException) -> str:
    detail = f"{type(err).__name__}: {err}".splitlines()[0][:200]
    return (f"--model {name}: pretrained weights could not be loaded ({detail}). Without network access, "
            "pass a local model folder (config.json + model.safetensors) or use a cached copy with HF_HUB_OFFLINE=1")


def read_state_dict(path: str | Path, use_ema: bool = False, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Read a checkpoint's weights straight onto ``device``, never executing pickled code.

    Accepts .safetensors, timm's training checkpoints (``state_dict`` /
    ``state_dict_ema``), and plain state dicts.
    """
    return read_checkpoint(path, use_ema, device)[0]


def read_checkpoint(path: str | Path, use_ema: bool = False, device: torch.device | str = "cpu"
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
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing; the error says it
            warnings.simplefilter("ignore")
            with torch.serialization.safe_globals(timm_checkpoint_globals()):
                checkpoint = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as err:
        raise UsageError(unpickling_message(path, err)) from err
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise UsageError(f"checkpoint {path} is not a readable PyTorch checkpoint ({str(err).splitlines()[0]})") from err
    data_config = checkpoint.get("data_config") if isinstance(checkpoint, Mapping) else None
    return _select_weights(checkpoint, path, use_ema), data_config if isinstance(data_config, dict) else None


def timm_checkpoint_globals() -> list[Any]:
    """The harmless types timm's CheckpointSaver pickles beside the weights: its argparse.Namespace and
    numpy scalars (a metric). Allowing them keeps ``weights_only`` loading on: none of them runs code."""
    import argparse

    import numpy as np

    scalar = np._core.multiarray.scalar if hasattr(np, "_core") else np.core.multiarray.scalar
    return [argparse.Namespace, scalar, np.dtype, *(type(np.dtype(kind)) for kind in ("float64", "float32", "int64"))]


def unpickling_message(path: Path, err: pickle.UnpicklingError) -> str:
    """Say whether torch's safe unpickler refused code, or the file is simply not a checkpoint."""
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [line.strip() for line in str(err).splitlines() if line.strip() and not line.strip().startswith(boilerplate)]
    detail = (lines[0] if lines else type(err).__name__)[:160]
    if "GLOBAL" in detail or "Unsupported global" in detail or "Unsupported class" in detail:
        return (f"checkpoint {path} was refused: loading it would run code ({detail}); "
                "vtools only loads weights (weights_only=True), never pickled code")
    return f"checkpoint {path} is not a readable PyTorch checkpoint ({detail})"


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


def load_checkpoint(model: torch.nn.Module, path: str | Path, use_ema: bool = False,
                    device: torch.device | str = "cpu") -> None:
    """Load weights into ``model``, naming every missing, unexpected or mis-shaped key. A checkpoint of a
    vtools run also brings the run's preprocessing, which then comes before the model's defaults."""
    state, data_config = read_checkpoint(path, use_ema=use_ema, device=device)
    check_state_dict_fits(model, state, str(path))
    model.load_state_dict(state, strict=True)
    if data_config:
        model.pretrained_cfg = {**getattr(model, "pretrained_cfg", {}), **data_config}


def check_state_dict_fits(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise a one-line :class:`UsageError` unless ``state`` fits ``model`` exactly."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
                  if k in state and tuple(state[k].shape) != tuple(v.shape)]
    # load_state_dict would cast integer weights into float parameters without a word
    kinds = [f"{k} {state[k].dtype} vs {v.dtype}" for k, v in expected.items()
             if k in state and v.is_floating_point() != state[k].is_floating_point()]
    problems = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched),
                         ("integer vs floating-point", kinds)):
        if items:
            shown = ", ".join(items[:4]) + (f" (+{len(items) - 4} more)" if len(items) > 4 else "")
            problems.append(f"{label}: {shown}")
    if problems:
        raise UsageError(f"checkpoint {source} does not fit the model: " + "; ".join(problems))


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def class_names_of(model: torch.nn.Module) -> list[str] | None:
    """Class names stored with a model folder or checkpoint (``label_names`` in its config)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    names = cfg.get("label_names")
    if names and len(names) == getattr(model, "num_classes", len(names)):
        return list(names)
    return None


def is_convnet(model: torch.nn.Module) -> bool:
    """Several 2-d convolutions: a CNN (a ViT has one, its patch embedding)."""
    return sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) >= 3


def use_channels_last(flag: bool | None, model: torch.nn.Module, device: torch.device) -> bool:
    """--channels-last / --no-channels-last, or (unset) where it is faster: CNNs on devices that like NHWC."""
    from vtools.device import kind_of

    if flag is not None:
        return flag
    return kind_of(device.type).channels_last and is_convnet(model)


def prepare_for_eval(model: torch.nn.Module, channels_last: bool = False,
                     torchcompile: str | None = None) -> torch.nn.Module:
    """Eval mode, memory layout and optional torch.compile, in that order."""
    model.eval()
    if channels_last:
        model.to(memory_format=torch.channels_last)
    if torchcompile and isinstance(model, OnnxModel):
        raise UsageError("--torchcompile compiles PyTorch models; an ONNX file runs in onnxruntime")
    if torchcompile:
        model = torch.compile(model, backend=torchcompile)
    return model


LABEL_TYPES = ("none", "name", "description", "detail")


def label_lookup(model: torch.nn.Module, label_type: str) -> list[str] | None:
    """Class labels by index for --label-type: ImageNet info for ImageNet models, else stored names."""
    if label_type == "none":
        return None
    from timm.data import ImageNetInfo, infer_imagenet_subset

    stored = class_names_of(model)
    subset = infer_imagenet_subset(model)
    if subset and (stored is None or stored[0].startswith("n0")):
        info = ImageNetInfo(subset)
        count = info.num_classes()
        if label_type == "name":
            return list(info.label_names())
        return [info.index_to_description(i, detailed=label_type == "detail") for i in range(count)]
    if stored is None:
        return [str(i) for i in range(getattr(model, "num_classes", 0))]
    descriptions = (getattr(model, "pretrained_cfg", None) or {}).get("label_descriptions")
    if label_type != "name" and descriptions and len(descriptions) == len(stored):
        if isinstance(descriptions, dict):
            return [descriptions.get(name, name) for name in stored]
        return list(descriptions)
    return stored


def export_model_folder(model: torch.nn.Module, folder: str | Path, class_names: list[str] | None,
                        data_config: Mapping[str, Any]) -> Path:
    """Write config.json + model.safetensors that validate.py / inference.py take as ``--model FOLDER``.

    The folder is written beside its final place and renamed over it, so a
    crash never leaves a half-exported model.
    """
    import shutil
    import tempfile

    from timm.models import save_for_hf

    target = Path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        config = {"label_names": list(class_names)} if class_names else None
        keys = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
        save_for_hf(model, str(staging), model_config=config, safe_serialization=True,
                    data_config={k: data_config[k] for k in keys if k in data_config})
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside torch.compile and DDP wrappers (their state_dict keys carry prefixes)."""
    model = getattr(model, "_orig_mod", model)
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)

"""Create timm models on the target device, with errors a user can act on.

Model names are timm's: registry names with optional pretrained tags
(``resnet50.a1_in1k``), ``hf-hub:org/name``, ``local-dir:/path``; a bare path to a
model folder (config.json + model.safetensors) also works, and so does an ``.onnx``
file (run through onnxruntime).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import timm
import torch

from vtools.errors import UsageError
from vtools.models.onnx_model import is_onnx, load_onnx_model
from vtools.models.weights import cast_integer_buffers, fit_problems, load_checkpoint, read_state_dict

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


def is_multi_label_model(name: str) -> bool:
    """Whether model ``name`` is a model folder a multi-label run exported (config.json's ``multi_label``):
    its classes are scored each by a sigmoid, and an image may have several or none."""
    folder = model_folder_of(name)
    if folder is None or not (folder / "config.json").is_file():
        return False
    try:
        return bool(json.loads((folder / "config.json").read_text(encoding="utf-8")).get("multi_label"))
    except (OSError, ValueError, AttributeError):
        return False  # the model's loading says what is wrong with the folder


WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pth.tar", ".bin")  # what timm loads from a model folder


def model_files(name: str) -> list[tuple[str, Path]]:
    """The files that making model ``name`` reads, as (what, path): a model folder's config.json and
    weights, or an .onnx file; nothing for a timm or hub name (the cache is not the user's to guard)."""
    folder = model_folder_of(name)
    if folder is not None:
        try:
            read = [path for path in sorted(folder.iterdir()) if path.name.endswith(WEIGHT_SUFFIXES)]
        except OSError:  # a folder this user may not list: creating the model says why
            read = []
        return [(f"the model's {path.name}", path) for path in [folder / "config.json", *read]]
    return [("the model", Path(name))] if is_onnx(name) else []


def model_label(name: str) -> str:
    """A model's name in the names of files written for it: a timm name's last part, a model folder's
    or .onnx file's name. train.py names every run's model folder ``model/``, so such a folder (and the
    ``model.onnx`` exported into it) is named after its run: runs/a/model is ``a``."""
    folder = model_folder_of(name)
    onnx = folder is None and is_onnx(name)
    path = Path(os.path.abspath(folder or name)) if folder is not None or onnx else Path(name.rstrip("/"))
    if onnx:
        path = path.with_suffix("")
    while path.name == "model" and path.parent.name:
        path = path.parent
    return path.name.replace(":", "_") + (".onnx" if onnx else "")


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
    flag: str = "--model",
    **extra: Any,
) -> torch.nn.Module:
    """Build a timm model on ``device``, with pretrained weights and/or a checkpoint; an ``.onnx`` file
    gives the same interface over onnxruntime (vtools/models/onnx_model.py). ``flag``: the option that
    named the model, for the messages (--kd-model-name for a teacher)."""
    if is_onnx(name):
        if checkpoint:
            raise UsageError(f"{flag} {name} is an exported ONNX file: it takes no --checkpoint")
        return load_onnx_model(name)
    normalized = normalize_model_name(name)
    kwargs = {
        k: v
        for k, v in {"num_classes": num_classes, "in_chans": in_chans, **(model_kwargs or {}), **extra}.items()
        if v is not None
    }
    folder = model_folder_of(name)
    user_keys = set(model_kwargs or {})
    if folder is not None:
        _check_model_folder(folder)
        pretrained = True  # a model folder is its weights: they are always loaded
        if (model := _from_folder_on_device(name, normalized, folder, kwargs, device, user_keys, flag)) is not None:
            if checkpoint:
                load_checkpoint(model, checkpoint, use_ema=use_ema, device=device)
            return model
    model = _timm_create(name, normalized, pretrained, kwargs, folder, user_keys, flag)
    model.to(device)
    if checkpoint:
        load_checkpoint(model, checkpoint, use_ema=use_ema, device=device)
    return model


# the weight files timm looks for in a model folder, in its order (timm.models._hub.load_state_dict_from_path)
_FOLDER_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth")
_FOLDER_WEIGHT_EXTENSIONS = (".safetensors", ".pth", ".pth.tar", ".bin")


def folder_weights(folder: Path) -> Path:
    """The weights file of a model folder, found as timm finds it; one line when there is none."""
    for name in _FOLDER_WEIGHTS:
        if (folder / name).is_file():
            return folder / name
    for extension in _FOLDER_WEIGHT_EXTENSIONS:
        found = sorted(path for path in folder.glob(f"*{extension}") if path.is_file())
        if found:
            return found[0]
    raise UsageError(
        f"model folder {folder}: model.safetensors is missing (config.json only describes the model; the "
        "weights are in model.safetensors); put the model.safetensors saved with this config.json into the folder"
    )


def _from_folder_on_device(
    name: str,
    normalized: str,
    folder: Path,
    kwargs: dict[str, Any],
    device: torch.device | str,
    user_keys: set[str],
    flag: str = "--model",
) -> torch.nn.Module | None:
    """A model folder's weights read straight onto ``device`` (never running pickled code); None when timm
    must adapt them (another class count or channel count), which its own pretrained loader does on the host.
    Weights that fit neither way are refused in one line naming the file."""
    weights = folder_weights(folder)
    model = _timm_create(name, normalized, False, kwargs, folder, user_keys, flag).to(device)
    state = read_state_dict(weights, device=device)  # a one-line UsageError naming the file, or a refusal
    expected = model.state_dict()
    state = cast_integer_buffers(expected, state)
    problems = fit_problems(expected, state, shown=2)
    if not problems:
        model.load_state_dict(state)
        return model
    adapted = _adapted_by_timm(model, kwargs)
    if adapted:

        def kept(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {k: v for k, v in tensors.items() if not k.startswith(adapted)}

        if not fit_problems(kept(expected), kept(state)):
            return None
    architecture = getattr(model, "pretrained_cfg", {}).get("architecture") or type(model).__name__
    raise UsageError(
        f"model folder {folder}: {weights.name} does not fit {architecture}, the model its config.json "
        f"describes ({'; '.join(problems)}); give config.json the architecture and model_args the weights were "
        f"saved with, or put the weights of that model into {weights.name}"
    )


def _adapted_by_timm(model: torch.nn.Module, kwargs: dict[str, Any]) -> tuple[str, ...]:
    """Key prefixes that timm's pretrained loader replaces or converts for this model: the classifier when
    the class count differs from the folder's, the first convolution when the channel count does."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    stored_chans = (cfg.get("input_size") or (3,))[0]
    stored_classes = cfg.get("num_classes")
    prefixes: list[str] = []
    for key, differs in (
        ("classifier", stored_classes is not None and getattr(model, "num_classes", None) != stored_classes),
        ("first_conv", kwargs.get("in_chans", stored_chans) != stored_chans),
    ):
        names = cfg.get(key)
        if differs and names:
            prefixes.extend(f"{name}." for name in ((names,) if isinstance(names, str) else names))
    return tuple(prefixes)


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face Hub cannot be reached from here (None when it can): one quick connection, so
    that an offline machine learns it at once instead of after a minute of download retries."""
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    endpoint = urlsplit(constants.ENDPOINT)
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout).close()
    except OSError as err:
        return f"{endpoint.hostname}: {err.strerror or err}"
    return None


def _offline_first(name: str) -> None:
    """Before timm downloads pretrained weights: where the hub cannot be reached, read its cache only (as
    HF_HUB_OFFLINE=1 would), and say so in one line when the weights are not cached."""
    from huggingface_hub import constants

    reason = hub_unreachable()
    if reason is not None:
        constants.HF_HUB_OFFLINE = True  # read at each download: the cache, and no retries
        _offline_reasons[name] = reason


_offline_reasons: dict[str, str] = {}


def _timm_create(
    name: str,
    normalized: str,
    pretrained: bool,
    kwargs: dict[str, Any],
    folder: Path | None = None,
    user_keys: set[str] | frozenset[str] = frozenset(),
    flag: str = "--model",
) -> torch.nn.Module:
    """timm.create_model with its failures turned into one-line errors. ``folder``: the model folder that
    ``normalized`` reads; ``user_keys``: the keyword arguments that --model-kwargs gave; ``flag``: the option
    that named the model."""
    if pretrained and folder is None and "file" not in (kwargs.get("pretrained_cfg_overlay") or {}):
        _offline_first(name)
    try:
        return timm.create_model(normalized, pretrained=pretrained, **kwargs)
    except TypeError as err:  # a keyword argument the model's constructor does not take
        if "keyword argument" not in str(err):
            raise
        raise UsageError(_bad_argument_message(name, folder, user_keys, err, flag)) from err
    except (RuntimeError, ValueError, AttributeError) as err:
        if folder is not None and pretrained:  # timm's loader adapting a folder's weights (checked before)
            raise UsageError(
                f"model folder {folder}: its weights could not be adapted to this model "
                f"({type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''})"
            ) from err
        if isinstance(err, AttributeError):
            raise
        if str(err).startswith("Unknown model"):
            raise UsageError(_unknown_model_message(name, flag)) from err
        if "looks like a Hugging Face Hub repo id or a local path" in str(err):
            raise UsageError(f"{flag} {name}: no such model folder (expected a folder holding config.json)") from err
        if type(err).__name__ in _OFFLINE_ERRORS or "No pretrained weights" in str(err):
            raise UsageError(_download_message(name, err, flag)) from err
        raise
    except OSError as err:
        raise UsageError(_download_message(name, err, flag)) from err
    except Exception as err:  # hub clients raise their own exception types
        if type(err).__name__ in _OFFLINE_ERRORS:
            raise UsageError(_download_message(name, err, flag)) from err
        raise


def _bad_argument_message(
    name: str, folder: Path | None, user_keys: set[str] | frozenset[str], err: TypeError, flag: str = "--model"
) -> str:
    """Which keyword argument the model does not take, and where it came from."""
    found = re.search(r"keyword argument '([^']+)'", str(err))
    key = found.group(1) if found else ""
    detail = str(err).strip().splitlines()[0]
    stored = {}
    if folder is not None:
        stored = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_args") or {}
    if key in stored and key not in user_keys:
        return (
            f"model folder {folder}: config.json's model_args has {key!r}, which the model does not take "
            f"({detail}); remove it from model_args"
        )
    if key in user_keys:
        return f"--model-kwargs {key}=...: {flag} {name} does not take {key!r} ({detail}); remove it"
    where = " or the model_args of its config.json" if folder is not None else ""
    return f"{flag} {name} could not be built ({detail}); check --model-kwargs{where}"


def _check_model_folder(folder: Path) -> None:
    """config.json is there and says which timm model to build, in the form timm reads."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise UsageError(f"model folder {folder} has no config.json")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"model folder {folder}: config.json is not valid JSON ({err})") from err
    if not isinstance(config, dict):
        raise UsageError(
            f"model folder {folder}: config.json must hold an object (timm's model config), "
            f"not a {type(config).__name__}"
        )
    architecture = config.get("architecture")
    if architecture is None:
        raise UsageError(
            f"model folder {folder}: config.json has no 'architecture' (the timm model the weights belong to, "
            'e.g. "architecture": "resnet50"); add it'
        )
    if not isinstance(architecture, str) or not timm.is_model(architecture):
        close = difflib.get_close_matches(str(architecture), timm.list_models(), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "see timm.list_models()"
        raise UsageError(
            f"model folder {folder}: config.json's 'architecture' {architecture!r} is not a timm model ({hint}); "
            "set it to the timm model the weights belong to"
        )
    for key, what in (
        ("model_args", 'keyword arguments for timm.create_model (e.g. {"num_classes": 3})'),
        ("pretrained_cfg", "the model's preprocessing (timm's pretrained_cfg)"),
    ):
        if key in config and not isinstance(config[key], dict):
            raise UsageError(
                f"model folder {folder}: config.json's {key!r} must be an object of {what}, "
                f"not a {type(config[key]).__name__}; fix it or remove it"
            )
    num_classes = config.get("num_classes", (config.get("pretrained_cfg") or {}).get("num_classes"))
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)):
        raise UsageError(
            f"model folder {folder}: config.json's 'num_classes' is {num_classes!r}, not a whole number; "
            "set it to the number of classifier outputs"
        )


def _unknown_model_message(name: str, flag: str = "--model") -> str:
    base = name.split(".")[0]
    close = difflib.get_close_matches(base, timm.list_models(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models()"
    return f"{flag}: unknown model {name!r}{hint}"


def _download_message(name: str, err: BaseException, flag: str = "--model") -> str:
    local = (
        f"pass a local model folder instead ({flag} path/to/folder holding config.json + model.safetensors), "
        "or download the weights once where the hub can be reached"
    )
    if name in _offline_reasons:
        return (
            f"{flag} {name}: the Hugging Face Hub cannot be used ({_offline_reasons[name]}) and these "
            f"pretrained weights are not in the local cache; {local}"
        )
    detail = str(err).strip().splitlines()[0].split(". ")[0].rstrip(".") if str(err).strip() else ""
    return f"{flag} {name}: pretrained weights could not be loaded ({type(err).__name__}: {detail}); {local}"

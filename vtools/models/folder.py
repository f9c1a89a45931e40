"""Model folders (config.json + model.safetensors + class names) and the class names a model carries."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from vtools.atomic import shared_file_mode


def class_names_of(model: torch.nn.Module) -> list[str] | None:
    """Class names stored with a model folder or checkpoint (``label_names`` in its config)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    names = cfg.get("label_names")
    if names and len(names) == getattr(model, "num_classes", len(names)):
        return list(names)
    return None


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


def export_model_folder(
    model: torch.nn.Module,
    folder: str | Path,
    class_names: list[str] | None,
    data_config: Mapping[str, Any],
    multi_label: bool = False,
) -> tuple[Path, list[str]]:
    """Write config.json + model.safetensors that validate.py / inference.py take as ``--model FOLDER``;
    ``multi_label`` is recorded in config.json (``"multi_label": true``), so inference.py scores each
    class with a sigmoid.

    Both files are written beside the folder first and each is renamed into it, so a crash never leaves
    a half-written file, and the folder is never missing. Files in it that this export does not write
    (an exported ``model.onnx``, a note) are left as they are; their names are returned.
    """
    import shutil
    import tempfile

    from timm.models import save_for_hf

    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        config: dict[str, Any] = {"label_names": list(class_names)} if class_names else {}
        if multi_label:
            config["multi_label"] = True
        keys = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
        save_for_hf(
            model,
            str(staging),
            model_config=config or None,
            safe_serialization=True,
            data_config={k: data_config[k] for k in keys if k in data_config},
        )
        written = sorted(path.name for path in staging.iterdir())
        for name in sorted(written, key=lambda name: name == "config.json"):  # the config last
            os.chmod(staging / name, shared_file_mode())  # as the checkpoints beside it, not 0600
            os.replace(staging / name, target / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, sorted(path.name for path in target.iterdir() if path.name not in written)

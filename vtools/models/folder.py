"""Model folders (config.json + model.safetensors + class names) and the class names a model carries."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch


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
    model: torch.nn.Module, folder: str | Path, class_names: list[str] | None, data_config: Mapping[str, Any]
) -> Path:
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
        save_for_hf(
            model,
            str(staging),
            model_config=config,
            safe_serialization=True,
            data_config={k: data_config[k] for k in keys if k in data_config},
        )
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target

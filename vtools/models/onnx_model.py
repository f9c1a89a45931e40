"""An exported ``.onnx`` file run by onnxruntime, behind the interface the scripts use for timm models.

``validate.py --model path/model.onnx`` and ``inference.py --model ...onnx``
then measure the artefact that ships, with the same loaders, preprocessing,
labels and results files as the PyTorch model: the wrapper takes the batch the
loader put on the device, runs it through onnxruntime on the host and hands
the logits back on the device. Preprocessing and class names come from the
model folder's ``config.json`` beside the file (``vtools export`` writes the
``.onnx`` there), else from the input shape and ImageNet defaults.

onnxruntime is optional (requirements-deploy.txt).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from vtools.errors import UsageError
from vtools.optional import optional_module


def is_onnx(name: str) -> bool:
    return str(name).lower().endswith(".onnx")


class OnnxModel(torch.nn.Module):
    """Logits from an onnxruntime session, on the device the input came from."""

    def __init__(self, path: Path, session: Any, config: dict[str, Any], param_count: int | None = None) -> None:
        super().__init__()
        self.path = path
        self.param_count = param_count  # the graph's weights (torch sees none: they live in the file)
        self.session = session
        self.input_name = session.get_inputs()[0].name
        self.pretrained_cfg = config.get("pretrained_cfg", {})
        self.num_classes = int(config["num_classes"])
        self.num_features = 0
        self.label_names = config.get("label_names")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        array = images.detach().to("cpu", torch.float32).contiguous().numpy()
        (logits,) = self.session.run(None, {self.input_name: array})
        return torch.from_numpy(np.asarray(logits)).to(images.device)


def _default_config(session: Any) -> dict[str, Any]:
    shape = session.get_inputs()[0].shape
    size = [d if isinstance(d, int) else 224 for d in shape[1:]]
    return {
        "input_size": tuple(size),
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "crop_pct": 0.875,
        "interpolation": "bicubic",
    }


def load_onnx_model(path: str | Path) -> OnnxModel:
    """Open ``path`` with onnxruntime (CPU execution provider) and its model folder's config."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--model {path}: the ONNX file does not exist")
    ort = optional_module("onnxruntime", f"--model {path.name}")
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own exception types for unreadable files
        raise UsageError(f"--model {path}: onnxruntime cannot load it ({str(err).splitlines()[0]})") from None
    config_path = path.parent / "config.json"
    config: dict[str, Any] = {}
    if config_path.is_file():
        loaded = json.loads(config_path.read_text(encoding="utf-8"))
        config = loaded if isinstance(loaded, dict) else {}
    config.setdefault("num_classes", session.get_outputs()[0].shape[-1])
    names = {"label_names": config["label_names"]} if config.get("label_names") else {}
    config["pretrained_cfg"] = {**_default_config(session), **config.get("pretrained_cfg", {}), **names}
    return OnnxModel(path, session, config, onnx_param_count(path))


def onnx_param_count(path: Path) -> int | None:
    """The number of weights the ONNX graph holds (its initializers), read with the onnx package; None
    where it is not installed (onnxruntime runs a graph without it)."""
    try:
        import onnx
    except ImportError:
        return None
    graph = onnx.load(str(path), load_external_data=False).graph
    return int(sum(int(np.prod(tensor.dims)) for tensor in graph.initializer))

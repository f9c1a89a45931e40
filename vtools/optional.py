"""Optional packages: imported when a feature needs them, else one line naming what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from vtools.errors import UsageError

CORE = "pip install -r requirements.txt"  # a core package that is missing: matplotlib, say
DEPLOY = "pip install -r requirements-deploy.txt"  # onnx, onnxruntime
TRACK = "pip install -r requirements-track.txt"  # wandb, mlflow, tensorboard
HF = "pip install -r requirements-hf.txt"  # datasets
SHARDS = "pip install wids (or pip install -r requirements.txt)"  # tar shards: --dataset wds/...


def optional_module(name: str, purpose: str, install: str = DEPLOY) -> ModuleType:
    """Import ``name`` for ``purpose``, or stop with one line (exit 2) naming the install command."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise UsageError(f"{purpose} needs the package {name}, which is not installed ({err}): {install}") from None

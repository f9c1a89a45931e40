"""What a device bug report needs: versions, devices, AMP policy, cpu budget, environment."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any

import torch

from vtools.errors import UsageError
from vtools.runtime import device as dev
from vtools.runtime.amp import resolve_amp
from vtools.runtime.cpu_budget import setup_cpu_budget

ENV_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
    "ASCEND_TOOLKIT_HOME",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "OMP_NUM_THREADS",
    "CPU_AFFINITY_CONF",
)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def collect(device_spec: str = "auto", device_modules: tuple[str, ...] = ()) -> dict[str, Any]:
    """Gather versions, devices, AMP policy and environment into one dict.

    A device that cannot be used is reported, not raised: when a backend is
    broken the rest of the report is what a bug report needs.
    """
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "timm": _version("timm"),
    }
    try:
        target = dev.resolve_device(device_spec, device_modules)
    except UsageError as err:
        target = None
        problem = str(err)
    report.update(dev.backend_versions())
    if target is None:
        report["device"] = f"{device_spec} unusable: {problem}"
    else:
        report.update(_device_report(target))
    report["environment"] = {name: os.environ.get(name, "unset") for name in ENV_VARS}
    return report


def _device_report(target: torch.device) -> dict[str, Any]:
    count = dev.device_count(target.type)
    amp = resolve_amp(target, amp=True)
    return {
        "device": str(target),
        "device_count": count,
        "devices": [
            dev.describe(torch.device(target.type, i) if target.type != "cpu" else target) for i in range(count)
        ],
        "amp_policy": amp.dtype_name,
        "grad_scaler": amp.needs_grad_scaler,
        "dist_backend": _dist_backend_or_reason(target),
        "tuning": dev.apply_tuning(target) or "none",
        "cpu_budget": setup_cpu_budget(target).describe(),
    }


def _dist_backend_or_reason(target: torch.device) -> str:
    try:
        return dev.dist_backend(target)
    except Exception as err:  # report, do not fail: this is a diagnostic
        return f"unavailable ({err})"


def format_report(report: dict[str, Any]) -> str:
    """Aligned ``key: value`` lines, devices and env vars indented below."""
    lines = []
    for key, value in report.items():
        if key == "devices":
            lines.append("devices:")
            for info in value:
                extras = ", ".join(f"{k}={v}" for k, v in info.items() if k not in ("device", "name"))
                lines.append(f"  {info['device']}: {info['name']}" + (f" ({extras})" if extras else ""))
        elif isinstance(value, dict):
            lines.append(f"{key}:")
            lines.extend(f"  {name}={val}" for name, val in value.items())
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)

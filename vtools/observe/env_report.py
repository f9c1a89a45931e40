"""What a device bug report needs: versions, devices, AMP policy, cpu budget, environment.

Which backend packages, toolkits and environment variables to report is read from the device table
(vtools/runtime/device_kinds.py), so a new row is reported without an edit here.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
from typing import Any

import torch

from vtools.errors import UsageError
from vtools.runtime import device as dev
from vtools.runtime.amp import resolve_amp
from vtools.runtime.cpu_budget import setup_cpu_budget
from vtools.runtime.preflight import package_status

# the variables of any run, whatever its device; each device type's own come from its row
RUN_ENV_VARS = ("TORCH_DEVICE_BACKEND_AUTOLOAD", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "OMP_NUM_THREADS")


def environment_variables() -> tuple[str, ...]:
    """Every variable the report shows: each device row's (visible devices, toolkit, affinity,
    recommended settings), then those of any run."""
    names = [name for kind in dev.DEVICE_KINDS.values() for name in kind.environment_variables()]
    return tuple(dict.fromkeys([*names, *RUN_ENV_VARS]))


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
    report.update(backend_versions())
    if target is None:
        report["device"] = f"{device_spec} unusable: {problem}"
    else:
        report.update(_device_report(target))
    report["environment"] = {name: os.environ.get(name, "unset") for name in environment_variables()}
    kind = dev.kind_of(device_spec.split(":")[0].strip().lower())
    if kind.status_command:
        report["status"] = vendor_status(kind.status_command)
    return report


STATUS_SECONDS = 30  # a status tool on a sick host can hang; the report goes on without it


def vendor_status(command: tuple[str, ...]) -> str:
    """The vendor status tool's report (``npu-smi info``: driver and firmware versions, each card's health,
    memory and processes, the first thing a vendor's support asks for), or why there is none."""
    if shutil.which(command[0]) is None:
        return f"{' '.join(command)}: not on PATH"
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=STATUS_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return f"{' '.join(command)}: no answer in {STATUS_SECONDS} s"
    except OSError as err:
        return f"{' '.join(command)}: {err.strerror or err}"
    text = (proc.stdout + proc.stderr).rstrip()
    failed = f" (exit {proc.returncode})" if proc.returncode else ""
    return f"{' '.join(command)}{failed}:\n" + "\n".join(f"  {line}" for line in text.splitlines())


def _device_report(target: torch.device) -> dict[str, Any]:
    count = dev.device_count(target.type)
    amp = resolve_amp(target, amp=True)
    return {
        "device": str(target),
        "device_count": count,
        "devices": [
            describe(target if dev.kind_of(target.type).host else torch.device(target.type, i)) for i in range(count)
        ],
        "amp_policy": amp.describe(),
        "grad_scaler": amp.needs_grad_scaler,
        "overflow": amp.overflow.describe(),
        "dist_backend": _dist_backend_or_reason(target),
        "tuning": dev.apply_tuning(target) or "none",
        "cpu_budget": setup_cpu_budget(target).describe(),
    }


def describe(device: torch.device) -> dict[str, Any]:
    """Name and memory of one device."""
    info: dict[str, Any] = {"device": str(device)}
    if dev.kind_of(device.type).host:
        info["name"] = _cpu_name()
        return info
    info["name"] = dev.device_name(device)
    module = dev.device_module(device)
    props = getattr(module, "get_device_properties", None)
    total = getattr(props(device), "total_memory", None) if props is not None else None
    if total is not None:
        info["memory_gib"] = round(total / 2**30, 1)
    info["bf16"] = dev.is_bf16_supported(device)
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def backend_versions() -> dict[str, str]:
    """Versions of the device backends: the toolkits torch was built for, each row's package (and whether
    it loads), each row's toolkit installation."""
    kinds = dev.DEVICE_KINDS.values()
    versions: dict[str, str] = {}
    for kind in kinds:
        for toolkit in kind.torch_build:
            built_for = getattr(torch.version, toolkit, None)
            if built_for:
                versions[f"torch_built_for_{toolkit}"] = built_for
    for kind in kinds:
        status = package_status(kind.package) if kind.package else None
        if status is not None:
            versions[kind.package] = status
    for kind in kinds:
        home = next((os.environ[name] for name in kind.toolkit_home_env if os.environ.get(name)), None)
        if home:
            versions[kind.toolkit] = home
    return versions


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

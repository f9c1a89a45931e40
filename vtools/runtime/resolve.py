"""From flags to a runtime: the device, its AMP policy and the cpu budget a script runs with."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from timm.layers import set_fast_norm

from vtools.errors import UsageError
from vtools.runtime import preflight
from vtools.runtime.amp import AmpPolicy, resolve_amp
from vtools.runtime.cpu_budget import CpuBudget, setup_cpu_budget
from vtools.runtime.device import apply_tuning, resolve_device
from vtools.runtime.distributed import adopt_srun_launch
from vtools.runtime.options import RuntimeOptions


@dataclass(frozen=True)
class Runtime:
    """The resolved device and precision policy a script runs with."""

    device: torch.device
    amp: AmpPolicy
    budget: CpuBudget
    model_dtype: torch.dtype | None = None  # --model-dtype: the weights' and the batches' dtype
    notes: tuple[str, ...] = ()  # preflight's notes (the chip and its precision, settings applied)


def setup_runtime(options: RuntimeOptions) -> Runtime:
    """Resolve --device/--device-modules and --amp/--amp-dtype into a :class:`Runtime`, apply the
    device type's speed settings (TF32 and cuDNN autotuning on CUDA, as timm's train.py does) and
    split the host's cores between loader workers and the main process (vtools/runtime/cpu_budget.py)."""
    adopt_srun_launch()  # srun's SLURM_* as torchrun's RANK/LOCAL_RANK/...: LOCAL_RANK picks the device
    before = preflight.before_device(options.device)
    stop_on_errors(before)
    device = resolve_device(options.device, options.device_modules or ())
    findings = before + preflight.after_device(device, options.device)
    stop_on_errors(findings)
    notes = [
        finding.text if finding.severity == "note" else f"{finding.severity}: {finding.text}"
        for finding in findings
        if "recommended" not in finding.text
    ]
    if options.device_settings or options.device_kwargs:
        notes += preflight.apply_settings(device, options.device_settings, options.device_kwargs)
    apply_tuning(device)
    budget = setup_cpu_budget(device, options.workers, options.threads, options.bind_cores)
    if options.fast_norm:
        set_fast_norm()  # before any model is built: timm's norm layers read it when created
    model_dtype = getattr(torch, options.model_dtype) if options.model_dtype else None
    return Runtime(
        device=device,
        amp=resolve_amp(device, options.amp, options.amp_dtype),
        budget=budget,
        model_dtype=model_dtype,
        notes=tuple(notes),
    )


def stop_on_errors(findings: list[preflight.Finding]) -> None:
    """Preflight's first error ends the script in one line (exit 2), before any model is built."""
    errors = [finding for finding in findings if finding.severity == "error"]
    if errors:
        raise UsageError(errors[0].text)

"""The options a script's runtime is resolved from, without importing torch.

train.py's typed options (vtools/options/train_job.py) hold these among its concerns and are read before
torch is imported (``--help`` and a mistyped flag answer at once), so this dataclass lives apart from
:func:`vtools.runtime.resolve.setup_runtime`, which acts on it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeOptions:
    """The flags :func:`setup_runtime` reads: device, precision, the cpu budget and speed switches."""

    device: str  # a device spec: auto, cpu, cuda:1, npu, ...
    device_modules: list[str] | None  # extra modules that register a device type
    amp: bool
    amp_dtype: str
    threads: int | None
    bind_cores: bool
    device_settings: bool  # apply the chip's recommended settings
    device_kwargs: dict[str, object]  # backend settings by name (preflight.apply_settings)
    fast_norm: bool
    model_dtype: str | None  # a torch dtype name for the weights and the batches
    # parity.py builds no loader, so it has no --workers: the only field with a default
    workers: int | None = None

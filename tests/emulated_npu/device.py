"""``torch.npu`` for the emulated Ascend NPU.

A small subset of torch_npu's ``torch.npu`` API, enough for PyTorch's generic
code (torch.accelerator, torch.autocast, GradScaler, torch.manual_seed,
DataLoader pinning, ``tensor.npu()``) and for device-agnostic training code.

Randomness: random ops run on CPU copies of npu tensors, so they draw from the
CPU default generator, and the rng functions here read and reseed that same
generator (``torch.npu.manual_seed(s)`` also reseeds the CPU). A real NPU has
one generator per device.

Bad device indices raise like torch.cuda does: RuntimeError from the runtime
(set_device, memory functions), AssertionError from get_device_properties /
get_device_name, ValueError for a device of another type.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Union

import torch

from ._build import load_extension

_C = load_extension()

_DeviceLike = Union[int, str, torch.device, None]

DEVICE_NAME = "Emulated Ascend NPU (CPU memory)"


def _index(device: _DeviceLike = None) -> int:
    """Device index of ``device``; None / "npu" mean the current device."""
    if device is None:
        return _C.current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "npu":
            raise ValueError(f"Expected an npu device, but got: {device}")
        return _C.current_device() if device.index is None else device.index
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    raise ValueError(f"Expected an npu device or index, but got: {device!r}")


# --- availability and device selection --------------------------------------


def is_available() -> bool:
    return _C.device_count() > 0


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device: _DeviceLike) -> None:
    _C.set_device(_index(device))


class device:
    """Context manager that makes ``idx`` the current npu device (like torch.cuda.device).

    torch.load(..., map_location="npu:1") relies on it. A negative index or a
    non-npu device leaves the current device alone.
    """

    def __init__(self, idx: _DeviceLike):
        if isinstance(idx, (str, torch.device)) and torch.device(idx).type != "npu":
            self.idx = -1
        else:
            self.idx = _index(idx)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx >= 0:
            self.prev_idx = _C.current_device()
            _C.set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0:
            _C.set_device(self.prev_idx)


def synchronize(device: _DeviceLike = None) -> None:
    """No-op after validating ``device``: every op finishes before it returns."""
    _check(_index(device))


def _check(index: int) -> None:
    if not 0 <= index < _C.device_count():
        raise RuntimeError(
            f"npu: invalid device ordinal {index} "
            f"(the emulator has {_C.device_count()} device(s))"
        )


def _is_in_bad_fork() -> bool:
    # No driver context that a fork could break.
    return False


# --- capabilities ------------------------------------------------------------


def is_bf16_supported() -> bool:
    """False with VTOOLS_EMU_NPU_NO_BF16=1 (an Ascend 910A), else True (910B)."""
    return os.environ.get("VTOOLS_EMU_NPU_NO_BF16", "") != "1"


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Consulted by torch.autocast("npu", dtype=...)."""
    if is_bf16_supported():
        return [torch.float16, torch.bfloat16]
    return [torch.float16]


@dataclass(frozen=True)
class NpuDeviceProperties:
    name: str
    total_memory: int
    index: int
    type: str = "npu"


def get_device_properties(device: _DeviceLike = None) -> NpuDeviceProperties:
    index = _index(device)
    assert 0 <= index < _C.device_count(), "Invalid device id"
    return NpuDeviceProperties(name=DEVICE_NAME, total_memory=_C.total_memory(), index=index)


def get_device_name(device: _DeviceLike = None) -> str:
    return get_device_properties(device).name


# --- memory --------------------------------------------------------------------


def memory_allocated(device: _DeviceLike = None) -> int:
    """Bytes held by live npu tensors on ``device``."""
    return _C.memory_allocated(_index(device))


def max_memory_allocated(device: _DeviceLike = None) -> int:
    """Peak of memory_allocated since start or the last reset_peak_memory_stats."""
    return _C.max_memory_allocated(_index(device))


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    _C.reset_peak_memory_stats(_index(device))


def mem_get_info(device: _DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes; total is a fixed, advertised 64 GiB."""
    return tuple(_C.mem_get_info(_index(device)))


def empty_cache() -> None:
    """Nothing is cached: freed tensors go straight back to the host."""


# --- random numbers (delegated to the CPU default generator) --------------------


def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def seed() -> None:
    torch.default_generator.seed()


def seed_all() -> None:
    torch.default_generator.seed()


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state(device: _DeviceLike = "npu") -> torch.Tensor:
    _check(_index(device))
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "npu") -> None:
    _check(_index(device))
    torch.default_generator.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: Any) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)

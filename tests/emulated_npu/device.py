"""``torch.npu`` for the emulated Ascend NPU.

A small subset of torch_npu's ``torch.npu`` API, enough for PyTorch's generic
code (torch.accelerator, torch.autocast, GradScaler, torch.manual_seed,
DataLoader pinning, ``tensor.npu()``) and for device-agnostic training code.

Randomness: each device has its own generator, as on a real NPU. Random ops
run on CPU copies of npu tensors with the device's generator standing in for
the CPU's, so seeding, saving or restoring the CPU generator does not touch
the npu streams of random numbers (and forgetting the device's shows).

Streams and events: ``Stream``/``current_stream``/``stream()``/``Event`` are
torch's generic stream objects on the npu device. Kernels finish before they
return, but in strict mode (the default; ``VTOOLS_EMU_NPU_STRICT_STREAMS=0``
turns it off) a ``non_blocking`` host-to-device copy issued on a side stream
fills its destination with poison (NaN, or all bits set) until the copying
stream is waited for (``wait_stream``, an event, ``synchronize``) or runs a
kernel itself, so a consumer that forgets to wait reads garbage.

Bad device indices raise like torch.cuda does: RuntimeError from the runtime
(set_device, memory functions), AssertionError from get_device_properties /
get_device_name, ValueError for a device of another type.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from . import (
    chips,
    device_time,
    utils,  # noqa: F401  (torch.npu.utils, as in torch_npu)
)
from ._build import load_extension
from .utils import clear_npu_overflow_flag, get_npu_overflow_flag  # noqa: F401  (torch_npu.npu exports these two)

_C = load_extension()

_DeviceLike = int | str | torch.device | None

DEVICE_NAME = "Emulated Ascend NPU (CPU memory)"


def _index(device: _DeviceLike = None) -> int:
    """Device index of ``device``; None / "npu" mean the current device."""
    if device is None:
        return _C.current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "npu":
            raise ValueError(f"Expected a npu device, but got: {device}{_pta_error(_INVALID_VALUE)}")
        return _C.current_device() if device.index is None else device.index
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    raise ValueError(f"Expected a npu device or index, but got: {device!r}{_pta_error(_INVALID_VALUE)}")


# torch_npu's error codes (torch_npu/utils/_error_code.py): (number, words)
_INVALID_VALUE = (3, "invalid value")


def _pta_error(code: tuple[int, str]) -> str:
    """What torch_npu's ``pta_error`` appends to its messages: a second line with the time, process, device,
    rank and the error's code (none with TORCH_NPU_COMPACT_ERROR_OUTPUT=1 or in an interactive session)."""
    if int(os.environ.get("TORCH_NPU_COMPACT_ERROR_OUTPUT", "0")) or hasattr(sys, "ps1"):
        return ""
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime())
    try:
        import torch.distributed as dist

        rank = dist.get_rank()
    except Exception:  # torch_npu's own fallback: no process group
        rank = -1
    device = _C.current_device()
    return f"\n[ERROR] {stamp} (PID:{os.getpid()}, Device:{device}, RankID:{rank}) ERR00{code[0]:03d} PTA {code[1]}"


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

    def __init__(self, device: _DeviceLike):
        if isinstance(device, (str, torch.device)) and torch.device(device).type != "npu":
            self.idx = -1
        else:
            self.idx = _index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx >= 0:
            self.prev_idx = _C.current_device()
            _C.set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0:
            _C.set_device(self.prev_idx)


def synchronize(device: _DeviceLike = None) -> None:
    """Wait for the device: every stream's deferred copies land, every queued slow kernel has run."""
    index = _index(device)
    _check(index)
    _C.synchronize(index)
    device_time.wait_idle()


def _check(index: int) -> None:
    if not 0 <= index < _C.device_count():
        raise RuntimeError(f"npu: invalid device ordinal {index} (the emulator has {_C.device_count()} device(s))")


def _is_in_bad_fork() -> bool:
    # No driver context that a fork could break.
    return False


# --- capabilities ------------------------------------------------------------


def is_bf16_supported(including_emulation: bool = False) -> bool:
    """False with VTOOLS_EMU_NPU_NO_BF16=1 or a chip without bfloat16 (a 910A: the chip table), else True.
    ``including_emulation`` is torch_npu's parameter, which it ignores too."""
    return os.environ.get("VTOOLS_EMU_NPU_NO_BF16", "") != "1" and chips.bf16_supported()


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Consulted by torch.autocast("npu", dtype=...); torch_npu's list (torch_npu/npu/autocast_utils.py)."""
    if is_bf16_supported():
        return [torch.float16, torch.bfloat16, torch.float32]
    return [torch.float16, torch.float32]


@dataclass(frozen=True)
class _NpuDeviceProperties:
    name: str
    total_memory: int
    index: int
    type: str = "npu"


def get_device_properties(device_name: _DeviceLike = None) -> _NpuDeviceProperties:
    index = _index(device_name)
    if not 0 <= index < _C.device_count():
        raise AssertionError("Invalid device id" + _pta_error(_INVALID_VALUE))  # torch_npu's words
    chip = chips.chip()
    name = chips.CHIPS[chip] if chip else DEVICE_NAME
    return _NpuDeviceProperties(name=name, total_memory=_C.total_memory(), index=index)


def get_device_name(device_name: _DeviceLike = None) -> str:
    return get_device_properties(device_name).name


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


# --- random numbers: one generator per device -----------------------------------


def manual_seed(seed: int) -> None:
    _C.manual_seed(current_device(), int(seed))


def manual_seed_all(seed: int) -> None:
    for index in range(device_count()):
        _C.manual_seed(index, int(seed))


def seed() -> None:
    manual_seed(torch.seed())


def seed_all() -> None:
    manual_seed_all(torch.seed())


def initial_seed() -> int:
    return _C.initial_seed(current_device())


def get_rng_state(device: _DeviceLike = "npu") -> torch.Tensor:
    index = _index(device)
    _check(index)
    return _C.generator_state(index)


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "npu") -> None:
    index = _index(device)
    _check(index)
    _C.set_generator_state(index, new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: Any) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# --- streams and events ------------------------------------------------------------


class Stream(torch.Stream):
    """``torch.npu.Stream(device=None, priority=0)``: a new stream on an npu device."""

    def __new__(cls, device: _DeviceLike = None, priority: int = 0) -> Stream:
        return super().__new__(cls, device=torch.device("npu", _index(device)), priority=priority)


class Event(torch.Event):
    """``torch.npu.Event()``: an event on the current npu device."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> Event:
        return super().__new__(
            cls,
            device=torch.device("npu", current_device()),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )


def current_stream(device: _DeviceLike = None) -> torch.Stream:
    return torch.accelerator.current_stream(_index(device))


def default_stream(device: _DeviceLike = None) -> torch.Stream:
    current = current_stream(device)
    return torch.Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


class stream:
    """``with torch.npu.stream(s):`` makes ``s`` the current stream of its device for the block."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.previous: torch.Stream | None = None

    def __enter__(self) -> None:
        if self.stream is not None:
            self.previous = current_stream(self.stream.device_index)
            set_stream(self.stream)

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            set_stream(self.previous)


# torch_npu's operator compile mode: with jit_compile on, an operator is compiled for each new input shape; until
# set, the chip's default (vtools/runtime/device_chips.py: on for a 910A, off for Atlas A2/A3 and Ascend950)
_compile_mode: dict[str, bool] = {}


def set_compile_mode(jit_compile: bool = False) -> None:
    _compile_mode["jit_compile"] = bool(jit_compile)


# the launch queue's level: TASK_QUEUE_ENABLE at start (default 1), 0 under ASCEND_LAUNCH_BLOCKING=1 whatever was set
_task_queue: dict[str, int] = {}


def set_task_queue_enable(mode: int | str) -> None:
    mode = int(mode)
    if mode not in (0, 1, 2):
        raise RuntimeError(f"mode must be 0, 1, or 2, but got {mode}." + _pta_error((3, "invalid value")))
    _task_queue["mode"] = mode


def get_task_queue_enable() -> int:
    if os.environ.get("ASCEND_LAUNCH_BLOCKING") == "1":
        return 0
    return _task_queue.get("mode", int(os.environ.get("TASK_QUEUE_ENABLE", "1") or "1"))


def is_jit_compile_false() -> bool:
    return not _compile_mode.get("jit_compile", chips.jit_compile_default())


# --- settings torch_npu keeps in the runtime's option table, as attributes -------------------------------------


class _Settings:
    """``torch.npu.matmul``, ``torch.npu.conv``, ``torch.npu.config``: boolean switches with torch_npu's names
    and defaults (``npu_config.py``: HF32 matmuls off, convolutions on; internal formats as the chip table says),
    refusing what is not a bool as its own do."""

    def __init__(self, **defaults: Any) -> None:
        object.__setattr__(self, "_values", dict(defaults))

    def __getattr__(self, name: str) -> Any:
        value = self._values[name]
        return value() if callable(value) else value

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._values:
            raise AttributeError(name)
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, but got {type(value).__name__}" + _pta_error((2, "invalid type")))
        self._values[name] = value


matmul = _Settings(allow_hf32=False)
conv = _Settings(allow_hf32=True)
config = _Settings(allow_internal_format=lambda: chips.internal_format_default())

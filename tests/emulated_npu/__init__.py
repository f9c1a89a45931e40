"""Emulated Ascend NPU for CI: a PyTorch PrivateUse1 backend named "npu".

Importing this package compiles (first time only, see ``_build.py``) and loads
a small C++ extension, renames PyTorch's PrivateUse1 backend to "npu",
registers ``torch.npu`` (``device.py``) and adds ``Tensor.npu()``,
``Module.npu()`` and friends. Afterwards ``torch.device("npu:0")``,
``torch.accelerator`` (reports "npu"), ``torch.autocast("npu", ...)``,
``torch.amp.GradScaler("npu")``, ``tensor.pin_memory()`` and
``DataLoader(pin_memory=True)`` behave as on a host with torch_npu installed.
Importing it twice is harmless.

What it proves: code paths that select, move to, and run on a non-CUDA
accelerator through PyTorch's generic device APIs work - device strings and
indices, data movement, autocast dtype policy, grad scaling, pinned memory,
per-device memory statistics, checkpoints loaded onto the device - and that
they fail where a real NPU fails: operands on different devices raise
"Expected all tensors to be on the same device" (0-dim cpu scalars and cpu
index tensors excepted, as on CUDA); float64 tensors cannot live on the device;
what a side stream writes reads as poison on other streams until they wait for
it; each device has its own random generator. It counts host synchronisations
(``sync_count``) so tests can show a loop makes none per step.

Collectives: it registers the c10d backend "hccl" for npu tensors
(``process_group.py``), staged through gloo on host copies, so torchrun runs
join ``init_process_group("hccl", device_id=npu:N)`` and DDP, object
collectives and barriers run on npu tensors as on a host with torch_npu; like
HCCL it refuses collectives on host tensors.

What it takes from the real torch_npu 2.14.0 wheel (checked against it in
tests/runtime/test_device_kinds_wheel.py): the host-fallback sentences and which
operators fall back (``fallbacks.py``), the names and parameters of its
``torch.npu`` functions, get_amp_supported_dtype, the invalid-device and
out-of-memory messages (an allocation past 64 GiB per device fails as the
caching allocator fails), and how a chip overflows: a 910A saturates (inf
reads as the dtype's largest value, NaN as 0) and keeps a float-status flag,
read through torch_npu's ``npu::`` status operators, ``torch.npu.utils`` and
the saturation-mode kernel behind GradScaler (``chips.py``, ``utils.py``,
npu_overflow.cpp; the flag protocol is checked against the wheel in
tests/runtime/test_amp_overflow.py).

What it cannot prove: anything about torch_npu itself (its kernels, HCCL's
own transport and timeouts, graph mode, its caching allocator), numerics of real NPU
kernels, or speed. Tensors live in host memory; every op other than
allocation, copies and views runs on CPU copies of its inputs through
``at::native::cpu_fallback``, synchronously, so only the ordering between
streams is emulated, not concurrency; memory is freed at once (no caching
allocator), so a missing ``record_stream`` cannot fail. Ops that have no CPU
kernel (e.g. some fp16 ops) fail here and may work on an NPU - and vice versa.

Environment:
  ASCEND_RT_VISIBLE_DEVICES    if set, device count = number of entries
  VTOOLS_EMU_NPU_DEVICE_COUNT  device count otherwise (default 2)
  VTOOLS_EMU_NPU_NO_BF16=1     behave like an Ascend 910A (no bf16 autocast)
  VTOOLS_EMU_NPU_STRICT_STREAMS=0  let other streams see side-stream writes at once
  VTOOLS_EMU_NPU_CHIP          910A, 910B (910B1..910B4), 910_93 or 950: get_device_name()
                               says the SoC name ("Ascend910A", "Ascend910B1"...), and the
                               chip behaves as vtools' chip table says (bf16, jit_compile,
                               fused steps, internal formats: ``chips.py``); a 910A has no
                               Inf/NaN mode: float results saturate (inf -> the dtype's
                               largest value, NaN -> 0) and raise the float-status flag
                               (``utils.py``, npu_overflow.cpp)
  INF_NAN_MODE_ENABLE=0 with INF_NAN_MODE_FORCE_DISABLE=1  a 910B saturates too
  FORCE_OVERFLOW_CHECK=1       the flag is kept in Inf/NaN mode as well (CANN >= 9.1.0;
  VTOOLS_EMU_NPU_CANN_VERSION  the emulated CANN, default 9.1.0)
  VTOOLS_EMU_NPU_FALLBACK_OPS  e.g. "aten::relu_,aten::add.Tensor": these ops announce
                               a host (CPU) fallback on stderr in torch_npu's words,
                               besides those torch_npu 2.14.0 itself runs on the
                               host (unfold's and logit's backward...; ``fallbacks.py``)
  VTOOLS_EMU_NPU_FALLBACK_ANNOUNCE  once (default, per op and process, as
                               torch_npu) or always (at every call)
  VTOOLS_EMU_NPU_FAULT_OP      e.g. "aten::addmm": that op's npu results are off by
  VTOOLS_EMU_NPU_FAULT_SCALE   this relative amount (default 0.01) (``faults.py``)
  VTOOLS_EMU_NPU_SLOW_OP       e.g. "aten::addmm": each call returns at once but keeps the
  VTOOLS_EMU_NPU_SLOW_MS       device busy this many ms more (default 20); synchronize and
                               host reads wait for it, as on an NPU (``device_time.py``)
  VTOOLS_EMU_NPU_BUILD_DIR     build cache (default
                               ~/.cache/vtools/emulated_npu/<torch version>)
The device count is read once per process, at first use.

Run a command with the emulator installed, e.g. for CLI subprocesses:
  python -m tests.emulated_npu -m vtools.some_cli --device npu ...
"""

from __future__ import annotations

import os

import torch

__all__ = ["BACKEND_NAME", "install", "extension"]

BACKEND_NAME = "npu"


def _validate_env() -> None:
    count = os.environ.get("VTOOLS_EMU_NPU_DEVICE_COUNT")
    if count is not None and "ASCEND_RT_VISIBLE_DEVICES" not in os.environ:
        if not count.strip().isdigit():
            raise ValueError(f"VTOOLS_EMU_NPU_DEVICE_COUNT must be a non-negative integer, got {count!r}")


def install() -> None:
    """Register the emulated backend; safe to call any number of times."""
    _validate_env()
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", BACKEND_NAME):
        raise RuntimeError(
            f"PrivateUse1 is already taken by backend {current!r}; the emulated NPU cannot be installed in this process"
        )
    existing = getattr(torch, BACKEND_NAME, None)
    if existing is not None and not getattr(existing, "_vtools_emulated", False):
        raise RuntimeError(
            f"torch.{BACKEND_NAME} already exists ({existing!r}); is torch_npu installed? "
            "Do not combine it with the emulator"
        )

    from . import device  # builds/loads the C++ extension (registers kernels & hooks)

    if current != BACKEND_NAME:
        torch.utils.rename_privateuse1_backend(BACKEND_NAME)
    if existing is None:
        device._vtools_emulated = True
        torch._register_device_module(BACKEND_NAME, device)
    _patch_tensor_printing()
    from . import (  # Python kernels around the npu ones, only for the operators named
        chips,
        device_time,
        fallbacks,
        faults,
    )

    chips.apply()  # the chip's overflow mode; a bad VTOOLS_EMU_NPU_CHIP fails here
    fallbacks.install_from_env()
    faults.install_from_env()
    device_time.install_from_env()
    if not hasattr(torch.Tensor, BACKEND_NAME):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=False
        )
    from . import process_group  # the "hccl" collective backend for npu tensors

    process_group.register()


def _patch_tensor_printing() -> None:
    """Format npu tensors in float32, as PyTorch already does for fp64-less MPS/XPU.

    Tensor repr converts values to float64 on the tensor's device, which this
    emulator refuses for anything but 0-dim tensors.
    """
    from torch import _tensor_str

    original = _tensor_str.tensor_totype
    if getattr(original, "_vtools_emulated", False):
        return

    def tensor_totype(t):
        if t.device.type == BACKEND_NAME:
            return t.to(dtype=torch.float)
        return original(t)

    tensor_totype._vtools_emulated = True
    _tensor_str.tensor_totype = tensor_totype


def autoload() -> None:
    """The ``torch.backends`` entry point (see ``autoload/``): importing this package has already
    installed the backend by the time torch calls it."""


def extension():
    """The loaded C++ extension module (device counters live there: memory, ``sync_count``,
    ``hidden_storages``, ``recorded_streams``)."""
    from ._build import load_extension

    return load_extension()


install()

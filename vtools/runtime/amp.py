"""Mixed precision as a policy: which autocast dtype, and whether a GradScaler is needed.

The rule is the same on every device: bfloat16 where the device runs it
natively (no scaler needed: bf16 has fp32's exponent range), float16 with a
GradScaler otherwise. The host's cores are the exception: bfloat16 there only where the CPU computes it
natively (vtools/runtime/cpu_bf16.py), else full precision, which is faster than an emulated bfloat16 and than
float16 alike; the policy carries the reason as a note. timm's train.py creates its scaler only for CUDA, so
fp16 on an NPU trains unscaled; here the scaler is made for whatever device
type the policy is for. On a chip that saturates instead of producing inf (vtools/runtime/overflow.py) the
scaler is :class:`FlagGradScaler`, which handles the chip's float-status flag as the Ascend backend's own scaler
does.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from vtools.errors import UsageError
from vtools.runtime.cpu_bf16 import HostBf16, host_bf16
from vtools.runtime.device import is_bf16_supported, kind_of
from vtools.runtime.overflow import IEEE, FloatStatusFlag, OverflowMode, overflow_mode

AMP_DTYPES = ("auto", "bfloat16", "float16")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class AmpPolicy:
    """How to run forward passes on one device: autocast dtype or full precision."""

    device_type: str
    dtype: torch.dtype | None  # None: full precision (fp32)
    bf16_supported: bool = True  # whether the device runs bfloat16 (an Ascend 910A does not)
    overflow: OverflowMode = IEEE  # whether the chip saturates, and whether overflow checks read its flag
    note: str = ""  # why the precision is not what --amp usually means here (a CPU without native bfloat16)

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    @property
    def needs_grad_scaler(self) -> bool:
        """fp16 gradients underflow without loss scaling; bf16 and fp32 do not."""
        return self.dtype == torch.float16

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).replace("torch.", "") if self.dtype is not None else "float32"

    def describe(self) -> str:
        """The precision with its reason, where it has one (the start line, ``vtools env``)."""
        return self.note or self.dtype_name

    def autocast(self) -> AbstractContextManager:
        """The autocast context for a forward pass (a no-op when disabled)."""
        if not self.enabled:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """A GradScaler for this device type, exactly when fp16 is used; on a saturating chip, one that reads
        its float-status flag as the Ascend backend's does."""
        if not self.needs_grad_scaler:
            return None
        return FlagGradScaler(self.device_type) if self.overflow.saturates else torch.amp.GradScaler(self.device_type)

    def non_finite_advice(self) -> str:
        """What to try when the loss became inf or nan under this policy: float16 overflows above 65504, so
        bfloat16 where the device has it, else full precision; at bfloat16 or float32 the precision is not
        the cause."""
        if self.dtype != torch.float16:
            return "lower --lr or add --clip-grad"
        instead = "use --amp-dtype bfloat16" if self.bf16_supported else "train without --amp (no bfloat16 here)"
        return f"lower --lr, add --clip-grad, or {instead}: float16 overflows above 65504"


def resolve_amp(device: torch.device, amp: bool, amp_dtype: str = "auto") -> AmpPolicy:
    """Pick the autocast dtype for ``device`` from ``--amp`` / ``--amp-dtype``; the chip's overflow mode comes
    with it (float32 saturates too on a chip without Inf/NaN mode)."""
    if amp_dtype not in AMP_DTYPES:
        raise UsageError(f"--amp-dtype {amp_dtype!r}: choose one of {', '.join(AMP_DTYPES)}")
    overflow = overflow_mode(device)
    if not amp:
        return AmpPolicy(device.type, None, overflow=overflow)
    bf16 = is_bf16_supported(device)
    slow = _emulated_bf16(device)
    if amp_dtype == "auto" and slow is not None:
        return AmpPolicy(device.type, None, bf16_supported=bf16, overflow=overflow, note=slow.auto_note())
    if amp_dtype == "auto":
        amp_dtype = "bfloat16" if bf16 else "float16"
    elif amp_dtype == "bfloat16" and not bf16:
        raise UsageError(f"--amp-dtype bfloat16: {device} does not support bfloat16; use --amp-dtype float16")
    note = slow.forced_note() if slow is not None and amp_dtype == "bfloat16" else ""
    return AmpPolicy(device.type, _DTYPES[amp_dtype], bf16_supported=bf16, overflow=overflow, note=note)


def _emulated_bf16(device: torch.device) -> HostBf16 | None:
    """The CPU's verdict where the model computes on the host's cores and bfloat16 would be emulated there
    (it runs on any CPU, but fast only with native instructions); None elsewhere."""
    if not kind_of(device.type).computes_on_host:
        return None
    host = host_bf16()
    return None if host.native else host


class FlagGradScaler(torch.amp.GradScaler):
    """torch's GradScaler for a chip that saturates, with the two steps the Ascend backend's own scaler adds there
    (its npu/amp/grad_scaler.py; the protocol is read from the wheel in tests/runtime/test_amp_overflow.py):

    - the float-status flag is cleared at the first scaled loss of each update, so an overflow from before
      it (the forward pass, an evaluation, the last optimizer step) is not blamed on this update's gradients;
      the device's unscale kernel then reads the flag (the gradients hold no inf to find) and lowers it;
    - under torchrun every rank skips when one rank's flag rose: saturated gradients all-reduce to finite
      values, so the other ranks' flags stay down, and without this one rank steps while another skips.

    That scaler itself is not used: it reads the flag on the host at every step and prints a line at
    every overflow, and its checkpoints carry a key torch's scaler lacks; this one keeps torch's state and
    its one host read per step (the skip decision).
    """

    def __init__(self, device: str = "cuda", **kwargs: Any) -> None:
        super().__init__(device, **kwargs)
        self._flag_cleared = False
        self._held: torch.Tensor | None = None  # what the flag said before someone else lowered it

    def scale(self, outputs: Any) -> Any:
        if self.is_enabled() and not self._flag_cleared:
            FloatStatusFlag(_first_device(outputs, self._device)).clear()
            self._flag_cleared = True
        return super().scale(outputs)

    def hold_flag(self, flag: FloatStatusFlag) -> None:
        """Keep the flag's reading for this update before the caller lowers it (the training loop does,
        before each forward pass, to see that pass alone): a rise since the update's first scaled loss
        still skips the update. Before that first scaled loss nothing is this update's."""
        if self.is_enabled() and self._flag_cleared:
            raised = flag.raised()
            self._held = raised if self._held is None else self._held | raised

    def _unscale_grads_(
        self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool
    ) -> dict[torch.device, torch.Tensor]:
        per_device = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        if self._held is not None:
            for found in per_device.values():
                found.copy_(torch.maximum(found, self._held.to(found)))
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            for found in per_device.values():
                dist.all_reduce(found, op=dist.ReduceOp.MAX)
        return per_device

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        super().update(new_scale)
        self._flag_cleared, self._held = False, None


def _first_device(outputs: Any, device_type: str) -> torch.device:
    """The device of the first tensor in ``outputs`` (a tensor, or a list or tuple holding them)."""
    if isinstance(outputs, torch.Tensor):
        return outputs.device
    for item in outputs if isinstance(outputs, (list, tuple)) else ():
        return _first_device(item, device_type)
    return torch.device(device_type)

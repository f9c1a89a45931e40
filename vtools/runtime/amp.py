"""Mixed precision as a policy: which autocast dtype, and whether a GradScaler is needed.

The rule is the same on every device: bfloat16 where the device runs it
natively (no scaler needed: bf16 has fp32's exponent range), float16 with a
GradScaler otherwise. timm's train.py creates its scaler only for CUDA, so
fp16 on an NPU trains unscaled; here the scaler is made for whatever device
type the policy is for.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from vtools.errors import UsageError
from vtools.runtime.device import is_bf16_supported

AMP_DTYPES = ("auto", "bfloat16", "float16")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class AmpPolicy:
    """How to run forward passes on one device: autocast dtype or full precision."""

    device_type: str
    dtype: torch.dtype | None  # None: full precision (fp32)
    bf16_supported: bool = True  # whether the device runs bfloat16 (an Ascend 910A does not)

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

    def autocast(self) -> AbstractContextManager:
        """The autocast context for a forward pass (a no-op when disabled)."""
        if not self.enabled:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """A GradScaler for this device type, exactly when fp16 is used."""
        return torch.amp.GradScaler(self.device_type) if self.needs_grad_scaler else None

    def non_finite_advice(self) -> str:
        """What to try when the loss became inf or nan under this policy: float16 overflows above 65504, so
        bfloat16 where the device has it, else full precision; at bfloat16 or float32 the precision is not
        the cause."""
        if self.dtype != torch.float16:
            return "lower --lr or add --clip-grad"
        instead = "use --amp-dtype bfloat16" if self.bf16_supported else "train without --amp (no bfloat16 here)"
        return f"lower --lr, add --clip-grad, or {instead}: float16 overflows above 65504"


def resolve_amp(device: torch.device, amp: bool, amp_dtype: str = "auto") -> AmpPolicy:
    """Pick the autocast dtype for ``device`` from ``--amp`` / ``--amp-dtype``."""
    if amp_dtype not in AMP_DTYPES:
        raise UsageError(f"--amp-dtype {amp_dtype!r}: choose one of {', '.join(AMP_DTYPES)}")
    if not amp:
        return AmpPolicy(device.type, None)
    bf16 = is_bf16_supported(device)
    if amp_dtype == "auto":
        amp_dtype = "bfloat16" if bf16 else "float16"
    elif amp_dtype == "bfloat16" and not bf16:
        raise UsageError(f"--amp-dtype bfloat16: {device} does not support bfloat16; use --amp-dtype float16")
    return AmpPolicy(device.type, _DTYPES[amp_dtype], bf16_supported=bf16)

"""Operators the emulated npu runs "through a host fallback", announced in torch_npu's own words.

On a real Ascend host an operator with no NPU kernel goes to torch_npu's boxed
``npu_cpu_fallback``, which runs it on CPU copies and, the first time it sees
that operator in the process, prints::

    [W compiler_depend.ts:51] Warning: CAUTION: The operator 'aten::isin.Tensor_Tensor_out' is not
    currently supported on the NPU backend and will fall back to run on the CPU. This may have
    performance implications. (function npu_cpu_fallback)

(one line). Some of its kernels run on the host themselves and have sentences
of their own (unquoted, some naming several overloads, one for arguments the
device kernel does not take). Every sentence here is one of torch_npu 2.14.0's,
word for word: tests/runtime/test_device_kinds_wheel.py finds each in the strings
of the real wheel's libtorch_npu.so, and fails if the wheel has a form this
module lacks. They go through ``TORCH_NPU_WARN``, i.e. ``c10::WarningHandler``'s
base ``process``: straight to the process's stderr, file descriptor 2, NOT
through Python's ``warnings`` module. The emulator does the same: each sentence
is written with ``os.write(2, ...)`` once per process
(``VTOOLS_EMU_NPU_FALLBACK_ANNOUNCE=always``: at every call, the way a backend
that announces every call would).

Which operators announce:
  * always, as on torch_npu 2.14.0: those of :data:`KERNEL_WORDS` (unfold's and
    logit's backward among them, reached by models that use ``Tensor.unfold``,
    such as timm's HaloNets), and ``aten::_masked_softmax`` called with
    arguments its NPU kernel does not take (:data:`MASKED_SOFTMAX_CONDITIONS`);
  * on the chips whose fused steps lack them (:data:`CHIP_WORDS`: Adam's fused
    step below Ascend950), at every call;
  * not a host fallback but a slow path: an integer sort runs on the AI CPU
    (:data:`AICPU_SORT`, a log line of its own);
  * those listed in ``VTOOLS_EMU_NPU_FALLBACK_OPS``: as if the NPU had no kernel
    for them, with the kernel's own words where torch_npu has some for a CANN
    that lacks it (:data:`OLD_CANN_WORDS`), else the boxed fallback's.
The one form it cannot show is the sparse reductions' (:data:`SPARSE_WORDS`):
the emulator has no sparse tensors.

Every operator of the emulator already runs on CPU copies; what an announcing
operator gets is the announcement (and, through :mod:`.faults`, optionally a
numeric error). The wrapper is a Python kernel registered with ``torch.library``
for the PrivateUse1 dispatch key that calls the kernel it replaces
(``torch.library.get_kernel``), so behaviour is otherwise unchanged.

Operator names are torch_npu's: ``namespace::name`` for the default overload,
``namespace::name.overload`` otherwise (``aten::relu_``, ``aten::add.Tensor``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from . import device_time

FALLBACK_ENV = "VTOOLS_EMU_NPU_FALLBACK_OPS"
ANNOUNCE_ENV = "VTOOLS_EMU_NPU_FALLBACK_ANNOUNCE"
ANNOUNCE_MODES = ("once", "always")
# The wrappers stand in for C++ kernels, which have no Python frames: tools that show "where the run was"
# (vtools/observe/fallback.py) skip this module's frames, as pytest does.
__tracebackhide__ = True

# --- torch_npu 2.14.0's sentences (libtorch_npu.so), word for word -------------------------------------

BOXED = (
    "CAUTION: The operator '{op}' is not currently supported on the NPU backend and will fall back to run on the "
    "CPU. This may have performance implications."
)
_NOW = "Now this operator will fallback to run on the CPU and may have performance implications."
_UPDATE_CANN = " Please try to update your CANN version."


def _unsupported(ops: str) -> str:
    return f"CAUTION: The operator {ops} is currently not supported on the NPU backend. {_NOW}"


_LOGIT = _unsupported("aten::logit, aten::logit_ and aten::logit.out")
_LOGIT_BACKWARD = _unsupported("aten::logit_backward and aten::logit_backward.out")
# kernels that always run on the host; logit_backward's out= overload is torch's "grad_input"
KERNEL_WORDS: dict[str, str] = {
    "aten::unfold_backward": _unsupported("aten::unfold_backward"),
    "aten::logit": _LOGIT,
    "aten::logit_": _LOGIT,
    "aten::logit.out": _LOGIT,
    "aten::logit_backward": _LOGIT_BACKWARD,
    "aten::logit_backward.grad_input": _LOGIT_BACKWARD,
}
# work the device keeps but runs on its AI CPU (slowly): integer sorts, printed as the line itself, once
AICPU_SORT = (
    "Warning: kernel [ArgSort] can not support dtype int32 or int64 on AiCore, Now this kernel is running on "
    "AiCpu.If you are more concerned about high-performance execution,please cast dtype to float32."
)
AICPU_OPS = ("aten::sort", "aten::sort.stable")
# kernels that run on the host on some chips only (below Ascend950: the chip table's fused steps, in
# vtools/runtime/device_chips.py), announced with a plain TORCH_NPU_WARN: at every call, not once per process
CHIP_WORDS: dict[str, str] = {
    "aten::_fused_adam_": BOXED.format(op="aten::_fused_adam_"),
}
# kernels that run on the host where CANN lacks them (here: when listed in VTOOLS_EMU_NPU_FALLBACK_OPS)
OLD_CANN_WORDS: dict[str, str] = {
    "aten::_transform_bias_rescale_qkv": _unsupported("aten::_transform_bias_rescale_qkv") + _UPDATE_CANN,
    "aten::_masked_softmax": "CAUTION: The operator aten::_masked_softmax is currently not supported on the NPU "
    f"backend.{_NOW}{_UPDATE_CANN}",  # no space after "backend.": torch_npu's own
}
MASKED_SOFTMAX_CONDITIONS = (
    "CAUTION: The operator aten::_masked_softmax need to be met the following conditions to run on the NPU backend: "
    "1. dim = None/dim = -1/dim = input.dim()-1; 2. mask_type = 2; 3. input.dim() = 4. " + _NOW + " Please check "
    "your params."
)
_SPARSE = (
    "CPU fallback is allowed because TORCH_NPU_FALLBACK_CPU_DISABLE=0. Since the NPU interface does not support "
    "operator '{op}', the operator will fall back to CPU."
)
# the sparse CSR reductions (not reachable here: the emulator has no sparse tensors)
SPARSE_WORDS: dict[str, str] = {
    op: _SPARSE.format(op=op) for op in ("aten::_sparse_csr_sum.dim_dtype", "aten::_sparse_csr_prod.dim_dtype")
}


def announcement(op: str) -> str:
    """torch_npu's words for ``op`` run on the host (without the logger's prefix)."""
    return KERNEL_WORDS.get(op) or OLD_CANN_WORDS.get(op) or CHIP_WORDS.get(op) or BOXED.format(op=op)


def every_sentence() -> list[str]:
    """Every sentence this module can print, its templates with ``{op}`` left in."""
    tables = (KERNEL_WORDS, OLD_CANN_WORDS, SPARSE_WORDS, CHIP_WORDS)  # host fallbacks (AICPU_SORT is not)
    return sorted({BOXED, MASKED_SOFTMAX_CONDITIONS, *(words for table in tables for words in table.values())})


def masked_softmax_unmet(
    inputs: torch.Tensor, mask: Any = None, dim: int | None = None, mask_type: int | None = None
) -> str | None:
    """torch_npu's words when its _masked_softmax kernel refuses these arguments (then it runs on the host)."""
    last = dim is None or dim in (-1, inputs.dim() - 1)
    return None if last and mask_type == 2 and inputs.dim() == 4 else MASKED_SOFTMAX_CONDITIONS


def _integer_sort(values: torch.Tensor, *args: Any, **kwargs: Any) -> str | None:
    """The AI CPU's words for a sort of int32 or int64 values (its AI Core kernel takes floating point only)."""
    return AICPU_SORT if values.dtype in (torch.int32, torch.int64) else None


def _on_the_host_of_this_chip(op: str) -> Callable[..., str | None]:
    """A refusal for a fused step that runs on the host on the chips whose fused steps lack it."""

    def refuses(*args: Any, **kwargs: Any) -> str | None:
        from . import chips

        return None if chips.fused_on_device(op.split("::")[1]) else CHIP_WORDS[op]

    return refuses


def _log_line(text: str, function: str) -> bytes:
    """The line c10's logger prints for TORCH_NPU_WARN: ``[W<MMDD> <time> <file>:<line>] Warning: ...``."""
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now))
    nanos = int((now % 1) * 1e9)
    prefix = f"[W{stamp}.{nanos:09d} compiler_depend.ts:51]"
    return f"{prefix} Warning: {text} (function {function})\n".encode()


@dataclass
class _Hooks:
    """What the wrapper of one operator does around the kernel it replaced."""

    op: str
    original: Any
    library: Any
    fallback: bool = False
    # the device kernel's own refusal: the words it announces a call's host run with (None: it runs on the device)
    refuses: Callable[..., str | None] | None = None
    every_call: bool = False  # its refusal is announced at every call (a plain TORCH_NPU_WARN)
    raw: bool = False  # its words are a line of their own (a log line), not a c10 warning
    fault_scale: float | None = None
    device_ms: float | None = None  # device time each call queues (device_time.py); the call returns at once
    waits_for_device: bool = False  # a host read: waits for queued device time first (device_time.py)
    calls: int = 0


@dataclass
class _State:
    hooks: dict[str, _Hooks] = field(default_factory=dict)
    announced: set[str] = field(default_factory=set)  # the sentences printed (torch_npu warns once each)
    announce: str = "once"
    lock: threading.Lock = field(default_factory=threading.Lock)


_STATE = _State()


def parse_op_list(text: str | None) -> list[str]:
    return [name.strip() for name in (text or "").split(",") if name.strip()]


def resolve(op: str) -> torch._ops.OpOverload:
    """The overload torch_npu would name ``op``; a name the npu backend never sees raises ValueError."""
    if "::" not in op:
        raise ValueError(f"{op!r}: operator names look like 'aten::relu_' or 'aten::add.Tensor'")
    namespace, rest = op.split("::", 1)
    name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        raise ValueError(f"{op!r}: no such operator") from None
    overload = overload or "default"
    if overload not in packet.overloads():
        names = ", ".join(f"{namespace}::{name}" + ("" if o == "default" else f".{o}") for o in packet.overloads())
        raise ValueError(f"{op!r}: no such overload (there are: {names})")
    resolved = getattr(packet, overload)
    try:
        reaches_npu = torch._C._dispatch_has_computed_kernel_for_dispatch_key(resolved.name(), "PrivateUse1")
    except RuntimeError:  # a TorchScript-only overload (aten::add on ints): not a dispatcher operator
        reaches_npu = False
    if not reaches_npu:
        raise ValueError(f"{op!r} has no kernel for the npu backend (overloads: {', '.join(packet.overloads())})")
    if torch._C._dispatch_has_kernel_for_dispatch_key(resolved.name(), "CompositeImplicitAutograd"):
        raise ValueError(f"{op!r} never reaches the npu backend: it decomposes into other operators; name one of those")
    return resolved


def _schema_name(overload: torch._ops.OpOverload) -> str:
    """``c10::toString(op.schema().operator_name())``: no suffix for the default overload."""
    schema = overload._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def _announce(text: str, function: str, every_call: bool = False, raw: bool = False) -> None:
    with _STATE.lock:
        if _STATE.announce == "once" and not every_call:
            if text in _STATE.announced:
                return
            _STATE.announced.add(text)
    os.write(2, (text + "\n").encode() if raw else _log_line(text, function))


def _perturb(result: Any, scale: float) -> None:
    """Make each floating-point tensor of ``result`` wrong by ``scale`` (relative), in place."""
    if isinstance(result, torch.Tensor):
        if result.is_floating_point() and result.numel():
            torch.ops.aten.mul_.Scalar(result, 1.0 + scale)
    elif isinstance(result, (tuple, list)):
        for item in result:
            _perturb(item, scale)


def _make_kernel(hooks: _Hooks) -> Callable[..., Any]:
    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        hooks.calls += 1
        if hooks.fallback:
            boxed = hooks.op not in KERNEL_WORDS and hooks.op not in OLD_CANN_WORDS
            _announce(announcement(hooks.op), "npu_cpu_fallback" if boxed else hooks.op.split("::")[1])
        elif hooks.refuses is not None and (words := hooks.refuses(*args, **kwargs)) is not None:
            _announce(words, hooks.op.split("::")[1], every_call=hooks.every_call, raw=hooks.raw)
        if hooks.waits_for_device:
            device_time.wait_idle()
        result = hooks.original.call_boxed(keyset, *args, **kwargs)
        if hooks.fault_scale is not None:
            _perturb(result, hooks.fault_scale)
        if hooks.device_ms is not None:
            device_time.occupy(hooks.device_ms)
        return result

    return kernel


def hook(
    op: str,
    *,
    fallback: bool | None = None,
    fault_scale: float | None = None,
    refuses: Callable[..., str | None] | None = None,
    device_ms: float | None = None,
    waits_for_device: bool | None = None,
    every_call: bool | None = None,
    raw: bool | None = None,
) -> None:
    """Wrap ``op``'s npu kernel (once) and set what the wrapper does: announce a host fallback (at every call,
    or for the calls ``refuses`` picks), scale floating-point results by ``1 + fault_scale``, queue
    ``device_ms`` of device time per call, or wait for the queued device time first."""
    overload = resolve(op)
    op = _schema_name(overload)
    hooks = _STATE.hooks.get(op)
    if hooks is None:
        original = torch.library.get_kernel(overload, "PrivateUse1")
        library = torch.library.Library(overload.namespace, "IMPL")
        hooks = _Hooks(op, original, library)
        library.impl(overload.name().split("::", 1)[1], _make_kernel(hooks), "PrivateUse1", with_keyset=True)
        _STATE.hooks[op] = hooks
    if fallback is not None:
        hooks.fallback = fallback
    if fault_scale is not None:
        hooks.fault_scale = fault_scale
    if refuses is not None:
        hooks.refuses = refuses
    if every_call is not None:
        hooks.every_call = every_call
    if raw is not None:
        hooks.raw = raw
    if device_ms is not None:
        hooks.device_ms = device_ms
    if waits_for_device is not None:
        hooks.waits_for_device = waits_for_device


def unhook(op: str) -> None:
    """Put ``op``'s own kernel back."""
    hooks = _STATE.hooks.pop(_schema_name(resolve(op)), None)
    if hooks is not None:
        hooks.library._destroy()


def drop_fault(op: str) -> None:
    """Stop ``op``'s numeric fault (its kernel comes back unless it still announces a fallback)."""
    hooks = _STATE.hooks.get(_schema_name(resolve(op)))
    if hooks is not None:
        hooks.fault_scale = None
        if not hooks.fallback and hooks.refuses is None:
            unhook(op)


def calls(op: str) -> int:
    """How often ``op``'s wrapper ran (0 when it is not wrapped)."""
    hooks = _STATE.hooks.get(_schema_name(resolve(op)))
    return hooks.calls if hooks is not None else 0


def configured() -> list[str]:
    """The operators that currently announce a host fallback."""
    return sorted(op for op, hooks in _STATE.hooks.items() if hooks.fallback)


def set_announce(mode: str) -> None:
    if mode not in ANNOUNCE_MODES:
        raise ValueError(f"{ANNOUNCE_ENV} must be one of {', '.join(ANNOUNCE_MODES)}, got {mode!r}")
    _STATE.announce = mode


@contextmanager
def falling_back(ops: Sequence[str], announce: str = "once") -> Iterator[None]:
    """In-process tests: ``ops`` announce host fallbacks inside the block (each afresh, as in a new
    process), then the emulator is as it was."""
    previous_mode, previous_announced = _STATE.announce, set(_STATE.announced)
    set_announce(announce)
    _STATE.announced.clear()
    names = [_schema_name(resolve(op)) for op in ops]
    before = {name: _STATE.hooks[name].fallback for name in names if name in _STATE.hooks}
    try:
        for name in names:
            hook(name, fallback=True)
        yield
    finally:
        for name in names:
            hooks = _STATE.hooks.get(name)
            if hooks is None:
                continue
            if name in before:
                hooks.fallback = before[name]
            elif hooks.fault_scale is None and hooks.refuses is None:
                unhook(name)
            else:
                hooks.fallback = False
        _STATE.announce, _STATE.announced = previous_mode, previous_announced


def install_real_fallbacks() -> None:
    """The operators torch_npu 2.14.0 itself runs on the host: :data:`KERNEL_WORDS` always, _masked_softmax
    for arguments its kernel refuses, :data:`CHIP_WORDS` on the chips that lack them."""
    for op in KERNEL_WORDS:
        hook(op, fallback=True)
    hook("aten::_masked_softmax", refuses=masked_softmax_unmet)
    for op in CHIP_WORDS:
        hook(op, refuses=_on_the_host_of_this_chip(op), every_call=True)
    for op in AICPU_OPS:
        hook(op, refuses=_integer_sort, raw=True)


def install_from_env() -> None:
    """Apply VTOOLS_EMU_NPU_FALLBACK_OPS / VTOOLS_EMU_NPU_FALLBACK_ANNOUNCE (a bad value raises ValueError)."""
    set_announce(os.environ.get(ANNOUNCE_ENV, "once").strip() or "once")
    install_real_fallbacks()
    for op in parse_op_list(os.environ.get(FALLBACK_ENV)):
        try:
            hook(op, fallback=True)
        except ValueError as err:
            raise ValueError(f"{FALLBACK_ENV}: {err}") from None

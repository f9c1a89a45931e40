"""Operators the emulated npu runs "through a host fallback", announced as torch_npu announces them.

On a real Ascend host an operator with no NPU kernel goes to torch_npu's boxed
``npu_cpu_fallback``, which runs it on CPU copies and, the first time it sees
that operator in the process, prints (torch_npu, torch_npu/csrc/aten/common/
FallbackKernel / its ``has_op_name_warned`` set; quoted in Ascend's FAQ
"Unsupported Operators Called")::

    [W compiler_depend.ts:51] Warning: CAUTION: The operator 'aten::isin.Tensor_Tensor_out' is not
    currently supported on the NPU backend and will fall back to run on the CPU. This may have
    performance implications. (function npu_cpu_fallback)

(one line). It goes through ``TORCH_NPU_WARN``, i.e. ``c10::WarningHandler``'s
base ``process``: straight to the process's stderr, file descriptor 2, NOT
through Python's ``warnings`` module. The emulator does the same: the
announcement is written with ``os.write(2, ...)``, once per operator and
process (``VTOOLS_EMU_NPU_FALLBACK_ANNOUNCE=always``: at every call, the way a
backend that announces every call would).

Every operator of the emulator already runs on CPU copies; what a listed
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

FALLBACK_ENV = "VTOOLS_EMU_NPU_FALLBACK_OPS"
ANNOUNCE_ENV = "VTOOLS_EMU_NPU_FALLBACK_ANNOUNCE"
ANNOUNCE_MODES = ("once", "always")
# The wrappers stand in for C++ kernels, which have no Python frames: tools that show "where the run was"
# (vtools/observe/fallback.py) skip this module's frames, as pytest does.
__tracebackhide__ = True


def announcement(op: str) -> str:
    """torch_npu's words for ``op`` (without the logger's prefix)."""
    return (
        f"CAUTION: The operator '{op}' is not currently supported on the NPU backend and will fall back to "
        "run on the CPU. This may have performance implications."
    )


def _log_line(op: str) -> bytes:
    """The line c10's logger prints for TORCH_NPU_WARN: ``[W<MMDD> <time> <file>:<line>] Warning: ...``."""
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now))
    nanos = int((now % 1) * 1e9)
    prefix = f"[W{stamp}.{nanos:09d} compiler_depend.ts:51]"
    return f"{prefix} Warning: {announcement(op)} (function npu_cpu_fallback)\n".encode()


@dataclass
class _Hooks:
    """What the wrapper of one operator does around the kernel it replaced."""

    op: str
    original: Any
    library: Any
    fallback: bool = False
    fault_scale: float | None = None
    calls: int = 0


@dataclass
class _State:
    hooks: dict[str, _Hooks] = field(default_factory=dict)
    announced: set[str] = field(default_factory=set)  # torch_npu's has_op_name_warned
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


def _announce(op: str) -> None:
    with _STATE.lock:
        if _STATE.announce == "once":
            if op in _STATE.announced:
                return
            _STATE.announced.add(op)
    os.write(2, _log_line(op))


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
            _announce(hooks.op)
        result = hooks.original.call_boxed(keyset, *args, **kwargs)
        if hooks.fault_scale is not None:
            _perturb(result, hooks.fault_scale)
        return result

    return kernel


def hook(op: str, *, fallback: bool | None = None, fault_scale: float | None = None) -> None:
    """Wrap ``op``'s npu kernel (once) and set what the wrapper does: announce a host fallback, and/or
    scale floating-point results by ``1 + fault_scale``."""
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
        if not hooks.fallback:
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
    added = []
    try:
        for op in ops:
            name = _schema_name(resolve(op))
            if name not in _STATE.hooks:
                added.append(name)
            hook(name, fallback=True)
        yield
    finally:
        for name in list(ops):
            hooks = _STATE.hooks.get(_schema_name(resolve(name)))
            if hooks is not None:
                hooks.fallback = False
        for name in added:
            hooks = _STATE.hooks.get(name)
            if hooks is not None and hooks.fault_scale is None:
                unhook(name)
        _STATE.announce, _STATE.announced = previous_mode, previous_announced


def install_from_env() -> None:
    """Apply VTOOLS_EMU_NPU_FALLBACK_OPS / VTOOLS_EMU_NPU_FALLBACK_ANNOUNCE (a bad value raises ValueError)."""
    set_announce(os.environ.get(ANNOUNCE_ENV, "once").strip() or "once")
    for op in parse_op_list(os.environ.get(FALLBACK_ENV)):
        try:
            hook(op, fallback=True)
        except ValueError as err:
            raise ValueError(f"{FALLBACK_ENV}: {err}") from None

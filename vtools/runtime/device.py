"""One code path for every device: cpu, cuda, npu, xpu, mps and out-of-tree backends.

This module and the device table it operates on (vtools/runtime/device_kinds.py) are the only ones in
vtools that may name ``torch.cuda``, ``torch.npu`` or ``torch_npu``. Everything device-specific is data
in :data:`DEVICE_KINDS` (which package provides a device type, which collective backend it uses, which
environment variable hides devices, whether it is the host); everything else talks to the device through
``torch.get_device_module(type)``, the per-type module every backend registers, so adding a device
means adding a row, not a branch (tests/runtime/test_device.py reads this file for branches on a name).
"""

from __future__ import annotations

import importlib
import os
import random
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from types import ModuleType
from typing import Any

import torch

from vtools.errors import UsageError
from vtools.runtime.device_chips import ChipFamily, family_of
from vtools.runtime.device_kinds import DEVICE_KINDS, DeviceKind, kind_of  # callers reach the table as dev.kind_of

AUTO = "auto"  # --device auto: the available accelerator, else the host

_SPEC = re.compile(r"^(?P<type>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<index>.*))?$")


def parse_device_spec(spec: str, flag: str = "--device") -> tuple[str, int | None]:
    """Split ``'npu:1'`` into ``('npu', 1)``; malformed specs raise :class:`UsageError` naming ``flag``."""
    text = spec.strip()
    match = _SPEC.match(text)
    if not match:
        raise UsageError(f"malformed {flag} {spec!r}: expected TYPE or TYPE:INDEX, e.g. cpu, cuda:0, npu:1")
    dtype, index = match.group("type").lower(), match.group("index")
    if index is None:
        return dtype, None
    if not index.isdigit():
        raise UsageError(f"malformed {flag} {spec!r}: the index must be a non-negative integer")
    if (dtype == AUTO or kind_of(dtype).host) and int(index) != 0:
        raise UsageError(f"malformed {flag} {spec!r}: {dtype} takes no index")
    return dtype, int(index)


def import_device_modules(modules: Iterable[str]) -> None:
    """Import modules that register devices (timm's --device-modules), before resolving."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise UsageError(f"--device-modules: cannot import {name!r}: {err}") from err
        except Exception as err:  # the module itself failed while registering its device
            detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise UsageError(
                f"--device-modules: importing {name!r} failed ({type(err).__name__}: {detail}); "
                "that backend's package or its drivers are broken"
            ) from err


def _registered_types() -> list[str]:
    """Device types this torch can address right now (in-tree plus the PrivateUse1 name)."""
    names = [kind.type for kind in DEVICE_KINDS.values() if kind.package is None]  # torch's own
    names.append(torch._C._get_privateuse1_backend_name())
    return sorted({n for n in names if n != "privateuseone"})


def _is_registered(device_type: str) -> bool:
    try:
        torch.device(device_type)
    except RuntimeError:
        return False
    return kind_of(device_type).host or getattr(torch, device_type, None) is not None


def load_backend(device_type: str, flag: str = "--device") -> ModuleType | None:
    """Make sure the backend for ``device_type`` is loaded and return its torch module.

    torch >= 2.5 usually auto-loads out-of-tree backends; when it did not
    (autoload disabled, older torch) the known package is imported here.
    ``flag`` is the option that asked for the device, for the messages.
    """
    kind = kind_of(device_type)
    if kind.host:
        return None
    if not _is_registered(device_type) and kind.package:
        try:
            importlib.import_module(kind.package)
        except ModuleNotFoundError as err:
            if err.name and kind.package.startswith(err.name):
                raise UsageError(
                    f"{flag} {device_type} needs the package {kind.package}, which is not installed "
                    f"(torch {torch.__version__}): {kind.install_hint}{_emulator_hint(kind, flag)}"
                ) from err
            raise _broken_backend(kind, err) from err
        except Exception as err:  # a backend that fails to initialise raises anything
            raise _broken_backend(kind, err) from err
    if not _is_registered(device_type):
        known = ", ".join(_registered_types())
        raise UsageError(
            f"unknown device type {device_type!r}: this torch knows {known} "
            "(out-of-tree backends register theirs when imported; see --device-modules)"
        )
    return torch.get_device_module(device_type)


# a source checkout's tests/ folder, beside the vtools package, where the table's emulators live
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _emulator_hint(kind: DeviceKind, flag: str) -> str:
    """Where the row's emulator exists (a source checkout): how to try that device's code path without one."""
    if kind.emulator is None or not os.path.isfile(os.path.join(_CHECKOUT, *kind.emulator.split("."), "__main__.py")):
        return ""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0].endswith(".py") else ""
    script = script if script and script != "__main__.py" else "<script>"
    where = "" if os.path.abspath(os.getcwd()) == _CHECKOUT else f" from {_CHECKOUT}"
    return (
        f"; no {kind.type.upper()} at hand? the emulated {kind.type} runs the {kind.type} code path on this cpu"
        f"{where}: python3 -m {kind.emulator} {script} ... {flag} {kind.type}"
    )


def _broken_backend(kind: DeviceKind, err: BaseException) -> UsageError:
    detail = f"{type(err).__name__}: {err}".splitlines()[0]
    hint = f" {kind.load_hint.format(torch=torch.__version__)}" if kind.load_hint else ""
    return UsageError(f"{kind.package} is installed but failed to load ({detail}).{hint}")


def device_count(device_type: str) -> int:
    """Number of visible devices of a type (0 when the type is not available)."""
    if kind_of(device_type).host:
        return 1
    module = torch.get_device_module(device_type)
    if not module.is_available():
        return 0
    count = getattr(module, "device_count", None)
    return int(count()) if count is not None else 1


def _visibility(kind: DeviceKind) -> str:
    return f"; {kind.visible_env}={os.environ.get(kind.visible_env, 'unset')}" if kind.visible_env else ""


def auto_device_type() -> str:
    """The available accelerator, else cpu."""
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    return accelerator.type if accelerator is not None else "cpu"


def resolve_device(spec: str = "auto", device_modules: Iterable[str] = (), flag: str = "--device") -> torch.device:
    """Turn a ``--device`` spec into a ``torch.device`` that is loaded, available and current; ``flag``
    names the option that gave the spec in the messages (parity's --against).

    Without an explicit index, torchrun's LOCAL_RANK picks the device, so one
    process drives one device.
    """
    device_type, index = parse_device_spec(spec, flag)
    import_device_modules(device_modules)
    if device_type == AUTO:
        device_type = auto_device_type()
    kind = kind_of(device_type)
    if kind.host:
        return torch.device(device_type)
    load_backend(device_type, flag)
    count = device_count(device_type)
    if count == 0:
        raise UsageError(
            f"{flag} {device_type}: this torch supports {device_type} but no device is available{_visibility(kind)}"
            f"; {flag} auto runs on what this host has ({auto_device_type()})"  # a timm args.yaml says cuda
        )
    if index is None:
        index = int(os.environ.get("LOCAL_RANK", "0"))
    if index >= count:
        raise UsageError(f"{device_type}:{index} requested, {count} visible{_visibility(kind)}")
    device = torch.device(device_type, index)
    set_current_device(device)
    return device


def apply_tuning(device: torch.device) -> dict[str, Any]:
    """Turn on the device type's speed settings from :data:`DEVICE_KINDS`; returns what was set."""
    applied: dict[str, Any] = {}
    for path, value in kind_of(device.type).tuning:
        *parents, name = path.split(".")
        owner: Any = torch
        for part in parents:
            owner = getattr(owner, part)
        setattr(owner, name, value)
        applied[f"torch.{path}"] = value
    return applied


def device_module(device: torch.device) -> ModuleType | None:
    """``torch.cuda``, ``torch.npu``, ... for an accelerator; None for cpu."""
    if kind_of(device.type).host:
        return None
    return getattr(torch, device.type, None)


def _call(device: torch.device, name: str, *args: Any, default: Any = None) -> Any:
    """Call ``torch.<type>.<name>(*args)`` where the backend has it."""
    module = device_module(device)
    function = getattr(module, name, None) if module is not None else None
    return function(*args) if function is not None else default


def set_current_device(device: torch.device) -> None:
    """Make ``device`` the current one, so kernels and collectives default to it."""
    if device.index is not None:
        _call(device, "set_device", device)


def synchronize(device: torch.device) -> None:
    """Wait for queued work (timings, benchmarks); a no-op on cpu."""
    _call(device, "synchronize", device)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory measurement on an accelerator."""
    _call(device, "reset_peak_memory_stats", device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak bytes allocated on the device since the last reset; None where unknown (cpu)."""
    value = _call(device, "max_memory_allocated", device)
    return int(value) if value is not None else None


def is_bf16_supported(device: torch.device) -> bool:
    """Whether bfloat16 autocast runs natively on this device."""
    if kind_of(device.type).native_bf16:
        return True
    supported = _call(device, "is_bf16_supported", default=None)
    if supported is not None:
        return bool(supported)
    dtypes = _call(device, "get_amp_supported_dtype", default=[])
    return torch.bfloat16 in dtypes


def chip_family(device: torch.device) -> ChipFamily | None:
    """The device's chip family, by its name among its row's (device_chips.py); None where none claims it."""
    chips = kind_of(device.type).chips
    return family_of(device_name(device), chips) if chips else None


def fused_optimizer(device: torch.device, kernel: str) -> bool:
    """Whether torch's fused step ``kernel`` (``_fused_adamw_``) runs on the device: its chip's, else its row's."""
    family = chip_family(device)
    return kernel in family.fused_steps.value if family else kind_of(device.type).fused_optimizer


def pin_memory(device: torch.device) -> bool:
    """Whether loaders should pin host memory for this device."""
    return kind_of(device.type).pinned_host_memory


def non_blocking(device: torch.device) -> bool:
    """Whether host->device copies may be asynchronous (they come from pinned memory)."""
    return pin_memory(device)


def has_streams(device: torch.device) -> bool:
    """Whether the backend exposes streams for overlapping copies with compute."""
    module = device_module(device)
    return module is not None and hasattr(module, "Stream") and hasattr(module, "current_stream")


def new_stream(device: torch.device) -> Any | None:
    """A side stream on the device, or None where the backend has none."""
    return device_module(device).Stream(device) if has_streams(device) else None


@contextmanager
def on_stream(device: torch.device, stream: Any | None) -> Iterator[None]:
    """Run the block on ``stream`` (a no-op context where there are no streams)."""
    with device_module(device).stream(stream) if stream is not None else nullcontext():
        yield


def wait_stream(device: torch.device, stream: Any | None, tensors: Iterable[torch.Tensor] = ()) -> None:
    """Make the current stream wait for ``stream``, and keep ``tensors`` alive for the current stream.

    Tensors made on a side stream and used on another must be recorded there, or
    the caching allocator could hand their memory out again too early.
    """
    if stream is None:
        return
    current = device_module(device).current_stream(device)
    current.wait_stream(stream)
    for tensor in tensors:
        tensor.record_stream(current)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (which also seeds every registered accelerator)."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every random generator's state, for exact resumption."""
    import numpy as np

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    device_state = _call(device, "get_rng_state_all")
    if device_state is not None:
        state["device"] = list(device_state)
    return state


def set_rng_state(device: torch.device, state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "device" in state:
        _call(device, "set_rng_state_all", state["device"])


def dist_backend(device: torch.device, override: str | None = None) -> str:
    """The torch.distributed backend for a device type, checked for availability."""
    import torch.distributed as dist

    name = override or kind_of(device.type).dist_backend
    if name is None:
        name = dist.Backend.default_device_backend_map.get(device.type, "gloo")
    check = getattr(dist, f"is_{name}_available", None)  # gloo, nccl, mpi, xccl, ucc
    available = check() if check is not None else name in dist.Backend.backend_list
    if not available:
        raise UsageError(
            f"distributed backend {name!r} for {device.type} is not available in this torch build; "
            "choose another with --dist-backend"
        )
    return name


def device_name(device: torch.device) -> str:
    """The backend's name for an accelerator (its chip); the type's name where the backend gives none."""
    return str(_call(device, "get_device_name", device, default=device.type))

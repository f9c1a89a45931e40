"""One code path for every device: cpu, cuda, npu, xpu, mps and out-of-tree backends.

This is the only module in vtools that may name ``torch.cuda``, ``torch.npu``
or ``torch_npu``. Everything device-specific is data in :data:`DEVICE_KINDS`
(which package provides a device type, which collective backend it uses,
which environment variable hides devices); everything else talks to the
device through ``torch.get_device_module(type)``, the per-type module every
backend registers, so adding a device means adding a row, not a branch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import random
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from vtools.errors import UsageError


@dataclass(frozen=True)
class DeviceKind:
    """What vtools needs to know about one device type, as data."""

    type: str
    package: str | None = None  # module that provides the backend, imported on demand
    dist_backend: str | None = None  # torch.distributed backend; None -> torch's default map
    visible_env: str | None = None  # env var that selects visible devices
    pinned_host_memory: bool = False  # host->device copies benefit from pinned memory
    channels_last: bool = False  # convolutions run faster in NHWC on this device
    install_hint: str = ""
    # speed settings applied when this device type is selected: (attribute path under torch, value)
    tuning: tuple[tuple[str, Any], ...] = ()
    # torch.profiler activity that records this device's own work (None: host activity only);
    # out-of-tree backends record theirs as PrivateUse1
    profiler_activity: str | None = "PrivateUse1"
    # the backend's own profiler module (torch.profiler's API, its own trace format), used when importable
    profiler_module: str | None = None
    # the model runs on the host's cores (so it, not decoding, gets most of them: vtools/runtime/cpu_budget.py)
    computes_on_host: bool = False
    # environment variable through which the backend binds its own threads to cores (then vtools does not)
    affinity_env: str | None = None
    # torch has fused (one-kernel) SGD/Adam/AdamW steps for this device type
    fused_optimizer: bool = False
    # preflight (vtools/runtime/preflight.py): visible_env lists integer device ids (not UUIDs)
    numeric_visible_ids: bool = False
    # the backend package is released per torch version (X.Y.Z pairs with torch X.Y.Z)
    pairs_torch_version: bool = False
    # "module.function" returning the vendor toolkit's version (CANN), where the package has one
    toolkit_version: str | None = None
    # performance variables: (name, recommended value, what it does), reported when they differ
    recommended_env: tuple[tuple[str, str, str], ...] = ()
    # the device node a process opens to use device N ("/dev/davinci{}"): who else holds ours is a leftover job
    device_file: str | None = None
    # runtime settings for changing input shapes, applied with --device-settings: (function, keyword, value)
    # under torch.<type>
    runtime_settings: tuple[tuple[str, str, Any], ...] = ()
    # regular expression for the line the backend prints when it runs an operator on the host instead
    # (group "op" names it); None: the backend has no such fallback (vtools/observe/fallback.py)
    host_fallback: str | None = None


def _fallback_words(backend: str) -> str:
    """The words of PyTorch's boxed CPU fallbacks: torch_npu's npu_cpu_fallback ("CAUTION: The operator
    'aten::x' is not currently supported on the NPU backend and will fall back to run on the CPU. ..."),
    MPS's and XPU's (the same sentence without "CAUTION: ")."""
    return rf"The operator '(?P<op>[^']+)' is not currently supported on the {backend} backend and will fall back"


DEVICE_KINDS: dict[str, DeviceKind] = {
    kind.type: kind
    for kind in (
        DeviceKind(
            "cpu",
            dist_backend="gloo",
            channels_last=True,
            profiler_activity=None,
            computes_on_host=True,
            fused_optimizer=True,
        ),
        DeviceKind(
            "cuda",
            dist_backend="nccl",
            visible_env="CUDA_VISIBLE_DEVICES",
            pinned_host_memory=True,
            channels_last=True,
            install_hint="install a CUDA (or ROCm) build of torch",
            device_file="/dev/nvidia{}",
            profiler_activity="CUDA",
            fused_optimizer=True,
            # what timm's train.py turns on for CUDA: TF32 matmuls and cuDNN autotuning
            tuning=(("backends.cuda.matmul.allow_tf32", True), ("backends.cudnn.benchmark", True)),
        ),
        DeviceKind(
            "npu",
            package="torch_npu",
            dist_backend="hccl",
            visible_env="ASCEND_RT_VISIBLE_DEVICES",
            pinned_host_memory=True,
            profiler_module="torch_npu.profiler",
            # CPU_AFFINITY_CONF=1 (per-device core ranges) or 2 (hot threads on their own cores)
            affinity_env="CPU_AFFINITY_CONF",
            host_fallback=_fallback_words("NPU"),
            install_hint="install Ascend CANN and the torch_npu release built for this torch "
            "(torch_npu X.Y.Z requires torch X.Y.Z)",
            numeric_visible_ids=True,
            pairs_torch_version=True,
            device_file="/dev/davinci{}",
            toolkit_version="torch_npu.utils.get_cann_version",
            recommended_env=(
                ("TASK_QUEUE_ENABLE", "2", "operator launches queue in two stages, for host-bound models"),
                ("CPU_AFFINITY_CONF", "2", "the backend's hot threads get their own cores"),
                ("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True", "less fragmentation when sizes change"),
                ("HCCL_CONNECT_TIMEOUT", "1200", "seconds ranks wait for each other at start (default 120)"),
            ),
            # operators compiled per shape (jit_compile) recompile for minutes whenever a shape changes
            runtime_settings=(("set_compile_mode", "jit_compile", False),),
        ),
        DeviceKind(
            "xpu",
            dist_backend="xccl",
            visible_env="ZE_AFFINITY_MASK",
            pinned_host_memory=True,
            channels_last=True,
            install_hint="install an XPU build of torch",
            profiler_activity="XPU",
            host_fallback=_fallback_words("XPU"),
        ),
        DeviceKind(
            "mps",
            dist_backend="gloo",
            install_hint="use a macOS arm64 build of torch",
            profiler_activity=None,
            host_fallback=_fallback_words("MPS"),
        ),
        DeviceKind(
            "mlu",
            package="torch_mlu",
            dist_backend="cncl",
            visible_env="MLU_VISIBLE_DEVICES",
            pinned_host_memory=True,
            install_hint="install Cambricon's torch_mlu for this torch",
        ),
        DeviceKind(
            "hpu",
            package="habana_frameworks.torch",
            dist_backend="hccl",
            visible_env="HABANA_VISIBLE_MODULES",
            pinned_host_memory=True,
            install_hint="install Intel Gaudi's habana_frameworks for this torch",
            profiler_activity="HPU",
        ),
    )
}

_SPEC = re.compile(r"^(?P<type>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<index>.*))?$")


def kind_of(device_type: str) -> DeviceKind:
    """The table row for a device type; unknown (out-of-tree) types get a neutral row."""
    return DEVICE_KINDS.get(device_type, DeviceKind(device_type, pinned_host_memory=True))


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
    if dtype in ("auto", "cpu") and int(index) != 0:
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
    names = ["cpu", "cuda", "xpu", "mps", torch._C._get_privateuse1_backend_name()]
    return sorted({n for n in names if n != "privateuseone"})


def _is_registered(device_type: str) -> bool:
    try:
        torch.device(device_type)
    except RuntimeError:
        return False
    return device_type == "cpu" or getattr(torch, device_type, None) is not None


def load_backend(device_type: str, flag: str = "--device") -> ModuleType | None:
    """Make sure the backend for ``device_type`` is loaded and return its torch module.

    torch >= 2.5 usually auto-loads out-of-tree backends; when it did not
    (autoload disabled, older torch) the known package is imported here.
    ``flag`` is the option that asked for the device, for the messages.
    """
    if device_type == "cpu":
        return None
    kind = kind_of(device_type)
    if not _is_registered(device_type) and kind.package:
        try:
            importlib.import_module(kind.package)
        except ModuleNotFoundError as err:
            if err.name and kind.package.startswith(err.name):
                raise UsageError(
                    f"{flag} {device_type} needs the package {kind.package}, which is not installed "
                    f"(torch {torch.__version__}): {kind.install_hint}{_emulator_hint(device_type, flag)}"
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


# the emulated npu of the test suite: only in a source checkout, beside the vtools package
_EMULATOR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests")


def _emulator_hint(device_type: str, flag: str) -> str:
    """Where the emulated npu exists (a source checkout): how to try the npu code path without an NPU."""
    if device_type != "npu" or not os.path.isfile(os.path.join(_EMULATOR, "emulated_npu", "__main__.py")):
        return ""
    root = os.path.dirname(_EMULATOR)
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0].endswith(".py") else ""
    script = script if script and script != "__main__.py" else "<script>"
    where = "" if os.path.abspath(os.getcwd()) == root else f" from {root}"
    return (
        f"; no NPU at hand? the emulated npu runs the npu code path on this cpu{where}: "
        f"python3 -m tests.emulated_npu {script} ... {flag} npu"
    )


def _broken_backend(kind: DeviceKind, err: BaseException) -> UsageError:
    detail = f"{type(err).__name__}: {err}".splitlines()[0]
    hint = ""
    if kind.type == "npu":
        hint = (
            " Load CANN first (`source /usr/local/Ascend/ascend-toolkit/set_env.sh`) and check that "
            f"torch_npu matches torch {torch.__version__}."
        )
    return UsageError(f"{kind.package} is installed but failed to load ({detail}).{hint}")


def device_count(device_type: str) -> int:
    """Number of visible devices of a type (0 when the type is not available)."""
    if device_type == "cpu":
        return 1
    module = torch.get_device_module(device_type)
    if not module.is_available():
        return 0
    count = getattr(module, "device_count", None)
    return int(count()) if count is not None else 1


def _visibility(kind: DeviceKind) -> str:
    if not kind.visible_env:
        return ""
    return f"; {kind.visible_env}={os.environ.get(kind.visible_env, 'unset')}"


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
    if device_type == "auto":
        device_type = auto_device_type()
    if device_type == "cpu":
        return torch.device("cpu")
    load_backend(device_type, flag)
    kind = kind_of(device_type)
    count = device_count(device_type)
    if count == 0:
        raise UsageError(
            f"{flag} {device_type}: this torch supports {device_type} but no device is available{_visibility(kind)}"
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
    if device.type == "cpu":
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
    if device.type == "cpu":
        return True
    if device.type == "mps":
        return True  # macOS 14+ builds of torch support bf16 on MPS
    supported = _call(device, "is_bf16_supported", default=None)
    if supported is not None:
        return bool(supported)
    dtypes = _call(device, "get_amp_supported_dtype", default=[])
    return torch.bfloat16 in dtypes


def fused_optimizer(device: torch.device) -> bool:
    """Whether torch's fused optimizer steps run on this device (one pass over the weights, not one per
    tensor and operation)."""
    return kind_of(device.type).fused_optimizer


def pin_memory(device: torch.device) -> bool:
    """Whether loaders should pin host memory for this device."""
    return device.type != "cpu" and kind_of(device.type).pinned_host_memory


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
    if stream is None:
        with nullcontext():
            yield
        return
    with device_module(device).stream(stream):
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


def describe(device: torch.device) -> dict[str, Any]:
    """Name and memory of one device, for the environment report."""
    info: dict[str, Any] = {"device": str(device)}
    if device.type == "cpu":
        info["name"] = _cpu_name()
        return info
    info["name"] = _call(device, "get_device_name", device, default=device.type)
    props = _call(device, "get_device_properties", device)
    total = getattr(props, "total_memory", None)
    if total is not None:
        info["memory_gib"] = round(total / 2**30, 1)
    info["bf16"] = is_bf16_supported(device)
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"


def backend_versions() -> dict[str, str]:
    """Versions of device backends that are loaded (torch_npu, CANN, CUDA, ...)."""
    versions: dict[str, str] = {}
    if torch.version.cuda:
        versions["torch_built_for_cuda"] = torch.version.cuda
    if getattr(torch.version, "hip", None):
        versions["torch_built_for_hip"] = torch.version.hip
    for kind in DEVICE_KINDS.values():
        if kind.package:
            status = _package_status(kind.package)
            if status is not None:
                versions[kind.package] = status
    cann = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    if cann:
        versions["cann"] = cann
    return versions


def _package_status(package: str) -> str | None:
    """A backend package's installed version and whether it loads (None: not installed). A package
    that fails to import is what a bug report needs most, so the import error is part of the answer."""
    distribution = package.split(".")[0].replace("_", "-")
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        module = sys.modules.get(package)
        return None if module is None else f"{getattr(module, '__version__', 'unknown')} (loaded)"
    if package in sys.modules:
        return f"{version} (loaded)"
    try:
        importlib.import_module(package)
    except Exception as err:  # a broken backend raises anything; report it, do not fail
        detail = f"{type(err).__name__}: {err}".splitlines()[0]
        return f"{version} (installed, fails to import: {detail})"
    return f"{version} (loaded)"


def backend_profiler(device: torch.device) -> tuple[ModuleType, list[Any]] | None:
    """The device's own profiler module (torch_npu.profiler on Ascend) and its activities, when the table
    names one and it imports; None means torch.profiler."""
    name = kind_of(device.type).profiler_module
    if name is None:
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    activity = module.ProfilerActivity
    return module, [activity.CPU, getattr(activity, device.type.upper())]


def profiler_activities(device: torch.device) -> list[Any]:
    """torch.profiler activities for ``device``: the host's, plus the device's own from the table when this
    torch build can record them."""
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    name = kind_of(device.type).profiler_activity
    activity = getattr(ProfilerActivity, name, None) if name else None
    if activity is not None and activity in torch.profiler.supported_activities():
        activities.append(activity)
    return activities

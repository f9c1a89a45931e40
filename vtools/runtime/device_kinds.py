"""The device table: what vtools needs to know about each device type, as data.

One row per device type (:data:`DEVICE_KINDS`): which package provides it, which collective backend and
visible-devices variable it uses, its speed settings, profiler, host-fallback wording, and the hints its
error messages give. vtools/runtime/device.py operates on devices through these rows and
``torch.get_device_module``, so adding a device means adding a row here, not a branch anywhere.
Like device.py, this module may name ``torch_npu`` (tests/rules/test_source_tree.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vtools.runtime.device_chips import CHIP_FAMILIES, ChipFamily


@dataclass(frozen=True)
class FloatStatus:
    """How a backend whose chips may saturate says so, and how its float-status flag is read.

    A chip without an Inf/NaN mode clamps an overflowing result to the dtype's largest value (NaN to 0), so no
    inf is left for ``isfinite`` to find; the chip's float-status flag records the overflow instead and stays
    raised until cleared. Functions are dotted names under ``torch.<type>``, operators under ``torch.ops``,
    spelt as the backend spells them (vtools/runtime/overflow.py uses them).
    """

    inf_nan_mode: str  # function: False where the chip saturates instead of producing inf and NaN
    forced_check: str  # function: True where the backend keeps the flag in Inf/NaN mode too, on request
    read_op: str  # operator (a status tensor in, one out): element 0 is nonzero while the flag is raised
    clear_op: str  # operator: lowers the flag
    status_size: int = 8  # the status tensor's length
    # the variables that change the mode (reported by `vtools env`)
    environment: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlowPath:
    """A sentence in which a backend says it runs something slowly on the device or changes its precision,
    short of running it on the host (vtools/observe/fallback.py counts these beside the host fallbacks)."""

    kind: str  # what the audit calls it: "aicpu", "float64 cast"
    pattern: str  # a regular expression; group "ops" names the kernel, else ``name`` does
    name: str = ""


@dataclass(frozen=True)
class EnvAdvice:
    """A performance variable and the value vtools recommends, reported while it differs (never set)."""

    name: str
    value: str
    why: str
    # another variable the backend reads for the same thing, of which only one may be set (the advice then
    # goes to whichever is): PYTORCH_ALLOC_CONF beside PYTORCH_NPU_ALLOC_CONF
    shared_with: str | None = None
    item: bool = False  # the value is one item of a comma-separated list (allocator options)


@dataclass(frozen=True)
class LaunchQueue:
    """How a backend queues operator launches: its variable is not the effective level (the backend turns the
    queue off in an interactive interpreter and under its blocking variable), so the level is asked of it."""

    env: str  # the variable that sets the level (0 off, 1 the default, 2 for pure inference)
    effective: str  # the function under torch.<type> that says the level in effect
    blocking_env: str  # every launch waits for the device when this is 1 (for debugging)


@dataclass(frozen=True)
class RuntimeSetting:
    """A backend setting ``--device-kwargs NAME=VALUE`` sets; a bare ``--device-settings`` applies those with a
    recommended value, except where the chip's own default already is that value."""

    name: str
    # what it sets under torch.<type>: ``set_compile_mode(jit_compile)`` calls with that keyword,
    # ``matmul.allow_hf32`` assigns the attribute
    targets: tuple[str, ...]
    why: str
    recommended: bool | None = None  # applied by --device-settings (None: only when named)
    chip_default: str | None = None  # the chip table's cell holding the backend's default (device_chips.py)


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
    # visible_env lists integer device ids (not UUIDs), read as the backend reads them: up to the first character
    # that is neither a digit nor a comma, and up to the first empty entry (vtools/runtime/device.py visible_ids)
    numeric_visible_ids: bool = False
    # the backend package is released per torch version (X.Y.Z pairs with torch X.Y.Z)
    pairs_torch_version: bool = False
    # "module.function" returning the vendor toolkit's version (CANN), where the package has one
    toolkit_version: str | None = None
    # performance variables and their recommended values, reported while they differ
    recommended_env: tuple[EnvAdvice, ...] = ()
    # the backend's launch queue, where it has one (reported when it is off)
    launch_queue: LaunchQueue | None = None
    # the device node a process opens to use device N ("/dev/davinci{}"): who else holds ours is a leftover job
    device_file: str | None = None
    # the backend's runtime settings, by name (--device-kwargs), the recommended ones applied by --device-settings
    runtime_settings: tuple[RuntimeSetting, ...] = ()
    # regular expressions for the lines the backend prints when it runs an operator on the host instead
    # (group "ops" names it, or several overloads at once); empty: the backend has no such fallback
    # (vtools/observe/fallback.py)
    host_fallback: tuple[str, ...] = ()
    # sentences in which the backend runs work slowly or at another precision on the device (not on the host)
    slow_paths: tuple[SlowPath, ...] = ()
    # the type is the host itself (cpu): nothing to load, one device without an index, no torch.<type> module
    host: bool = False
    # bfloat16 autocast runs natively on every device of this type, without asking the backend
    native_bf16: bool = False
    # a source checkout's emulator of this type (a module under tests/), suggested when the package is missing
    emulator: str | None = None
    # what to check when the package is installed but fails to load ("{torch}": torch's version)
    load_hint: str = ""
    # torch.version attributes that name the toolkit this torch was built for, reported as torch_built_for_<name>
    torch_build: tuple[str, ...] = ()
    # the vendor toolkit's name in the environment report, and the variables that point at its installation
    toolkit: str = ""
    toolkit_home_env: tuple[str, ...] = ()
    # the collective library's own timeout variables (seconds), set from --dist-timeout unless the user set them
    collective_timeout_env: tuple[str, ...] = ()
    # chips of this type that may saturate on overflow, and their float-status flag (None: IEEE everywhere)
    float_status: FloatStatus | None = None
    # the collective library's variables that pin the interface its connections leave from: a name (prefix list)
    # and an address; the preflight of a multi-node run says which it would use and whether it reaches the root
    socket_interface_env: str | None = None
    socket_address_env: str | None = None
    # Dynamo backends the package registers for this device (torch_dynamo_backends entry points), checked when
    # --torchcompile names one (vtools/runtime/compiler.py)
    compile_backends: tuple[str, ...] = ()
    # the vendor's status tool (driver, firmware, health, each card's processes): `vtools env` runs it when on PATH
    status_command: tuple[str, ...] = ()
    # the chip families of this type whose behaviour differs (device_chips.py), found by the device's name
    chips: tuple[ChipFamily, ...] = ()

    def environment_variables(self) -> tuple[str, ...]:
        """Every environment variable this row names, for the environment report."""
        names = (
            self.visible_env,
            *self.toolkit_home_env,
            self.affinity_env,
            *(advice.name for advice in self.recommended_env),
            *(advice.shared_with for advice in self.recommended_env if advice.shared_with),
            *(name for name in (self.socket_interface_env, self.socket_address_env) if name),
            *((self.launch_queue.env, self.launch_queue.blocking_env) if self.launch_queue else ()),
            *self.collective_timeout_env,
            *(self.float_status.environment if self.float_status else ()),
        )
        return tuple(dict.fromkeys(name for name in names if name))


# an operator as backends name it: ``aten::relu_``, ``aten::add.Tensor``, ``aten::logit.out``
OPERATOR = r"[A-Za-z_]\w*::[\w.]+"


def _boxed_fallback_words(backend: str) -> str:
    """The sentence of PyTorch's boxed CPU fallbacks: MPS's and XPU's ("The operator 'aten::x' is not currently
    supported on the MPS backend and will fall back to run on the CPU. ..."), torch_npu's npu_cpu_fallback
    (the same after "CAUTION: ")."""
    return rf"The operator '(?P<ops>[^']+)' is not currently supported on the {backend} backend and will fall back"


# torch_npu's own announcements, read from the strings of torch_npu 2.14.0's libtorch_npu.so (the real wheel is
# checked in tests/runtime/test_device_kinds_wheel.py): besides the boxed fallback's sentence, kernels that have no
# NPU implementation, or none for the arguments given, say "CAUTION: The operator aten::x [, aten::y and
# aten::z] is currently not supported on the NPU backend[.| ]Now this operator will fallback to run on the CPU
# ..." or "... need to be met the following conditions to run on the NPU backend: ... Now this operator will
# fallback to run on the CPU ...", unquoted and naming one or several overloads; the sparse reductions say "CPU
# fallback is allowed because TORCH_NPU_FALLBACK_CPU_DISABLE=0. Since the NPU interface does not support
# operator 'aten::x', the operator will fall back to CPU."
_NPU_FALLBACK = (
    _boxed_fallback_words("NPU"),
    rf"CAUTION: The operator (?P<ops>{OPERATOR}(?:(?:, | and ){OPERATOR})*) "
    r"(?:is currently not supported|need to be met the following conditions to run) on the NPU backend\b.*? "
    r"will fallback to run on the CPU",
    r"the NPU interface does not support operator '(?P<ops>[^']+)', the operator will fall back to CPU",
)


def fallback_operators(named: str) -> list[str]:
    """The operators a fallback line's ``ops`` group names: ``aten::logit, aten::logit_ and aten::logit.out``
    is three; a quoted name is taken whole."""
    return re.findall(OPERATOR, named) or [named]


DEVICE_KINDS: dict[str, DeviceKind] = {
    kind.type: kind
    for kind in (
        DeviceKind(
            "cpu",
            host=True,
            native_bf16=True,
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
            status_command=("nvidia-smi",),
            socket_interface_env="NCCL_SOCKET_IFNAME",
            profiler_activity="CUDA",
            fused_optimizer=True,
            torch_build=("cuda", "hip"),
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
            host_fallback=_NPU_FALLBACK,
            # torch_npu 2.14.0's library: integer sorts run on the AI CPU, not the AI Core; float64 is cast to
            # float32 where the device has no float64 kernel (tests/runtime/test_device_kinds_wheel.py reads them)
            slow_paths=(
                SlowPath(
                    "aicpu",
                    r"kernel \[(?P<ops>\w+)\] can not support dtype .*? on AiCore, Now this kernel is running on AiCpu",
                ),
                SlowPath(
                    "float64 cast",
                    r"Device do not support double dtype(?: of rtol and atol)? now, "
                    r"dtype cast rep(?:lace|alce) with float",
                    name="float64 as float32",
                ),
            ),
            install_hint="install Ascend CANN and the torch_npu release built for this torch "
            "(torch_npu X.Y.Z requires torch X.Y.Z)",
            emulator="tests.emulated_npu",
            load_hint="Load CANN first (`source /usr/local/Ascend/ascend-toolkit/set_env.sh`) and check that "
            "torch_npu matches torch {torch}.",
            toolkit="cann",
            toolkit_home_env=("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"),
            numeric_visible_ids=True,
            pairs_torch_version=True,
            device_file="/dev/davinci{}",
            status_command=("npu-smi", "info"),
            socket_interface_env="HCCL_SOCKET_IFNAME",
            socket_address_env="HCCL_IF_IP",
            compile_backends=("npu", "npugraph_ex", "npugraphs"),
            toolkit_version="torch_npu.utils.get_cann_version",
            # HCCL's wait for the other devices inside a collective (default 1836 s; Atlas training series round
            # it down to a multiple of 68 s). HCCL_CONNECT_TIMEOUT is the start-up link wait, not a hang's.
            collective_timeout_env=("HCCL_EXEC_TIMEOUT",),
            recommended_env=(
                EnvAdvice("CPU_AFFINITY_CONF", "2", "the backend's hot threads get their own cores"),
                EnvAdvice(
                    "PYTORCH_NPU_ALLOC_CONF",
                    "expandable_segments:True",
                    "less fragmentation when sizes change",
                    shared_with="PYTORCH_ALLOC_CONF",
                    item=True,
                ),
                # HCCL's own advice is 300 s or more; a large job's ranks can take minutes to start
                EnvAdvice("HCCL_CONNECT_TIMEOUT", "1200", "seconds ranks wait for each other at start (default 120)"),
            ),
            # level 1, the default, splits launches in two stages; 2 is for pure inference (torch_npu's
            # set_task_queue_enable); torch_npu forces 0 in an interactive interpreter
            launch_queue=LaunchQueue("TASK_QUEUE_ENABLE", "get_task_queue_enable", "ASCEND_LAUNCH_BLOCKING"),
            runtime_settings=(
                RuntimeSetting(
                    "jit_compile",
                    ("set_compile_mode(jit_compile)",),
                    "operators compiled for each input shape recompile for minutes whenever a shape changes",
                    recommended=False,
                    chip_default="jit_compile",
                ),
                RuntimeSetting(
                    "allow_hf32",
                    ("matmul.allow_hf32", "conv.allow_hf32"),
                    "float32 matmuls and convolutions at HF32 (a 10-bit mantissa, as TF32 on cuda); torch_npu's "
                    "defaults: matmuls off, convolutions on",
                ),
                RuntimeSetting(
                    "allow_internal_format",
                    ("config.allow_internal_format",),
                    "the chip's own tensor layouts (5HD, NZ) instead of ND",
                    chip_default="internal_format",
                ),
            ),
            # Atlas training chips (910A) saturate; torch_npu's npu/utils.py asks and its GradScaler reads the
            # flag through these (is_force_overflow_check: FORCE_OVERFLOW_CHECK=1 on CANN 9.1.0 or later)
            chips=CHIP_FAMILIES,
            float_status=FloatStatus(
                inf_nan_mode="utils.is_support_inf_nan",
                forced_check="utils.is_force_overflow_check",
                read_op="npu.npu_get_float_status",
                clear_op="npu.npu_clear_float_status",
                environment=("INF_NAN_MODE_ENABLE", "INF_NAN_MODE_FORCE_DISABLE", "FORCE_OVERFLOW_CHECK"),
            ),
        ),
        DeviceKind(
            "xpu",
            dist_backend="xccl",
            visible_env="ZE_AFFINITY_MASK",
            pinned_host_memory=True,
            channels_last=True,
            install_hint="install an XPU build of torch",
            profiler_activity="XPU",
            host_fallback=(_boxed_fallback_words("XPU"),),
        ),
        DeviceKind(
            "mps",
            native_bf16=True,  # macOS 14+ builds of torch support bf16 on MPS
            dist_backend="gloo",
            install_hint="use a macOS arm64 build of torch",
            profiler_activity=None,
            host_fallback=(_boxed_fallback_words("MPS"),),
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


def kind_of(device_type: str) -> DeviceKind:
    """The table row for a device type; unknown (out-of-tree) types get a neutral row."""
    return DEVICE_KINDS.get(device_type, DeviceKind(device_type, pinned_host_memory=True))

"""Preflight: the set-up problems that break accelerator jobs, found before any model is built.

Every finding is one line with its fix. Errors stop a script with exit code 2
(a mismatched backend package, a visible-devices variable that hides the
devices it names, ``--device auto`` about to fall back to the cpu because a
backend failed, a rendezvous port already taken); warnings and notes are
printed and the run goes on. What is checked for a device type is data in
:data:`vtools.runtime.device.DEVICE_KINDS` (which package pairs with torch's
version, which variable selects devices, which settings are recommended), so
there is no per-device branch here. ``python -m vtools env --check`` prints
every finding for a device.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import socket
import sys
from dataclasses import dataclass
from typing import Any

import torch

from vtools.errors import UsageError
from vtools.runtime import device as dev
from vtools.runtime import host_network
from vtools.runtime.device_cards import device_label, physical_card, visible_ids
from vtools.runtime.device_kinds import EnvAdvice
from vtools.runtime.overflow import overflow_mode


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" (the script stops, exit 2), "warning" or "note"
    text: str  # what is wrong (or worth knowing), with the fix

    def line(self) -> str:
        return f"preflight {self.severity}: {self.text}"


def before_device(spec: str) -> list[Finding]:
    """What can be checked before the device is resolved: the visible-devices variable, the rendezvous port of
    a launch without torchrun, and the interface a multi-node run's collectives would leave from."""
    device_type = spec.split(":")[0].strip().lower()
    every_kind = device_type == dev.AUTO or dev.kind_of(device_type).host
    kinds = list(dev.DEVICE_KINDS.values()) if every_kind else [dev.kind_of(device_type)]
    findings = [finding for kind in kinds for finding in visible_devices(kind)]
    interfaces = [] if every_kind else collective_interface(kinds[0])
    return findings + rendezvous_port() + interfaces


def collective_interface(kind: dev.DeviceKind) -> list[Finding]:
    """Under a multi-node launch: the interface the collective library's connections would leave from (pinned
    by its variables, else the route to MASTER_ADDR, which the library's own rule may not follow) and whether it
    reaches MASTER_ADDR. A pinned one that cannot is an error (the job would hang at connection set-up); an
    unpinned one is a note with the variable to pin it."""
    nodes_apart = int(os.environ.get("WORLD_SIZE", "1")) > int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if not (kind.socket_interface_env and nodes_apart and "MASTER_ADDR" in os.environ):
        return []
    master, port = os.environ["MASTER_ADDR"], int(os.environ.get("MASTER_PORT", "29500"))
    available = host_network.interfaces()
    pinned = _pinned_interface(kind, available)
    if isinstance(pinned, Finding):
        return [pinned]
    if pinned is None:
        source = host_network.route_source(master, port)
        name = next((name for name, address in available.items() if address == source), "?")
        how = f"the route to MASTER_ADDR ({kind.socket_interface_env} unset: the library's own rule may differ)"
    else:
        name, source = pinned
        how = "pinned"
    if source is None:
        return [Finding("warning", f"no route from this host to MASTER_ADDR {master}")]
    problem = host_network.unreachable(source, master, port)
    if problem is None:
        return [Finding("note", f"collectives leave from {name} ({source}, {how}), which reaches MASTER_ADDR {master}")]
    return [
        Finding(
            "error" if pinned else "warning",
            f"collectives would leave from {name} ({source}, {how}), which cannot reach MASTER_ADDR {master}:{port} "
            f"({problem}): set {kind.socket_interface_env} to the interface that reaches it (the rank would wait "
            "at connection set-up for its whole connect timeout)",
        )
    ]


def _pinned_interface(kind: dev.DeviceKind, available: dict[str, str]) -> tuple[str, str] | Finding | None:
    """(name, address) the library's variables pin, a finding where they name nothing on this host, None when
    they are unset."""
    address_env, name_env = kind.socket_address_env, kind.socket_interface_env
    if address_env and os.environ.get(address_env):
        address = os.environ[address_env]
        name = next((name for name, own in available.items() if own == address), None)
        if name is None:
            return Finding("error", f"{address_env}={address} is not an address of this host ({_listed(available)})")
        return name, address
    if name_env and os.environ.get(name_env):
        name = host_network.named_interface(os.environ[name_env], available)
        if name is None:
            return Finding(
                "error", f"{name_env}={os.environ[name_env]} names no interface of this host ({_listed(available)})"
            )
        return name, available[name]
    return None


def _listed(available: dict[str, str]) -> str:
    return "it has: " + (", ".join(f"{name} {address}" for name, address in sorted(available.items())) or "none")


def after_device(device: torch.device, spec: str) -> list[Finding]:
    """What needs the resolved device: a cpu that ``auto`` fell back to, the backend's version pairing
    with torch, the chip and its precision, the backend's recommended settings."""
    if dev.kind_of(device.type).host:
        return auto_fell_back(spec)
    kind = dev.kind_of(device.type)
    held = leftover_processes(kind, device.index or 0)
    return [*backend_version(kind), *chip(device), *held, *settings(kind, device)]


def visible_devices(kind: dev.DeviceKind) -> list[Finding]:
    """Duplicate, out-of-order or non-numeric entries in a visible-devices variable, and fewer devices
    than the processes torchrun starts on this host: each would leave ranks without a device."""
    if not kind.visible_env or not kind.numeric_visible_ids or kind.visible_env not in os.environ:
        return []
    raw = os.environ[kind.visible_env]
    entries = [entry.strip() for entry in raw.split(",") if entry.strip()]
    name = f"{kind.visible_env}={raw}"
    if any(not entry.isdigit() for entry in entries):
        return [Finding("error", f"{name}: device ids must be integers, e.g. {kind.visible_env}=0,1,2,3")]
    ids = visible_ids(raw)
    if len(ids) < len(entries):
        read = ",".join(map(str, ids)) or "none"
        return [
            Finding(
                "error",
                f"{name!r} names {len(entries)} devices but the runtime reads {read} (it stops at the first "
                f"character that is not a digit or a comma): write {kind.visible_env}={','.join(entries)}",
            )
        ]
    if not ids:  # every device hidden: resolving the device says so, naming the variable
        return []
    if len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        return [Finding("error", f"{name} names device {repeated[0]} twice: list each device once")]
    if ids != sorted(ids):
        return [
            Finding(
                "error",
                f"{name} is out of order, which the {kind.type} runtime does not accept (its devices then read "
                f"as unavailable): list them ascending, {kind.visible_env}={','.join(map(str, sorted(ids)))}",
            )
        ]
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # set by torchrun (and for srun, by us)
    if local > 1 and local > len(ids):
        return [
            Finding(
                "error",
                f"{name} shows {len(ids)} device(s) but {local} processes run on this host: start "
                f"--nproc-per-node {len(ids)}, or make more devices visible",
            )
        ]
    return []


def rendezvous_port() -> list[Finding]:
    """Under a launch that is not torchrun's (srun, a hand-set env), rank 0 opens MASTER_PORT itself: an
    earlier job still holding it fails the start after a long timeout, so it is checked now."""
    if "TORCHELASTIC_RUN_ID" in os.environ or os.environ.get("RANK", "0") != "0":
        return []
    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or "MASTER_PORT" not in os.environ:
        return []
    port = int(os.environ["MASTER_PORT"])
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return [
                Finding(
                    "error",
                    f"MASTER_PORT {port} is already in use (an earlier job still running?): stop it, or export "
                    "another MASTER_PORT for every task",
                )
            ]
    return []


def auto_fell_back(spec: str) -> list[Finding]:
    """``--device auto`` chose the cpu although an accelerator's package is installed: that package failed
    to give a device, and the run would train on the cpu at a fraction of the speed without a word."""
    if spec.strip().lower() != dev.AUTO:
        return []
    for kind in dev.DEVICE_KINDS.values():
        if kind.package and importlib.util.find_spec(kind.package.split(".")[0]) is not None:
            status = package_status(kind.package) or "installed"
            return [
                Finding(
                    "error",
                    f"--device auto found no usable {kind.type} although {kind.package} is installed ({status}): "
                    f"fix the {kind.type} set-up (`python -m vtools env --check --device {kind.type}`), or pass "
                    "--device cpu to run on the cpu on purpose",
                )
            ]
    return []


def leftover_processes(kind: dev.DeviceKind, index: int) -> list[Finding]:
    """Other processes holding this device's node open: an earlier job that never ended keeps its memory
    (and on Ascend its HCCL ports), and the new run fails or crawls. Read from /proc, as far as this user
    may see; each rank checks only its own device, so torchrun's other ranks never count."""
    if not kind.device_file:
        return []
    card = physical_card(torch.device(kind.type, index), kind)  # the node is the card's, not the visible index
    node = os.path.realpath(kind.device_file.format(card))
    if not os.path.exists(node) or not os.path.isdir("/proc"):
        return []
    holders = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            links = [os.readlink(fd.path) for fd in os.scandir(f"{entry.path}/fd")]
        except OSError:  # another user's process, or one that just ended
            continue
        if node in links:
            holders.append(f"pid {entry.name} ({_command_line(entry.path)})")
    if not holders:
        return []
    label = device_label(torch.device(kind.type, index), kind)
    return [
        Finding(
            "warning",
            f"{label} ({node}) is held by {', '.join(holders[:3])}: an earlier job still running? stop it, or pick "
            "another device",
        )
    ]


def _command_line(proc_dir: str) -> str:
    try:
        with open(f"{proc_dir}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()[:80] or "?"
    except OSError:
        return "?"


def backend_version(kind: dev.DeviceKind) -> list[Finding]:
    """The backend package must be the release built for this torch (the npu package X.Y.Z needs torch X.Y.Z);
    the toolkit version (CANN) is noted where the package reports it."""
    if not kind.package or not kind.pairs_torch_version:
        return []
    version = _package_version(kind.package)
    if version is None:
        return []
    findings = []
    wanted, have = _release(torch.__version__), _release(version)
    if wanted != have:
        findings.append(
            Finding(
                "error",
                f"{kind.package} {version} is built for torch {'.'.join(have)}, this is torch {torch.__version__}: "
                f"install the {kind.package} release for torch {'.'.join(wanted)} (or the torch it was built for)",
            )
        )
    toolkit = _toolkit_version(kind)
    if toolkit:
        findings.append(Finding("note", f"{kind.package} {version}, toolkit {toolkit}"))
    return findings


def chip(device: torch.device) -> list[Finding]:
    """The chip, its mixed precision (bfloat16, or float16 with a GradScaler where it has none) and how its
    overflow is seen (inf, or the float-status flag of a chip that saturates)."""
    name = dev.device_name(device)
    family = dev.chip_family(device)
    name = f"{name} ({family.name})" if family else name
    # what the chip can do, not what this run does (the start line says that): a float32 run said "bfloat16"
    precision = (
        "bfloat16 supported (--amp uses it)"
        if dev.is_bf16_supported(device)
        else "no bfloat16: --amp uses float16 with a GradScaler"
    )
    mode = overflow_mode(device)
    overflow = f"; {mode.describe()}" if mode.flag else ""
    return [Finding("note", f"{device}: {name}, {precision}{overflow}")]


def settings(kind: dev.DeviceKind, device: torch.device | None = None) -> list[Finding]:
    """The backend's performance variables that differ from the recommended value (never set: most are read
    when the backend loads), and its launch queue where ``device``'s backend says it is off."""
    findings = launch_queue(kind, device) if device is not None else []
    for advice in kind.recommended_env:
        findings += _env_advice(advice)
    return findings


def launch_queue(kind: dev.DeviceKind, device: torch.device) -> list[Finding]:
    """A blocking-launch variable left on (a debugging setting: every launch waits for the device), or a
    queue the backend says is off; asked of the backend, since the variable is not the level in effect."""
    queue = kind.launch_queue
    if queue is None:
        return []
    if os.environ.get(queue.blocking_env) == "1":
        return [
            Finding(
                "warning",
                f"{queue.blocking_env}=1: every operator launch waits for the device (a debugging setting; the "
                f"launch queue is off): unset it for training",
            )
        ]
    effective = getattr(dev.device_module(device), queue.effective, None)
    if effective is not None and int(effective()) == 0:
        return [
            Finding(
                "note",
                f"the {device.type} launch queue is off ({queue.env}={os.environ.get(queue.env, '(unset)')}, or an "
                f"interactive interpreter): launches wait for the host; export {queue.env}=1 (the default; 2 is "
                "for pure inference)",
            )
        ]
    return []


def _env_advice(advice: EnvAdvice) -> list[Finding]:
    """The finding for one recommended variable: where the backend also reads another for the same thing, the
    one that is set gets the advice, and both set is refused (the backend refuses it)."""
    name, current = advice.name, os.environ.get(advice.name)
    other = advice.shared_with
    if other and other in os.environ:
        if current is not None:
            return [Finding("error", f"both {name} and {other} are set, which the backend refuses: keep one")]
        name, current = other, os.environ[other]
    present = current is not None and (
        advice.value in [item.strip() for item in current.split(",")] if advice.item else current == advice.value
    )
    if present:
        return []
    wanted = f"{current},{advice.value}" if advice.item and current else advice.value
    return [
        Finding(
            "note",
            f"{name}={current or '(unset)'}: {advice.why}; recommended {name}={wanted} (export it)",
        )
    ]


def apply_settings(device: torch.device, recommended: bool, named: dict[str, Any]) -> list[str]:
    """``--device-settings`` (``recommended``) and ``--device-kwargs NAME=VALUE`` (``named``): set the backend's
    runtime settings (npu: jit_compile off where the chip compiles per shape, so new shapes do not recompile
    operators for minutes). Returns a line for each: what was set, or why a recommended one was not."""
    settings = {setting.name: setting for setting in dev.kind_of(device.type).runtime_settings}
    unknown = sorted(set(named) - set(settings))
    if unknown:
        known = ", ".join(settings) or "none"
        raise UsageError(f"--device-kwargs {unknown[0]}: {device.type} has no such setting (it has: {known})")
    module, family = dev.device_module(device), dev.chip_family(device)
    lines = []
    for setting in settings.values():
        if setting.name in named:
            value = _switch_value(setting.name, named[setting.name])
        elif recommended and setting.recommended is not None:
            value = setting.recommended
            default = family.cells()[setting.chip_default] if family and setting.chip_default else None
            if default is not None and default.value == value:
                lines.append(f"{setting.name} is already {value} by default on the {family.name}")
                continue
        else:
            continue
        for target in setting.targets:
            lines.append(f"applied {device.type}.{_set(module, target, value)}")
    return lines


def _switch_value(name: str, value: Any) -> bool:
    """A setting's value as given (``True``, ``false``, ``1``...), as a bool."""
    words = {"true": True, "1": True, "on": True, "false": False, "0": False, "off": False}
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in words:
        return words[str(value).strip().lower()]
    raise UsageError(f"--device-kwargs {name}={value}: expected true or false")


def _set(module: Any, target: str, value: bool) -> str:
    """Set ``target`` under the backend's module (a call ``function(keyword)`` or an attribute path); returns
    what was done, as code."""
    if target.endswith(")"):
        function, keyword = target[:-1].split("(")
        getattr(module, function)(**{keyword: value})
        return f"{function}({keyword}={value})"
    *path, name = target.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, name, value)
    return f"{target} = {value}"


def package_status(package: str) -> str | None:
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


def _package_version(package: str) -> str | None:
    module = sys.modules.get(package)
    if module is not None and getattr(module, "__version__", None):
        return str(module.__version__)
    try:
        return importlib.metadata.version(package.split(".")[0].replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[str, ...]:
    """'2.14.0.post2' and '2.14.0+cpu' -> ('2', '14', '0')."""
    return tuple(re.findall(r"\d+", version.split("+")[0])[:3])


def _toolkit_version(kind: dev.DeviceKind) -> str | None:
    if not kind.toolkit_version:
        return None
    module_name, _, function = kind.toolkit_version.rpartition(".")
    try:
        return str(getattr(importlib.import_module(module_name), function)()) or None
    except Exception:  # an old toolkit without the query: nothing to note
        return None

"""torch.compile with a backend the device can take (``--torchcompile NAME``).

A device's package may register its own Dynamo backends (Ascend's: ``npu``, ``npugraph_ex``, ``npugraphs``,
through its ``torch_dynamo_backends`` entry points); which, is data in the device's row
(``DeviceKind.compile_backends``). Asking for one the installed package does not register (an older release, a
misspelling) failed deep inside Dynamo at the first forward pass; here it stops in one line naming those the
installed package has. torch's own backends (inductor, aot_eager, ...) pass as they are.
"""

from __future__ import annotations

import importlib.metadata

import torch

from vtools.errors import UsageError
from vtools.runtime.device import kind_of

ENTRY_POINTS = "torch_dynamo_backends"  # the group through which packages register Dynamo backends


def registered_backends() -> set[str]:
    """The Dynamo backends the installed packages register through entry points."""
    return {entry.name for entry in importlib.metadata.entry_points(group=ENTRY_POINTS)}


def check_compile_backend(device: torch.device, backend: str) -> None:
    """One line where ``backend`` is one of the device's own that its installed package does not register."""
    own = kind_of(device.type).compile_backends
    if backend not in own:
        return
    installed = registered_backends()
    if backend not in installed:
        have = ", ".join(name for name in own if name in installed) or "none"
        raise UsageError(
            f"--torchcompile {backend}: the installed {kind_of(device.type).package or device.type} registers no "
            f"Dynamo backend of that name (of {', '.join(own)} it has: {have}); torch's own, e.g. inductor, work too"
        )


def compile_for(device: torch.device, model: torch.nn.Module, backend: str, mode: str | None = None) -> torch.nn.Module:
    """``torch.compile(model, backend=backend, mode=mode)`` once the backend is known to be there."""
    check_compile_backend(device, backend)
    return torch.compile(model, backend=backend, mode=mode)

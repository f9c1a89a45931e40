"""Import torch, explaining the one failure that users cannot read: a broken backend.

torch >= 2.5 auto-loads out-of-tree device backends (Ascend's among them)
inside ``import torch``. When Ascend's backend is installed but its CANN
libraries are not on the library path, ``import torch`` itself raises
"Failed to load the backend extension". We turn that into a one-line error
that says how to fix it.
"""

from __future__ import annotations

import os

from vtools.errors import fail
from vtools.runtime.host_load import mark_start, quiet_waiting_threads

_AUTOLOAD_FAILURE = "Failed to load the backend extension"


def backend_autoload_hint(detail: str) -> str:
    """The fix for a backend that torch could not auto-load."""
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "unset")
    return (
        f"torch could not load an installed device backend ({detail}). "
        "For Ascend NPUs, load CANN first: `source /usr/local/Ascend/ascend-toolkit/set_env.sh` "
        f"(ASCEND_RT_VISIBLE_DEVICES={visible}); to run without that backend, set "
        "TORCH_DEVICE_BACKEND_AUTOLOAD=0 or uninstall it"
    )


def import_torch() -> None:
    """Import torch, exiting with one line (code 2) if a device backend breaks it. Before it loads: waiting
    OpenMP threads are told to sleep, and the window that measures the host's load opens
    (vtools/runtime/host_load.py)."""
    quiet_waiting_threads()
    mark_start()
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
        fail("torch is not installed: python3 -m pip install -r requirements.txt (see the README's install notes)")
    except RuntimeError as err:
        if _AUTOLOAD_FAILURE not in str(err):
            raise
        cause = err.__cause__
        detail = str(err).split(".")[0]
        if cause is not None:
            detail += f": {type(cause).__name__}: {cause}"
        fail(backend_autoload_hint(detail))

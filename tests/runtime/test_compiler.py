"""vtools/runtime/compiler.py: --torchcompile with the device package's own Dynamo backends, or one line."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.conftest import AUTOLOAD_DIR, load_emulated_npu
from vtools.errors import UsageError
from vtools.runtime.compiler import check_compile_backend, compile_for, registered_backends
from vtools.runtime.device import kind_of


@pytest.fixture
def emulator_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulator's distribution metadata on sys.path, as where it is autoloaded (its Dynamo backends)."""
    load_emulated_npu()
    monkeypatch.setattr(sys, "path", [str(AUTOLOAD_DIR), *sys.path])


@pytest.mark.npu_only(reason="the Dynamo backends torch_npu registers, registered by the emulated npu")
@pytest.mark.parametrize("backend", kind_of("npu").compile_backends)
def test_the_packages_own_backend_compiles_where_it_is_registered(backend: str, emulator_entry_points: None) -> None:
    assert backend in registered_backends()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to("npu")
    images = torch.randn(2, 4, device="npu")
    compiled = compile_for(torch.device("npu"), model, backend)
    torch.testing.assert_close(compiled(images), model(images))


@pytest.mark.npu_only(reason="the npu row's backends, without the package that registers them")
def test_a_backend_the_installed_package_lacks_is_refused_in_one_line() -> None:
    """Without the emulator's metadata nothing registers torch_npu's names: the run stops before any compile."""
    with pytest.raises(UsageError, match=r"^--torchcompile npugraphs: the installed torch_npu registers no Dynamo"):
        check_compile_backend(torch.device("npu"), "npugraphs")


def test_torchs_own_backends_and_other_devices_are_not_checked(device: torch.device) -> None:
    for backend in ("inductor", "aot_eager", "eager"):
        check_compile_backend(device, backend)
    if device.type != "npu":
        check_compile_backend(device, "npu")  # not this device's own name: left to Dynamo

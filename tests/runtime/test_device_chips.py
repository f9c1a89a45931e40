"""vtools/runtime/device_chips.py: the chip families, found by the device's name, and the defaults they set.

The cells' sources are checked against the real wheel in tests/runtime/test_device_kinds_wheel.py; here the
emulated npu poses as each family and vtools must take that family's defaults (its fused optimizer steps).
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import load_emulated_npu
from vtools.cli.train_flags import build_parser
from vtools.cli.typed import typed_options
from vtools.observe.fallback import FallbackWatch
from vtools.options.train_job import TrainJob
from vtools.runtime import device as dev
from vtools.runtime.device_chips import CELL_NAMES, CHIP_FAMILIES, family_by_key
from vtools.train import recipe

OPTIMIZERS = ("sgd", "adamw", "adam")


def test_a_device_without_a_known_chip_has_no_family(chip_device: torch.device) -> None:
    family = dev.chip_family(chip_device)
    if chip_device.type == "npu" and torch.npu.get_device_name().startswith("Ascend"):
        assert family is family_by_key("910A") and family.name == "Atlas training series (910A)"
    else:
        assert family is None  # cpu, cuda, the generic emulated npu: the row's defaults


def test_every_family_fills_every_cell() -> None:
    for family in CHIP_FAMILIES:
        assert set(family.cells()) == set(CELL_NAMES) and all(cell.source for cell in family.cells().values())


def _step_each_optimizer(device: torch.device) -> dict[str, bool]:
    """Build each optimizer as train.py does and take one step with it under the host-fallback audit: whether
    each took torch's fused step (and no step may have run on the host)."""
    load_emulated_npu()
    from tests.emulated_npu import fallbacks

    fused = {}
    for opt in OPTIMIZERS:
        model = torch.nn.Linear(4, 3).to(device)
        optim = typed_options(TrainJob, build_parser().parse_args(["--opt", opt])).optim
        optimizer = recipe.build_optimizer(model, optim, lr=0.1)
        with fallbacks.falling_back([]), FallbackWatch("npu") as watch:
            model(torch.randn(2, 4, device=device)).sum().backward()
            optimizer.step()
        assert [entry.op for entry in watch.fallbacks()] == [], (opt, torch.npu.get_device_name())
        fused[opt] = bool(optimizer.param_groups[0].get("fused"))
    return fused


@pytest.mark.npu_only(reason="the emulated npu posing as each Ascend chip family")
@pytest.mark.parametrize("key", [family.key for family in CHIP_FAMILIES])
def test_fused_steps_are_the_chips_and_none_runs_on_the_host(key: str) -> None:
    """AdamW and SGD take their fused step on Atlas A2/A3, Adam does not (its fused kernel runs on the host
    below Ascend950, announced at every step); Ascend950 fuses all three; the 910A none."""
    load_emulated_npu()
    from tests.emulated_npu.chips import posing_as

    family = family_by_key(key)
    with posing_as(key):
        fused = _step_each_optimizer(torch.device("npu:0"))
    assert fused == {opt: f"_fused_{opt}_" in family.fused_steps.value for opt in OPTIMIZERS}
    assert fused["adamw"] == fused["sgd"] == (key in ("910B", "910_93", "950")) and fused["adam"] == (key == "950")


@pytest.mark.npu_only(reason="the planted fault shows where a chip runs a fused step on the host")
def test_fused_everywhere_would_run_adams_step_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: with every fused step on (the old rule for devices with fused kernels), Adam's
    runs on a 910B's host, and the audit sees it."""
    load_emulated_npu()
    from tests.emulated_npu.chips import posing_as

    monkeypatch.setattr(dev, "fused_optimizer", lambda device, kernel: True)
    with posing_as("910B"), pytest.raises(AssertionError, match="adam"):
        _step_each_optimizer(torch.device("npu:0"))


def test_the_page_prints_the_table_as_the_code_holds_it() -> None:
    """docs/devices.md's chip table (between its markers) is table_markdown(): a changed cell or source fails."""
    from tests.conftest import REPO
    from vtools.runtime.device_chips import table_markdown

    page = (REPO / "docs" / "devices.md").read_text(encoding="utf-8")
    start = page.index("<!-- chip table: vtools/runtime/device_chips.py table_markdown() -->\n")
    shown = page[start:].split("\n", 1)[1].split("\n<!-- end of chip table -->", 1)[0]
    assert shown == table_markdown()

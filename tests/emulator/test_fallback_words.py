"""The emulated npu announces host fallbacks in each of torch_npu's forms, and vtools' audit counts each.

Every sentence is torch_npu 2.14.0's own (tests/runtime/test_device_kinds_wheel.py checks them against the real
wheel); here each form is reached by a real call on the emulated device, as a model would reach it, and the
audit (vtools/observe/fallback.py) must name the operators the sentence names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from tests.conftest import load_emulated_npu
from vtools.observe.fallback import FallbackWatch

pytestmark = pytest.mark.npu_only(reason="the announcements are the emulated npu's, in torch_npu's words")


def _npu(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.rand(*shape).clamp(0.05, 0.95).to("npu").requires_grad_(grad)


def _unfold_backward() -> None:
    _npu(2, 3, 8, 8, grad=True).unfold(2, 4, 2).sum().backward()


def _logit_backward() -> None:
    torch.logit(_npu(6, grad=True)).sum().backward()


def _fused_adam() -> None:
    weights = [_npu(5, grad=True)]
    weights[0].sum().backward()
    torch.optim.Adam(weights, fused=True).step()


def _masked_softmax(*shape: int, mask_type: int | None) -> Callable[[], None]:
    def call() -> None:
        mask = torch.zeros(*shape, dtype=torch.bool, device="npu")
        torch.ops.aten._masked_softmax(_npu(*shape), mask, -1, mask_type)

    return call


def _transform_bias_rescale_qkv() -> None:
    heads, width = 2, 8
    torch.ops.aten._transform_bias_rescale_qkv(_npu(2, 5, 3 * width), _npu(3 * width), heads)


LOGIT_OUT, LOGIT_BACKWARD_OUT = "aten::logit.out", "aten::logit_backward.out"  # torch_npu's names for the out=


@dataclass
class Case:
    form: str
    call: Callable[[], None]
    sentence: str  # the key of the sentence in the emulator's tables (or the boxed template's operator)
    ops: tuple[str, ...]  # what the audit must count
    listed: tuple[str, ...] = ()  # VTOOLS_EMU_NPU_FALLBACK_OPS for the case


CASES = [
    Case("boxed", lambda: torch.relu(_npu(4)), "aten::relu", ("aten::relu",), listed=("aten::relu",)),
    Case("boxed, a fused step", _fused_adam, "aten::_fused_adam_", ("aten::_fused_adam_",)),
    Case("unsupported", _unfold_backward, "aten::unfold_backward", ("aten::unfold_backward",)),
    Case("three overloads", lambda: torch.logit(_npu(6)), "aten::logit", ("aten::logit", "aten::logit_", LOGIT_OUT)),
    Case("two overloads", _logit_backward, "aten::logit_backward", ("aten::logit_backward", LOGIT_BACKWARD_OUT)),
    Case(
        "conditions",
        _masked_softmax(3, 4, mask_type=None),
        "conditions",
        ("aten::_masked_softmax",),
    ),
    Case(
        "unsupported, no space",
        _masked_softmax(1, 2, 3, 4, mask_type=2),
        "aten::_masked_softmax",
        ("aten::_masked_softmax",),
        listed=("aten::_masked_softmax",),
    ),
    Case(
        "unsupported, update CANN",
        _transform_bias_rescale_qkv,
        "aten::_transform_bias_rescale_qkv",
        ("aten::_transform_bias_rescale_qkv",),
        listed=("aten::_transform_bias_rescale_qkv",),
    ),
]


def _sentence(key: str) -> str:
    from tests.emulated_npu import fallbacks

    if key == "conditions":
        return fallbacks.MASKED_SOFTMAX_CONDITIONS
    return fallbacks.announcement(key)


@pytest.mark.parametrize("case", CASES, ids=[case.form for case in CASES])
def test_each_form_is_announced_and_counted(case: Case, capfd: pytest.CaptureFixture[str]) -> None:
    load_emulated_npu()
    from tests.emulated_npu import fallbacks

    with fallbacks.falling_back(list(case.listed)), FallbackWatch("npu") as watch:
        case.call()
    stderr = capfd.readouterr().err
    assert _sentence(case.sentence) in stderr
    counted = {entry.op for entry in watch.fallbacks()}
    assert set(case.ops) <= counted, (counted, stderr)


def test_each_sentence_of_the_emulator_is_reached_by_a_case() -> None:
    """Every form the emulator can print, but the sparse one (it has no sparse tensors), has a case above."""
    load_emulated_npu()
    from tests.emulated_npu import fallbacks

    reached = {_sentence(case.sentence) for case in CASES}
    boxed = {sentence for sentence in reached if sentence.startswith("CAUTION: The operator '")}
    assert len(boxed) == 2
    unreached = set(fallbacks.every_sentence()) - reached - {fallbacks.BOXED} - set(fallbacks.SPARSE_WORDS.values())
    assert unreached == set()


def test_masked_softmax_runs_on_the_device_when_its_kernel_takes_the_arguments(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """torch_npu's conditions: the last dim, mask type 2, a 4-d input; met, nothing is announced."""
    load_emulated_npu()
    from tests.emulated_npu import fallbacks

    with fallbacks.falling_back([]), FallbackWatch("npu") as watch:
        _masked_softmax(1, 2, 3, 4, mask_type=2)()
    assert watch.fallbacks() == []
    assert "CAUTION" not in capfd.readouterr().err

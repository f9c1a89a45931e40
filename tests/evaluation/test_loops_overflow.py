"""evaluate()'s overflow check on a chip that saturates, against the same body on IEEE devices.

A validation pass whose outputs overflow has no accuracy to report: on an IEEE chip its loss is inf or nan; on
a 910A (the emulated npu posing as one) its logits saturate and its loss is finite, and the float-status flag,
read once at the end of the pass, is what shows it. validate.py and train.py refuse both alike.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import scaled_batches
from vtools.data.loaders import Batch
from vtools.errors import RunFailed
from vtools.evaluation.loops import evaluate
from vtools.evaluation.validation import check_result
from vtools.runtime.amp import resolve_amp

BATCH, FEATURES, CLASSES = 4, 6, 3  # as scaled_batches makes them


def _batches(device: torch.device, scales: list[float]) -> list[Batch]:
    return scaled_batches(device, scales, seed=5)


def test_outputs_that_overflow_are_refused_on_every_chip(chip_device: torch.device) -> None:
    """One batch of inputs past float16's range among sound ones: the pass is refused with one line. A sound
    pass afterwards is not (the flag is lowered at the start of each pass)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, CLASSES).to(chip_device)
    amp = resolve_amp(chip_device, True, "float16")
    result = evaluate(model, _batches(chip_device, [1, 1e5, 1]), chip_device, amp, show_progress=False)
    assert result.overflowed and result.count == 3 * BATCH
    assert result.saturated == amp.overflow.saturates  # the flag is what shows it where the chip saturates
    with pytest.raises(RunFailed, match=r"^m: the loss over 12 images (is (inf|nan)|overflowed \(the chip saturates)"):
        check_result(result, "m", 0)
    sound = evaluate(model, _batches(chip_device, [1, 1]), chip_device, amp, show_progress=False)
    assert not sound.overflowed
    check_result(sound, "m", 0)

"""train_one_epoch's overflow checks on a chip that saturates, against the same bodies on IEEE devices.

Each test runs on cpu, the emulated npu (a 910B) and the emulated npu posing as a 910A, whose arithmetic
saturates (inf reads 65504) and whose float-status flag is all that shows an overflow. The outcome must be
the same on all: a forward pass that overflows stops the run at its step; a backward pass that overflows
under float16 skips one update, counted, and the epoch goes on.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import scaled_batches
from vtools.data.loaders import Batch
from vtools.errors import RunFailed
from vtools.runtime.amp import resolve_amp
from vtools.train.loop import TrainComponents, train_one_epoch

BATCH, FEATURES, CLASSES = 4, 6, 3  # as scaled_batches makes them


def _batches(device: torch.device, scales: list[float]) -> list[Batch]:
    return scaled_batches(device, scales, seed=3)


class Squared(torch.nn.Linear):
    """A linear layer whose outputs are squared: inputs of 1e20 overflow float32 in its forward pass."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return super().forward(images) ** 2


def _parts(device: torch.device, amp: bool, accum: int = 1, layer: type = torch.nn.Linear) -> TrainComponents:
    torch.manual_seed(0)
    model = layer(FEATURES, CLASSES).to(device)
    policy = resolve_amp(device, amp, "float16")
    return TrainComponents(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loss_fn=torch.nn.CrossEntropyLoss(),
        amp=policy,
        device=device,
        scaler=policy.grad_scaler(),
        grad_accum_steps=accum,
    )


@pytest.mark.parametrize(("amp", "huge"), [(True, 1e5), (False, 1e20)], ids=["float16", "float32"])
def test_a_forward_overflow_stops_at_its_step_on_every_chip(chip_device: torch.device, amp: bool, huge: float) -> None:
    """Batch 3's inputs overflow the forward pass (float16 past 65504; float32 past 3.4e38): the run stops there
    with the same words, whether the loss became inf or nan or the chip saturated and raised its flag."""
    parts = _parts(chip_device, amp, layer=Squared)
    with pytest.raises(RunFailed) as failed:
        train_one_epoch(parts, _batches(chip_device, [1, 1, 1, huge, 1]), 2, 0, log_interval=5, show_progress=False)
    message = str(failed.value)
    assert message.startswith("training stopped: the loss overflowed at epoch 2 step 3 ("), message
    saturates = parts.amp.overflow.saturates
    assert ("the chip saturates: its float-status flag rose in the forward pass" in message) == saturates


def test_a_backward_overflow_skips_one_update_and_the_epoch_goes_on(chip_device: torch.device) -> None:
    """Batch 0's inputs are 100x larger: its float16 weight gradient overflows at the initial scale 2**16 (its
    loss does not), so that update is skipped and counted, and the next batches train at 2**15."""
    parts = _parts(chip_device, amp=True)
    start = copy.deepcopy(parts.model).cpu()
    batches = _batches(chip_device, [100, 1, 1])
    result, updates = train_one_epoch(parts, batches, 0, 0, log_interval=1, show_progress=False)
    assert (result.skipped_updates, updates, parts.scaler.get_scale()) == (1, 3, 2.0**15)
    reference = torch.optim.SGD(start.parameters(), lr=0.1)
    for batch in batches[1:]:
        torch.nn.functional.cross_entropy(start(batch.images.cpu()), batch.targets.cpu()).backward()
        reference.step()
        reference.zero_grad()
    for ours, theirs in zip(parts.model.parameters(), start.parameters()):
        torch.testing.assert_close(ours.detach().cpu(), theirs.detach(), rtol=0, atol=5e-3)


def test_an_overflow_in_an_earlier_micro_batch_is_not_the_next_forward_passes(chip_device: torch.device) -> None:
    """With --grad-accum-steps 2, micro-batch 0's backward overflows and its update is skipped; micro-batch 1's
    forward pass is sound, so the run goes on. On a 910A the flag is still up when micro-batch 1 starts: the
    scaler keeps that reading for the update before the loop lowers the flag to watch the forward pass."""
    parts = _parts(chip_device, amp=True, accum=2)
    result, updates = train_one_epoch(
        parts, _batches(chip_device, [100, 1, 1, 1]), 0, 0, log_interval=4, show_progress=False
    )
    assert (result.skipped_updates, updates) == (1, 2)


def test_an_evaluation_before_the_epoch_does_not_count_against_its_first_step(chip_device: torch.device) -> None:
    """An overflow left over from before the epoch (an evaluation's, here any float16 op's) neither stops the
    run nor skips its first update."""
    parts = _parts(chip_device, amp=True)
    torch.exp(torch.full((), 12.0, dtype=torch.float16, device=chip_device))
    result, _ = train_one_epoch(parts, _batches(chip_device, [1, 1]), 0, 0, log_interval=2, show_progress=False)
    assert result.skipped_updates == 0


@pytest.mark.parametrize(("amp", "huge"), [(True, 1e5), (False, 1e20)], ids=["float16", "float32"])
def test_a_flag_left_up_before_the_epoch_hides_no_overflow_of_its_first_step(
    chip_device: torch.device, amp: bool, huge: float
) -> None:
    """Each forward pass starts with the flag lowered: a rise in the epoch's first is seen even when an earlier
    overflow had left the flag up."""
    parts = _parts(chip_device, amp, layer=Squared)
    torch.exp(torch.full((), 12.0, dtype=torch.float16, device=chip_device))
    with pytest.raises(RunFailed, match=r"^training stopped: the loss overflowed at epoch 0 step 0 \("):
        train_one_epoch(parts, _batches(chip_device, [huge, 1]), 0, 0, log_interval=2, show_progress=False)


def test_weights_an_update_blew_up_stop_the_run_at_the_next_step(chip_device: torch.device) -> None:
    """A rate past float32's range makes the first update overflow the weights (inf, or the largest value and
    a raised flag): the next forward pass overflows and the run stops there, the flag the update raised having
    been lowered so that the forward pass's own rise shows."""
    parts = _parts(chip_device, amp=False)
    parts.optimizer = torch.optim.SGD(parts.model.parameters(), lr=3e38)  # gradients of 100x inputs pass 1.2
    with pytest.raises(RunFailed, match=r"^training stopped: the loss overflowed at epoch 0 step 1 \("):
        train_one_epoch(parts, _batches(chip_device, [100, 1, 1]), 0, 0, log_interval=3, show_progress=False)

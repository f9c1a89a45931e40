"""train_one_epoch's arithmetic on every device: gradient accumulation, and the loss of a resumed epoch."""

from __future__ import annotations

import copy

import pytest
import torch

from vtools.data.loaders import Batch
from vtools.runtime.amp import resolve_amp
from vtools.train.loop import TrainComponents, train_one_epoch

BATCH, FEATURES, CLASSES = 4, 6, 3


def _batches(count: int, device: torch.device) -> list[Batch]:
    generator = torch.Generator().manual_seed(1)
    batches = []
    for i in range(count):
        images = torch.randn(BATCH, FEATURES, generator=generator)
        targets = torch.randint(0, CLASSES, (BATCH,), generator=generator)
        batches.append(Batch(images.to(device), targets.to(device), torch.arange(i * BATCH, (i + 1) * BATCH)))
    return batches


def _parts(model: torch.nn.Module, device: torch.device, accum: int) -> TrainComponents:
    return TrainComponents(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
        loss_fn=torch.nn.CrossEntropyLoss(),
        amp=resolve_amp(device, False),
        device=device,
        grad_accum_steps=accum,
    )


def _big_batch_step(model: torch.nn.Module, batches: list[Batch]) -> None:
    """One plain SGD step on the concatenation of ``batches``: the reference an update must equal."""
    images = torch.cat([b.images for b in batches])
    targets = torch.cat([b.targets for b in batches])
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(images), targets).backward()
    with torch.no_grad():
        for param in model.parameters():
            param -= param.grad


def test_partial_accumulation_group_equals_one_big_batch(device: torch.device) -> None:
    """5 batches with --grad-accum-steps 3: updates over batches 0-2 and over the last two, each equal to
    one step on the concatenated samples (timm divides the last, short group by its real size)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, CLASSES).to(device)
    reference = copy.deepcopy(model)
    batches = _batches(5, device)
    _, updates = train_one_epoch(
        _parts(model, device, accum=3), batches, epoch=0, num_updates=0, log_interval=5, show_progress=False
    )
    _big_batch_step(reference, batches[:3])
    _big_batch_step(reference, batches[3:])
    assert updates == 2
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.detach().cpu(), theirs.detach().cpu(), rtol=1e-5, atol=1e-6)


def test_resumed_epoch_loss_covers_the_whole_epoch(device: torch.device) -> None:
    """An epoch split at an update boundary (3 batches, then 2 with the first part's totals carried)
    reports the same train loss as the epoch run in one go."""
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, CLASSES).to(device)
    second = copy.deepcopy(model)
    batches = _batches(5, device)
    whole, _ = train_one_epoch(_parts(model, device, 1), batches, 0, 0, log_interval=5, show_progress=False)
    parts = _parts(second, device, 1)
    first, updates = train_one_epoch(parts, batches[:3], 0, 0, log_interval=5, show_progress=False)
    rest, _ = train_one_epoch(
        parts,
        batches[3:],
        0,
        updates,
        log_interval=5,
        show_progress=False,
        start_step=3,
        carried=(first.local_loss_sum, first.local_samples),
    )
    assert rest.local_samples == 5 * BATCH
    assert rest.loss == pytest.approx(whole.loss, rel=1e-6)
    assert first.loss != pytest.approx(whole.loss, rel=1e-3)  # the halves differ, so the carry matters


def test_a_ranks_own_first_signal_after_an_agreed_stop_asks_for_a_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun a rank may learn of a stop from another rank (the agreement) before its own SIGTERM
    arrives: that signal is its first, so it must not end the process before the checkpoint is saved;
    a second one does."""
    import os
    import signal

    import vtools.train.loop as loop

    monkeypatch.setattr(loop, "any_rank", lambda requested, device: True)  # another rank was signalled
    with loop.StopRequest() as stop:
        assert stop.agreed(0) and stop.signal_name == "SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)  # this rank's own, first signal: noted, no exit
        assert stop.requested
        with pytest.raises(SystemExit) as ended:
            os.kill(os.getpid(), signal.SIGTERM)  # a second one: stop now, with the stop's exit code
        assert ended.value.code == 143

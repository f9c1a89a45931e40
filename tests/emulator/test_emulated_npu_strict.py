"""The emulated NPU fails where a real one fails: mixed devices, unwaited side-stream copies, and
randomness that was not seeded, saved or restored on the device; and it counts host syncs.

These are the emulator's own tests (npu only, by nature); the suite's device-facing tests rely on
them when they run on npu.
"""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F

from tests.conftest import load_emulated_npu

load_emulated_npu()

import tests.emulated_npu as emulated  # noqa: E402

SAME_DEVICE = "Expected all tensors to be on the same device"
NPU = torch.device("npu:0")


def _npu(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=NPU)


MIXED = {
    "npu + cpu": lambda: _npu(3) + torch.ones(3),
    "npu:0 + npu:1": lambda: _npu(3) + torch.ones(3, device="npu:1"),
    "mm": lambda: torch.mm(_npu(2, 2), torch.ones(2, 2)),
    "cat": lambda: torch.cat([_npu(2), torch.ones(2)]),
    "where": lambda: torch.where(_npu(3) > 0, _npu(3), torch.zeros(3)),
    "index_select": lambda: _npu(4, 2).index_select(0, torch.tensor([0, 1], device="npu:1")),
    "cross_entropy with cpu targets": lambda: F.cross_entropy(_npu(4, 3), torch.tensor([0, 1, 2, 0])),
    "cpu Conv2d fed npu": lambda: torch.nn.Conv2d(3, 4, 3)(_npu(1, 3, 8, 8)),
    "cpu BatchNorm fed npu": lambda: torch.nn.BatchNorm2d(3)(_npu(2, 3, 4, 4)),
    "cpu Linear fed npu": lambda: torch.nn.Linear(3, 2)(_npu(2, 3)),
    "cpu timm model fed npu": lambda: timm.create_model("test_resnet", num_classes=3)(_npu(1, 3, 32, 32)),
}


@pytest.mark.parametrize("case", sorted(MIXED))
def test_mixed_devices_raise_like_cuda(case: str) -> None:
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        MIXED[case]()


def test_what_cuda_allows_stays_allowed() -> None:
    x = torch.arange(4.0, device=NPU)
    assert torch.equal((x + torch.tensor(1.0)).cpu(), torch.arange(1.0, 5.0))  # 0-dim cpu scalar
    assert torch.equal((x * 2).cpu(), torch.arange(0.0, 8.0, 2.0))  # python scalar
    assert torch.equal(x[torch.tensor([0, 3])].cpu(), torch.tensor([0.0, 3.0]))  # cpu index tensor
    x[torch.tensor([1])] = 7.0
    assert x.cpu().tolist() == [0.0, 7.0, 2.0, 3.0]
    assert x[torch.tensor([True, False, True, False])].cpu().tolist() == [0.0, 2.0]  # cpu mask
    model = timm.create_model("test_resnet", num_classes=3).to(NPU)
    assert model(_npu(2, 3, 32, 32)).device == NPU


# ---------------------------------------------------------------- streams


def _side_stream_copy(wait: bool) -> torch.Tensor:
    host = torch.arange(6, dtype=torch.int64).pin_memory()
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        on_device = host.to(NPU, non_blocking=True)
    if wait:
        torch.npu.current_stream().wait_stream(side)
    return on_device


def test_unwaited_side_stream_copy_is_poisoned() -> None:
    assert _side_stream_copy(wait=False).cpu().tolist() == [-1] * 6
    torch.npu.synchronize()


def test_waited_side_stream_copy_lands() -> None:
    assert _side_stream_copy(wait=True).cpu().tolist() == list(range(6))
    assert emulated.extension().hidden_storages() == 0


def test_side_stream_kernels_are_invisible_until_waited_for() -> None:
    """The prefetch pattern: copy and convert on a side stream, consume on the default stream."""
    host = torch.full((2, 3), 51, dtype=torch.uint8).pin_memory()
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        images = host.to(NPU, non_blocking=True).float().div_(255)
    assert torch.isnan(images.cpu()).all()  # no wait: the consumer reads garbage
    torch.npu.current_stream().wait_stream(side)
    assert torch.allclose(images.cpu(), torch.full((2, 3), 0.2))


def test_side_stream_sees_its_own_copy_and_float_poison_is_nan() -> None:
    host = torch.ones(4).pin_memory()
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        on_device = host.to(NPU, non_blocking=True)
        doubled = (on_device * 2).cpu()  # same stream: in order
    assert doubled.tolist() == [2.0] * 4
    with torch.npu.stream(side):
        late = host.to(NPU, non_blocking=True)
    assert torch.isnan(late.cpu()).all()  # the default stream did not wait
    event = torch.npu.Event()
    event.record(side)
    event.synchronize()
    assert late.cpu().tolist() == [1.0] * 4


def test_stream_api_and_record_stream() -> None:
    side = torch.npu.Stream()
    assert side.device == NPU and side != torch.npu.current_stream()
    assert torch.npu.current_stream() == torch.npu.default_stream()
    with torch.npu.stream(side):
        assert torch.npu.current_stream() == side
    assert torch.npu.current_stream() == torch.npu.default_stream()
    before = emulated.extension().recorded_streams()
    _npu(3).record_stream(side)
    assert emulated.extension().recorded_streams() == before + 1
    side.synchronize()


# ---------------------------------------------------------------- randomness


def test_each_device_has_its_own_generator() -> None:
    torch.manual_seed(7)
    expected = torch.rand(4, device=NPU).cpu()
    torch.manual_seed(7)
    torch.rand(100)  # cpu draws do not move the npu stream
    torch.rand(100, device="npu:1")  # nor do another device's
    assert torch.equal(torch.rand(4, device=NPU).cpu(), expected)


def test_device_rng_state_round_trip_and_cpu_state_is_not_enough() -> None:
    torch.manual_seed(3)
    cpu_state, npu_state = torch.get_rng_state(), torch.npu.get_rng_state(0)
    first = F.dropout(torch.ones(64, device=NPU), 0.5).cpu()
    torch.set_rng_state(cpu_state)  # restoring the cpu alone repeats nothing on the npu
    assert not torch.equal(F.dropout(torch.ones(64, device=NPU), 0.5).cpu(), first)
    torch.npu.set_rng_state(npu_state, 0)
    assert torch.equal(F.dropout(torch.ones(64, device=NPU), 0.5).cpu(), first)
    torch.npu.manual_seed(11)
    assert torch.npu.initial_seed() == 11


# ---------------------------------------------------------------- host synchronisations


def test_sync_counter_counts_item_and_device_to_host_copies_only() -> None:
    counter = emulated.extension().sync_count
    x = _npu(8)
    before = counter()
    y = (x * 2 + 1).softmax(0)
    logits = _npu(4, 3).requires_grad_()
    F.cross_entropy(logits, torch.tensor([0, 1, 2, 0], device=NPU)).backward()
    assert counter() == before  # kernels and backward (through the cpu fallback) are not syncs
    y.sum().item()
    assert counter() == before + 1
    y.cpu()
    assert counter() == before + 2
    torch.ones(3).to(NPU)  # host to device: no sync
    assert counter() == before + 2

"""vtools' AMP policy (vtools.runtime.amp.resolve_amp) driving a training step, on every device.

The step is this file's own (a timm model, SGD, cross-entropy, with the autocast context and GradScaler
the policy gives, as vtools.train.loop takes them), not the real loop: that is tests/train/test_loop.py.
bf16 and fp16 steps stay finite and move the weights; an fp32 step equals cpu's. Also: safetensors load
straight onto each device in each dtype.
"""

from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from vtools.runtime.amp import resolve_amp


def _model_and_batch(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = timm.create_model("test_resnet", num_classes=5, pretrained=False)
    images = torch.randn(4, 3, 64, 64)
    labels = torch.tensor([0, 1, 2, 3])
    return model, images, labels


def _train_step(
    model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device, amp: bool, amp_dtype: str
) -> torch.Tensor:
    policy = resolve_amp(device, amp=amp, amp_dtype=amp_dtype)
    scaler = policy.grad_scaler()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with policy.autocast():
        loss = F.cross_entropy(model(images.to(device)), labels.to(device))
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return loss.detach()


@pytest.mark.parametrize("amp, amp_dtype", [(False, "auto"), (True, "bfloat16"), (True, "float16")])
def test_step_is_finite_and_updates(device: torch.device, amp: bool, amp_dtype: str) -> None:
    model, images, labels = _model_and_batch()
    model.to(device).train()
    before = [p.detach().cpu().clone() for p in model.parameters()]
    loss = _train_step(model, images, labels, device, amp, amp_dtype)
    assert torch.isfinite(loss.float().cpu()).all()
    after = [p.detach().cpu() for p in model.parameters()]
    changed = sum(not torch.equal(a, b) for a, b in zip(before, after))
    assert changed > len(before) // 2, f"only {changed}/{len(before)} tensors changed"


def test_fp32_step_matches_cpu(device: torch.device) -> None:
    model, images, labels = _model_and_batch()
    reference = copy.deepcopy(model).train()
    ref_loss = _train_step(reference, images, labels, torch.device("cpu"), False, "auto")
    model.to(device).train()
    loss = _train_step(model, images, labels, device, False, "auto")
    assert torch.allclose(loss.cpu(), ref_loss, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-3, atol=1e-4), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_safetensors_from_cpu_straight_to_device(device: torch.device, tmp_path, dtype: torch.dtype) -> None:
    model, _, _ = _model_and_batch()
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    path = tmp_path / "weights.safetensors"
    save_file(state, str(path))
    loaded = load_file(str(path), device=str(device))
    assert loaded.keys() == state.keys()
    for key, value in loaded.items():
        assert value.device == device
        assert value.dtype == state[key].dtype
        assert torch.equal(value.cpu().float(), state[key].float()), key

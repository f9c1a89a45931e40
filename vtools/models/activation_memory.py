"""A model's activation memory per image, measured by running it on the meta device (shapes only).

Where the device is the host's own cores, activations come out of the same memory the loaders use, so
the host-memory check (``vtools.data.memory_estimate``) counts them. The forward runs with the model's
parameters and buffers swapped for meta tensors (``torch.func.functional_call``): no memory, no
arithmetic, tens of milliseconds for a ResNet-50, whatever the input size. Only module outputs are seen
(work inside one module, such as an attention's softmax, is not), so it errs low, never high.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.func import functional_call

PROBE_BATCH = 2  # BatchNorm in training mode refuses a batch of one


def activation_bytes_per_image(model: torch.nn.Module, input_size: Sequence[int], training: bool) -> int | None:
    """Activation bytes one image adds to a batch: for inference the two largest neighbours (a layer's
    input and output) alive at once, for training every distinct module output kept for the backward
    pass plus that peak. None when the model cannot run on the meta device (an ONNX model, an operator
    without a meta kernel): the check then counts the loaders alone."""
    sizes: list[int] = []
    seen: set[int] = set()

    def record(module: torch.nn.Module, inputs: object, output: object) -> None:
        for tensor in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(tensor, torch.Tensor) and id(tensor) not in seen:  # in-place ops return their input
                seen.add(id(tensor))
                sizes.append(tensor.numel() * tensor.element_size())

    leaves = [module for module in model.modules() if next(module.children(), None) is None]
    hooks = [module.register_forward_hook(record) for module in leaves]
    try:
        state = {
            name: torch.empty_like(t, device="meta") for name, t in (*model.named_parameters(), *model.named_buffers())
        }
        dtype = next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
        images = torch.empty((PROBE_BATCH, *input_size), device="meta", dtype=dtype)
        with torch.set_grad_enabled(training):
            functional_call(model, state, (images,))
    except Exception:  # not every model runs on meta tensors; the estimate then leaves activations out
        return None
    finally:
        for hook in hooks:
            hook.remove()
    if not sizes:
        return None
    peak = 2 * max(sizes)
    return (sum(sizes) + peak if training else peak) // PROBE_BATCH


def training_state_bytes(model: torch.nn.Module) -> int:
    """Gradients and an optimizer's two moment buffers: three more copies of the trainable weights."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)

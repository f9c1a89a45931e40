"""Cross-device parity: the same model, weights and batch on two devices, compared layer by layer.

One side is the device under test (optionally under its AMP policy), the other the reference (fp32).
Each side runs ``steps`` training steps from the same weights on the same batch: forward (the output of
every leaf module is recorded by a forward hook, in execution order), loss, backward (every parameter's
gradient) and an SGD update (every parameter's new value). :func:`compare` lines the two traces up and
gives one :class:`Entry` per tensor, in the order the run produced them: a step's activations in forward
order, its loss, its gradients in the order backward computes them (the last layer's first), its updated
weights; so the first entry out of tolerance is where the devices first part.

The error of a tensor ``a`` (device) against ``b`` (reference) is::

    max_abs_err = max |a - b|
    max_rel_err = max |a - b| / max(max |b|, 1e-3 * largest, 1e-12)

relative to the tensor's largest reference magnitude rather than element by element, so that elements
near zero (most of a ReLU's output) cannot make it explode; ``largest`` is the largest reference magnitude
of any tensor of the same kind in the step (all activations, all gradients, ...), so a tensor that is
nearly zero everywhere (a gradient that cancels to 1e-9) is measured against a thousandth of the step's
largest gradient, not against its own rounding noise. Non-finite values count as equal where both sides
have the same one (nan and nan, inf and inf), and as an infinite error otherwise.

On a chip that saturates (vtools/runtime/overflow.py: inf reads as the largest value, NaN as 0) an overflow
leaves nothing non-finite to compare, so the device side reads the chip's float-status flag after every
layer, the loss and the backward pass: a layer in which it rose counts as an infinite error, as an inf would
on an IEEE chip, and the verdict names it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from vtools.errors import RunFailed
from vtools.options.tools import DEFAULT_TOLERANCES
from vtools.runtime.amp import AmpPolicy
from vtools.runtime.overflow import FloatStatusFlag, float_status_flag

EPS = 1e-12
# a tensor is measured against at least this fraction of the largest tensor of its kind in the step
FLOOR = 1e-3
# default tolerances on max_rel_err by the device side's compute dtype: (activations and loss, gradients and
# updated weights). fp32 kernels of two devices differ in summation order (~1e-6 per layer, growing with depth);
# bf16 keeps 8 mantissa bits (a rounding step of 4e-3), fp16 11 (5e-4), and a network compounds a few of those
# steps. Gradients get 10x more: a parameter's gradient is a sum over the batch and the image that cancels
# (a batch-norm bias's most of all), so rounding shows more in it than in any activation. Measured on cpu
# (autocast against fp32; timm's test_resnet, test_vit, test_efficientnet, test_convnext at random init):
# worst activation 2.5e-2 (bf16) and 3.0e-3 (fp16), worst gradient 0.46 (bf16) and 0.16 (fp16): under AMP
# the gradients only catch gross errors (nan, a wrong sign or scale).
PHASES = ("forward", "loss", "backward", "update")
PHASE_WORDS = {"forward": "activation", "loss": "loss", "backward": "gradient", "update": "weight after the update"}


def default_tolerances(dtype_name: str, tol: float | None = None, grad_tol: float | None = None) -> dict[str, float]:
    """phase -> allowed max_rel_err: --tol for activations and the loss, --grad-tol for gradients and weights."""
    default_tol, default_grad_tol = DEFAULT_TOLERANCES[dtype_name]
    tol = default_tol if tol is None else tol
    grad_tol = default_grad_tol if grad_tol is None else grad_tol
    return {"forward": tol, "loss": tol, "backward": grad_tol, "update": grad_tol}


def tensor_error(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> tuple[float, float, float]:
    """(max |a - b|, max |a - b| / max(max |b|, floor, EPS), max |b|) of two host tensors; see the module."""
    if a.shape != b.shape:
        return math.inf, math.inf, math.nan
    if a.numel() == 0:
        return 0.0, 0.0, 0.0
    a, b = a.double(), b.double()
    same = (a == b) | (a.isnan() & b.isnan())
    diff = torch.where(same, torch.zeros_like(a), (a - b).abs()).nan_to_num(nan=math.inf, posinf=math.inf)
    finite = b[b.isfinite()]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    max_abs = float(diff.max())
    return max_abs, max_abs / max(scale, floor, EPS), scale


@dataclass
class Step:
    """What one side recorded in one training step, all as fp32 host copies."""

    activations: list[tuple[str, str, torch.Tensor]] = field(default_factory=list)  # (layer, module type, output)
    loss: torch.Tensor | None = None
    gradients: list[tuple[str, str, torch.Tensor | None]] = field(default_factory=list)  # (parameter, owner type)
    weights: list[tuple[str, str, torch.Tensor]] = field(default_factory=list)
    # a saturating chip's: the layers (and "loss", BACKWARD) after which its float-status flag was up
    saturated: set[str] = field(default_factory=set)


BACKWARD = "(backward pass)"  # the gradients' entry where the flag rose during backward, before any gradient


@dataclass
class Entry:
    """One compared tensor: a row of the per-layer table."""

    step: int
    phase: str  # forward, loss, backward, update
    layer: str  # module name (activations) or parameter name (gradients, weights)
    module_type: str
    shape: tuple[int, ...]
    max_abs_err: float
    max_rel_err: float
    ref_max_abs: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.max_rel_err <= self.tol  # nan is not ok

    def row(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "phase": self.phase,
            "layer": self.layer,
            "module_type": self.module_type,
            "shape": "x".join(map(str, self.shape)),
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "ref_max_abs": self.ref_max_abs,
            "tol": self.tol,
            "ok": self.ok,
        }


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """An fp32 host copy that later in-place operations (an inplace ReLU) cannot change."""
    return tensor.detach().to("cpu", torch.float32, copy=True)


def _float_tensors(value: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """The floating-point tensors of a module output (a tensor, or tuples/lists/dicts of them)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield prefix, value
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from _float_tensors(item, f"{prefix}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _float_tensors(item, f"{prefix}[{key}]")


class _Recorder:
    """Forward hooks: every leaf module's outputs in execution order, and the order modules first run; with a
    float-status ``flag``, the layers after which it was up (then lowered, so the next layer starts clean)."""

    def __init__(self, model: torch.nn.Module, flag: FloatStatusFlag | None = None) -> None:
        self.model = model
        self.flag = flag
        self.step: Step | None = None
        self.calls: dict[str, int] = {}
        self.first_call: dict[str, int] = {}
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._pre_hook(name)))
            if not any(True for _ in module.children()):
                self.handles.append(module.register_forward_hook(self._hook(name)))

    def _pre_hook(self, name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any) -> None:
            self.first_call.setdefault(name, len(self.first_call))

        return hook

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self.step is None:
                return
            count = self.calls[name] = self.calls.get(name, 0) + 1
            layer = (name or "(model)") + (f"#{count}" if count > 1 else "")
            for suffix, tensor in _float_tensors(output):
                self.step.activations.append((layer + suffix, type(module).__name__, _host_copy(tensor)))
            if _rose(self.flag):
                self.step.saturated.update(layer + suffix for suffix, _ in _float_tensors(output))

        return hook

    @contextmanager
    def recording(self, step: Step) -> Iterator[None]:
        self.step, self.calls = step, {}
        try:
            yield
        finally:
            self.step = None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _rose(flag: FloatStatusFlag | None) -> bool:
    """Whether the flag is up (a host read: parity copies every tensor to the host anyway); lowers it."""
    if flag is None or not bool(flag.raised()):
        return False
    flag.clear()
    return True


def _parameter_owners(model: torch.nn.Module) -> dict[str, tuple[str, str]]:
    """parameter name -> (name of the module that holds it, that module's type)."""
    owners = {}
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            owners[full] = (module_name, type(module).__name__)
    return owners


def _deterministic_layers(model: torch.nn.Module) -> None:
    """Dropout and drop-path draw from each device's own random generator: switched off (eval) so that the
    two sides compute the same function; everything else (batch-norm statistics) stays in training mode."""
    stochastic = (torch.nn.modules.dropout._DropoutNd,)
    try:
        from timm.layers import DropPath

        stochastic += (DropPath,)
    except ImportError:  # an older timm
        pass
    for module in model.modules():
        if isinstance(module, stochastic):
            module.eval()


def _loss(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on class logits; the mean square of anything else (a feature extractor)."""
    tensors = list(_float_tensors(output))
    if not tensors:
        raise RunFailed("the model's output holds no floating-point tensor to take a loss of")
    logits = tensors[0][1].float()
    if logits.dim() == 2 and logits.shape[1] > 1:
        return torch.nn.functional.cross_entropy(logits, targets % logits.shape[1])
    return sum(t.float().pow(2).mean() for _, t in tensors)


def _backward(
    loss: torch.Tensor, params: list[torch.nn.Parameter], scaled: bool, flag: FloatStatusFlag | None = None
) -> bool:
    """``loss.backward()``; for fp16 (``scaled``) with loss scaling as a GradScaler does, but settled within the
    step: from 2**16, halved until no gradient overflowed (none is non-finite, and a saturating chip's ``flag``
    stayed down), then divided out (a GradScaler would skip the step instead, and the two sides could skip
    different steps). Returns whether the flag rose in the backward pass that was kept."""
    if not scaled:
        loss.backward()
        return _rose(flag)
    scale = 2.0**16
    while True:
        for param in params:
            param.grad = None
        (loss * scale).backward(retain_graph=scale > 1)
        grads = [param.grad for param in params if param.grad is not None]
        rose = _rose(flag)
        if scale <= 1 or (not rose and all(bool(torch.isfinite(grad).all()) for grad in grads)):
            break
        scale /= 2
    for grad in grads:
        grad.div_(scale)
    return rose


def run_side(
    model: torch.nn.Module,
    images: torch.Tensor,
    targets: torch.Tensor,
    device: torch.device,
    amp: AmpPolicy,
    steps: int,
    lr: float,
    channels_last: bool = False,
    seed: int = 0,
) -> list[Step]:
    """``steps`` SGD training steps of a copy of ``model`` on ``device`` under ``amp``, recorded."""
    model = copy.deepcopy(model).to(device)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    if channels_last:
        model = model.to(memory_format=memory_format)
    model.train()
    _deterministic_layers(model)
    images = images.to(device).contiguous(memory_format=memory_format)
    targets = targets.to(device)
    owners = _parameter_owners(model)
    params = dict(model.named_parameters())
    optimizer = torch.optim.SGD([p for p in params.values() if p.requires_grad], lr=lr, momentum=0.9)
    flag = float_status_flag(device, amp.overflow)
    recorder = _Recorder(model, flag)
    torch.manual_seed(seed)
    trace = []
    try:
        for _ in range(steps):
            step = Step()
            optimizer.zero_grad(set_to_none=True)
            if flag is not None:
                flag.clear()
            with recorder.recording(step), amp.autocast():
                output = model(images)
            loss = _loss(output, targets)
            step.loss = _host_copy(loss)
            if _rose(flag):
                step.saturated.add("loss")
            if _backward(loss, list(params.values()), scaled=amp.needs_grad_scaler, flag=flag):
                step.saturated.add(BACKWARD)
            order = recorder.first_call
            backward_order = sorted(params, key=lambda name: -order.get(owners[name][0], -1))
            step.gradients = [
                (name, owners[name][1], None if params[name].grad is None else _host_copy(params[name].grad))
                for name in backward_order
            ]
            optimizer.step()
            step.weights = [(name, owners[name][1], _host_copy(params[name])) for name in backward_order]
            trace.append(step)
    finally:
        recorder.remove()
    return trace


def compare(reference: list[Step], candidate: list[Step], tol: float | dict[str, float]) -> list[Entry]:
    """Every recorded tensor of ``candidate`` against ``reference``, in the order the run produced them;
    ``tol``: one tolerance, or one per phase (:func:`default_tolerances`)."""
    tols = tol if isinstance(tol, dict) else dict.fromkeys(PHASES, tol)
    entries = []
    for index, (ref, got) in enumerate(zip(reference, candidate, strict=True), 1):
        if [a[0] for a in ref.activations] != [a[0] for a in got.activations]:
            raise RunFailed(
                f"step {index}: the two devices ran different layers ({len(got.activations)} vs "
                f"{len(ref.activations)} recorded outputs); the model's forward depends on its device"
            )
        pairs = [("forward", a, b) for a, b in zip(got.activations, ref.activations)]
        pairs.append(("loss", ("loss", "loss", got.loss), ("loss", "loss", ref.loss)))
        if BACKWARD in got.saturated:
            pairs.append(("backward", (BACKWARD, "float-status flag", None), (BACKWARD, "", None)))
        pairs += [("backward", a, b) for a, b in zip(got.gradients, ref.gradients)]
        pairs += [("update", a, b) for a, b in zip(got.weights, ref.weights)]
        floors = {}  # per phase: FLOOR x the largest reference magnitude
        for phase, _, (_, _, b) in pairs:
            if b is not None and b.numel():
                finite = b[b.isfinite()]
                largest = float(finite.abs().max()) if finite.numel() else 0.0
                floors[phase] = max(floors.get(phase, 0.0), FLOOR * largest)
        for phase, (name, module_type, a), (_, _, b) in pairs:
            if name == BACKWARD:  # the saturating chip's flag rose in backward: no gradient shows it
                entries.append(Entry(index, phase, name, module_type, (), math.inf, math.inf, math.nan, tols[phase]))
                continue
            if a is None and b is None:  # a parameter without a gradient on both sides
                continue
            if a is None or b is None:
                errors = (math.inf, math.inf, math.nan)
            else:
                errors = tensor_error(a, b, floors.get(phase, 0.0))
            if name in got.saturated:  # the chip saturated here: as an inf would compare on an IEEE chip
                errors = (math.inf, math.inf, errors[2])
            shape = tuple((b if b is not None else a).shape)
            entries.append(Entry(index, phase, name, module_type, shape, *errors, tols[phase]))
    return entries


def first_failure(entries: list[Entry]) -> Entry | None:
    return next((entry for entry in entries if not entry.ok), None)


def worst(entries: list[Entry]) -> Entry | None:
    return max(entries, key=lambda entry: entry.max_rel_err, default=None)


def describe(entry: Entry) -> str:
    """``layer1.0.conv1 (Conv2d)``, the activation's or parameter's name and its module type."""
    return f"{entry.layer} ({entry.module_type})"


def verdict(entries: list[Entry], steps: int) -> str:
    """The one-line verdict: ``parity: pass ...`` or ``parity: FAIL at <layer> (<type>): ...``."""
    bad = first_failure(entries)
    if bad is not None:
        where = f"{PHASE_WORDS[bad.phase]}, step {bad.step}" if steps > 1 else PHASE_WORDS[bad.phase]
        return (
            f"parity: FAIL at {describe(bad)}: max rel err {bad.max_rel_err:.3g} > tol {bad.tol:.3g} "
            f"({where}; max abs err {bad.max_abs_err:.3g})"
        )
    counts = {phase: sum(entry.phase == phase and entry.step == 1 for entry in entries) for phase in PHASES}
    top = worst(entries)
    tail = ""
    if top is not None:
        tail = f"; worst max rel err {top.max_rel_err:.3g} at {describe(top)}" if top.max_rel_err else ": identical"
    return (
        f"parity: pass ({counts['forward']} activations, {counts['backward']} gradients and "
        f"{counts['update']} updated weights per step over {steps} step(s) within tolerance{tail})"
    )

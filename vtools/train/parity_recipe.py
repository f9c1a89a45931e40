"""Cross-device parity of train.py's own training step: ``vtools parity --train -c RUN.yaml``.

:mod:`vtools.observe.parity` steps its own SGD on one batch. Here each side builds what train.py builds
(vtools/train/assemble.py: the data, the model, the real loader with its seeded order and augmentation,
timm's optimizer with its parameter groups, the loss, mixup, EMA, GradScaler, clipping) and runs the
first ``steps`` batches of epoch 0 through train.py's own loop (:func:`vtools.train.loop.train_one_epoch`),
from the same weights (built once, the state dict copied) and the same seeds. Recorded per step: the batch
after the device path (normalisation, on-device colour jitter, channels-last), every leaf module's output,
the loss, every gradient as the optimizer sees it (after clipping), and the change the update made to every
weight and to the EMA's. The change, ``w_after - w_before`` on each side, is what is compared for the
update, so its error is relative to the reference change's size: a wrong weight decay shows even when a
step barely moves the weights.

Some of train.py's defaults differ between devices by design; they are forced equal on both sides and said
on the first line: the layout (channels-last), torch's fused optimizer step (off), and the draws from each
device's own random generator (dropout, drop-path, DropBlock, random erasing's noise: off).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from vtools.errors import UsageError
from vtools.models.prepare import unwrap, use_channels_last
from vtools.observe import parity
from vtools.options.train_job import TrainJob
from vtools.runtime.amp import AmpPolicy
from vtools.runtime.device import seed_everything
from vtools.runtime.distributed import DistInfo
from vtools.train import recipe
from vtools.train.assemble import build_components, build_loaders, build_model, class_balance
from vtools.train.loop import TrainComponents, train_one_epoch
from vtools.train.run import TrainingData, open_data

BATCH = "(batch after the device path)"
EMA_PREFIX = "ema."
# options that draw from each device's own random generator (the npu's is seeded apart from the cpu's)
DEVICE_RANDOM = (("drop", "dropout"), ("drop_path", "drop-path"), ("drop_connect", "drop-path"))


def _quiet(line: str) -> None:
    """Set-up notes train.py would print; the parity's own first line says what matters here."""


@dataclass(frozen=True)
class RecipeSetup:
    """The job both sides run (with the device defaults forced equal), its data, and the initial weights."""

    job: TrainJob
    data: TrainingData
    state: dict[str, torch.Tensor]
    forced: list[str]


def prepare(job: TrainJob, device: torch.device) -> RecipeSetup:
    """The data and weights both sides start from, and ``job`` with the defaults that differ between devices
    forced to one choice: the layout ``device`` (the device under test) would take, no fused optimizer step,
    and no draws from the devices' own random generators."""
    seed_everything(job.run.seed)
    data, batch_size = open_data(job, DistInfo(), _quiet)
    job = replace(job, data=replace(job.data, batch_size=batch_size))
    model = build_model(job.model, data.num_classes, torch.device("cpu"))
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    channels_last = use_channels_last(job.model.channels_last, model, device)
    forced = [f"channels-last {'on' if channels_last else 'off'}"]
    optim = job.optim
    if recipe.fused_kernel(optim.opt) is not None:  # torch's fused step: some devices' default, its own rounding
        optim = replace(optim, opt_kwargs={**optim.opt_kwargs, "fused": False})
        forced.append("fused optimizer step off")
    model_changes: dict[str, Any] = {"channels_last": channels_last}
    for name, words in DEVICE_RANDOM + (("drop_block", "DropBlock"),):
        if getattr(job.model, name):
            model_changes[name] = 0.0
            if f"{words} off" not in forced:
                forced.append(f"{words} off")
    augment = job.augment
    if augment.reprob > 0 and augment.remode != "const":
        augment = replace(augment, reprob=0.0)
        forced.append("random erasing off (its noise comes from each device's generator)")
    job = replace(job, model=replace(job.model, **model_changes), augment=augment, optim=optim)
    return RecipeSetup(job, data, state, forced)


def run_side(setup: RecipeSetup, device: torch.device, amp: AmpPolicy, steps: int) -> list[parity.Step]:
    """``steps`` batches of epoch 0 through train.py's loop on ``device``, recorded (module docstring)."""
    job, data = setup.job, setup.data
    seed_everything(job.run.seed)
    model = build_model(job.model, data.num_classes, device)
    model.load_state_dict(setup.state)
    # one loader process, as train.py has: decoding in this one would reseed its random generators (each
    # sample's seed) between mixup's draws, at points that depend on how far ahead the device prefetches
    loaders = build_loaders(job, model, data.train, data.val, device, DistInfo(), workers=1)
    if steps > len(loaders.train):
        raise UsageError(f"--steps {steps}: an epoch of this run has {len(loaders.train)} batches; give at most that")
    weights = class_balance(job.augment, job.data, data.train, data.classes, _quiet)
    parts, _, _ = build_components(
        job, model, loaders, data.num_classes, device, amp, DistInfo(), None, weights, data.multi_label
    )
    seed_everything(job.run.seed)  # mixup's and erasing's host draws: the same on both sides
    loaders.sampler.set_epoch(0)
    recorder = StepRecorder(parts)
    try:
        train_one_epoch(parts, recorder.batches(loaders.train, steps), 0, 0, log_interval=steps, show_progress=False)
    finally:
        recorder.remove()
    return recorder.trace


class StepRecorder:
    """What one side's steps compute: the batch, leaf outputs, the loss, gradients and the weights' change."""

    def __init__(self, parts: TrainComponents) -> None:
        self.parts = parts
        self.model = unwrap(parts.model)
        self.forward = parity._Recorder(self.model)
        self.owners = parity._parameter_owners(self.model)
        self.params = dict(self.model.named_parameters())
        self.trace: list[parity.Step] = []
        self.before: dict[str, torch.Tensor] = {}
        self.handles = [
            parts.optimizer.register_step_pre_hook(self._gradients),
            parts.loss_fn.register_forward_hook(self._loss),
        ]

    def batches(self, loader: Iterable, steps: int) -> _Batches:
        return _Batches(loader, min(steps, len(loader)), self)  # type: ignore[arg-type]

    def order(self) -> list[str]:
        """Parameters in the order backward computes their gradients (the last layer's first)."""
        first = self.forward.first_call
        return sorted(self.params, key=lambda name: -first.get(self.owners[name][0], -1))

    def weights(self) -> dict[str, torch.Tensor]:
        """The floating-point weights whose change the update is judged by: the model's and the EMA's."""
        found = {name: parity._host_copy(self.params[name]) for name in self.order()}
        if self.parts.ema is not None:
            for name, tensor in self.parts.ema.module.state_dict().items():
                if tensor.is_floating_point():
                    found[EMA_PREFIX + name] = parity._host_copy(tensor)
        return found

    def begin(self, batch: Any) -> None:
        step = parity.Step()
        step.activations.append((BATCH, "input", parity._host_copy(batch.images)))
        self.trace.append(step)
        self.before = self.weights()
        self.forward.step, self.forward.calls = step, {}

    def end(self, update_due: bool) -> None:
        self.forward.step = None
        step = self.trace[-1]
        if update_due and not step.gradients:  # a GradScaler skipped the update: no gradient reached it
            step.gradients = [(name, self.owners[name][1], None) for name in self.order()]
        after = self.weights()
        names = self.order() + [name for name in after if name.startswith(EMA_PREFIX)]  # backward's order now known
        step.weights = [(name, self._type(name), after[name] - self.before[name]) for name in names]

    def _type(self, name: str) -> str:
        owner = self.owners.get(name.removeprefix(EMA_PREFIX))
        kind = owner[1] if owner else "buffer"
        return f"EMA {kind}" if name.startswith(EMA_PREFIX) else kind

    def _gradients(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads = [(name, self.owners[name][1], self.params[name].grad) for name in self.order()]
        self.trace[-1].gradients = [(n, t, None if g is None else parity._host_copy(g)) for n, t, g in grads]

    def _loss(self, module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        if self.forward.step is not None:
            self.forward.step.loss = parity._host_copy(output)

    def remove(self) -> None:
        self.forward.remove()
        for handle in self.handles:
            handle.remove()


@dataclass
class _Batches:
    """The loader's first ``steps`` batches, each one's recording opened before the loop takes it and closed
    when the loop asks for the next (its update and EMA update done)."""

    loader: Iterable
    steps: int
    recorder: StepRecorder

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Any]:
        accum = max(1, self.recorder.parts.grad_accum_steps)
        for index, batch in zip(range(self.steps), self.loader):
            self.recorder.begin(batch)
            yield batch
            self.recorder.end((index + 1) % accum == 0 or index + 1 == self.steps)


def compare(reference: list[parity.Step], candidate: list[parity.Step], tols: dict[str, float]) -> list[parity.Entry]:
    """:func:`vtools.observe.parity.compare` of the two traces (the update phase holds the weights' change)."""
    return parity.compare(reference, candidate, tols)


def what(entry: parity.Entry) -> str:
    """The words for a tensor's phase in the verdict."""
    if entry.layer == BATCH:
        return "the batch the loader gave"
    if entry.phase == "update":
        return "the change the update made to the " + ("EMA weight" if entry.layer.startswith(EMA_PREFIX) else "weight")
    if entry.phase == "backward":
        return "gradient, as the optimizer sees it"
    return parity.PHASE_WORDS[entry.phase]


def verdict(entries: list[parity.Entry], steps: int) -> str:
    """``parity: pass (...)`` or ``parity: FAIL at <name> (<type>): ... (<what>, step N; ...)``."""
    bad = parity.first_failure(entries)
    if bad is None:
        return parity.verdict(entries, steps)
    return (
        f"parity: FAIL at {parity.describe(bad)}: max rel err {bad.max_rel_err:.3g} > tol {bad.tol:.3g} "
        f"({what(bad)}, step {bad.step}; max abs err {bad.max_abs_err:.3g})"
    )


def first_line(
    setup: RecipeSetup, device: torch.device, amp: AmpPolicy, reference: torch.device, steps: int, tols: dict
) -> str:
    """What is compared, and the device defaults forced equal on both sides."""
    job = setup.job
    return (
        f"parity: train.py's step, {job.model.model} ({job.optim.opt}, batch {job.data.batch_size}) on {device} "
        f"({amp.dtype_name}) against {reference} (float32), {steps} step(s); forced equal on both sides: "
        f"{', '.join(setup.forced)}; tolerance {tols['forward']:g} (activations), {tols['backward']:g} "
        "(gradients, the update's change)"
    )


def run(
    job: TrainJob,
    device: torch.device,
    amp: AmpPolicy,
    reference: torch.device,
    reference_amp: AmpPolicy,
    steps: int,
    tols: dict[str, float],
    say: Callable[[str], None] = print,
) -> list[parity.Entry]:
    """Both sides' steps (the reference's first) compared; says the first line before the sides run."""
    setup = prepare(job, device)
    say(first_line(setup, device, amp, reference, steps, tols))
    traces = [run_side(setup, side, side_amp, steps) for side, side_amp in ((reference, reference_amp), (device, amp))]
    return compare(traces[0], traces[1], tols)

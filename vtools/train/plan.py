"""A training run's plan: the decisions the job, the device and the data make together, taken once before
the loaders, the optimizer and the schedule are built.

The batch a process trains with (fitted to a tiny set), the global batch, the peak learning rate (--lr, or
--lr-base scaled to the global batch as timm's train.py scales it), the batches and optimizer updates of an
epoch, the epochs timm's schedule takes (cool-down included), the memory layout and the optimizer's step
form where the device's defaults chose them, and what the data-wait advice needs to know about the loaders:
each is decided here from values, printed by the run's start lines and handed to the builders, so nothing
the start lines say climbs back out of a built object, and the device reasoning stays out of the command.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vtools.data.readers.registry import Source
from vtools.data.readers.wds_stream import StreamedShards
from vtools.data.stream_batches import per_rank_samples
from vtools.models.prepare import use_channels_last
from vtools.observe.data_wait import LoaderSetting
from vtools.options.train_job import TrainJob
from vtools.runtime import device as dev
from vtools.runtime.distributed import DistInfo
from vtools.runtime.resolve import Runtime
from vtools.train import recipe
from vtools.train.assemble import balanced_sampler, train_sampler


@dataclass(frozen=True)
class RunPlan:
    """What the run will do, decided before it builds anything that does it."""

    batch_size: int  # per process and step, fitted to a tiny set
    world_size: int
    grad_accum_steps: int
    lr: float  # the schedule's peak rate
    batches_per_epoch: int  # this process's, whole batches (an epoch drops its last partial one, as timm's)
    updates_per_epoch: int  # optimizer updates: the batches over --grad-accum-steps, a last short group counting
    num_epochs: int  # timm's: --epochs with warm-up prefix, cycles and cool-down
    channels_last: bool
    layout_by_device: bool  # no --[no-]channels-last: the device's default chose the layout
    fused_step: bool | None  # torch's fused optimizer step; None: the optimizer has none
    fused_by_device: bool  # no ``fused`` in --opt-kwargs: the device chose the step form
    loader: LoaderSetting  # what the data-wait advice reads

    @property
    def global_batch(self) -> int:
        """Images per optimizer update over every process."""
        return self.batch_size * self.grad_accum_steps * self.world_size

    def device_defaults_line(self, device_type: str) -> str:
        """The choices the device's own defaults made, so a user comparing devices knows what to give both
        runs; '' when the flags chose them."""
        chosen = []
        if self.layout_by_device:
            chosen.append(f"{'channels-last' if self.channels_last else 'channels-first'} layout")
        if self.fused_by_device and self.fused_step is not None:
            chosen.append(f"{'fused' if self.fused_step else 'per-tensor'} optimizer step")
        if not chosen:
            return ""
        return (
            f"{device_type} defaults: {' and '.join(chosen)}; another device may choose otherwise (to compare "
            "devices step for step, give both --channels-last and --opt-kwargs fused=False)"
        )


def plan_run(
    job: TrainJob, runtime: Runtime, model: torch.nn.Module, img_size: int, train: Source, dist_info: DistInfo
) -> RunPlan:
    """The plan of ``job`` (its batch already fitted to the set) on this runtime, for the architecture
    ``model`` (whether it is a convnet decides the default layout) at ``img_size``."""
    optim, device = job.optim, runtime.device
    global_batch = job.data.batch_size * optim.grad_accum_steps * dist_info.world_size
    lr = recipe.scaled_lr(optim, global_batch)
    batches = batches_per_epoch(job, train, dist_info)
    updates = -(-batches // optim.grad_accum_steps)
    kernel = recipe.fused_kernel(optim.opt)
    fused_by_device = "fused" not in optim.opt_kwargs
    if kernel is None:
        fused: bool | None = None
    elif fused_by_device:
        fused = dev.fused_optimizer(device, kernel)
    else:
        fused = bool(optim.opt_kwargs["fused"])
    paths = train.samples.paths  # a few spread over the set, not a copy of a million names
    loader = LoaderSetting(
        runtime.budget,
        workers_given=job.runtime.workers is not None,
        from_files=not job.data.dataset,
        data_path=job.data.data_dir or "",
        img_size=img_size,
        sample_files=tuple(str(path) for path in paths[:: max(1, len(paths) // 8)][:8]),
    )
    return RunPlan(
        batch_size=job.data.batch_size,
        world_size=dist_info.world_size,
        grad_accum_steps=optim.grad_accum_steps,
        lr=lr,
        batches_per_epoch=batches,
        updates_per_epoch=updates,
        num_epochs=schedule_length(job, lr, updates),
        channels_last=use_channels_last(job.model.channels_last, model, device),
        layout_by_device=job.model.channels_last is None,
        fused_step=fused,
        fused_by_device=fused_by_device,
        loader=loader,
    )


def batches_per_epoch(job: TrainJob, train: Source, dist_info: DistInfo) -> int:
    """This process's training batches in an epoch, from the same samplers the loaders draw with: whole
    batches of its share of the set (timm's --aug-repeats and --balanced-sampler orders included), or of
    the streamed split's per-rank quota."""
    batch = job.data.batch_size
    if isinstance(train.samples, StreamedShards):
        return per_rank_samples(len(train.samples), dist_info.world_size, batch, "the streamed split") // batch
    if job.data.balanced_sampler:
        sampler = balanced_sampler(train, job.run.seed, job.augment, dist_info)
    else:
        sampler = train_sampler(len(train), job.run.seed, job.augment.aug_repeats, dist_info)
    return len(sampler.order) // batch


def schedule_length(job: TrainJob, lr: float, updates_per_epoch: int) -> int:
    """The epochs timm's scheduler takes for these options, asked of timm itself on a one-weight optimizer
    (its rules for warm-up prefix, cycles and cool-down are timm's to keep)."""
    probe = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    return recipe.build_scheduler(probe, job.optim, updates_per_epoch, job.run.eval_metric, job.run.seed)[1]

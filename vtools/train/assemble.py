"""Assembling a training run from its options: data sources, loaders, and the recipe's components.

train.py and the bench's train loop both build their run here, so the bench
measures exactly what train.py runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.layers import convert_sync_batchnorm
from timm.task import LogitDistillationTask

from vtools.data.balanced_sampling import BalancedEpochSampler
from vtools.data.datasets import refuse_known_bad
from vtools.data.decode import bad_image_handler
from vtools.data.loaders import DeviceLoader, KeptBatches, eval_device_loader, make_loader
from vtools.data.memory_estimate import LoaderUse, check_host_memory
from vtools.data.readers.folder import read_class_map, resolve_split_dir
from vtools.data.readers.registry import Source, SourceRequest, open_source
from vtools.data.readers.wds_stream import StreamedShards
from vtools.data.sampling import EpochSampler, SeededSamples
from vtools.data.stream_batches import StreamOrder, stream_loader
from vtools.data.train_augment import fuse
from vtools.data.transforms import data_config_for, eval_transform, image_mode
from vtools.derived_options import mixup_requested, model_in_chans, preprocess_overrides, timm_model_kwargs
from vtools.errors import UsageError
from vtools.evaluation.model_flags import check_input_mode
from vtools.models.activation_memory import activation_bytes_per_image, training_state_bytes
from vtools.models.create import create_model
from vtools.models.prepare import use_channels_last
from vtools.options.train_job import (
    AugmentOptions,
    DataOptions,
    DistillOptions,
    DistributedOptions,
    ModelOptions,
    TrainJob,
)
from vtools.runtime.compiler import compile_for
from vtools.runtime.cpu_budget import ranks_on_this_host
from vtools.runtime.device import kind_of
from vtools.runtime.distributed import DistInfo, ShardSampler
from vtools.train import recipe
from vtools.train.class_weights import class_counts, class_weights_for, rare_classes_note
from vtools.train.loop import TrainComponents

# a training set's decoded images (split among its loader processes) and a validation set's batches are
# kept in host memory when they fit in these sizes
KEEP_TRAINING_BYTES = 512 << 20
KEEP_VALIDATION_BYTES = 512 << 20


def build_datasets(data: DataOptions) -> tuple[Source, Source, list[str] | None]:
    """Training and validation sources (whatever stores them) and the class names."""

    def request(split: str, class_map: dict[str, int] | None = None) -> SourceRequest:
        return SourceRequest.for_split(data, data.data_dir or "", split, class_map)

    if not data.dataset:
        root = data.data_dir
        if resolve_split_dir(root, data.train_split) == resolve_split_dir(root, data.val_split):
            raise UsageError(f"{root}: no separate {data.train_split} and {data.val_split} folders found")
    given_map = read_class_map(data.class_map) if data.class_map else None
    train = open_source(request(data.train_split, given_map))
    class_map = given_map or ({name: index for index, name in enumerate(train.classes)} if not data.dataset else None)
    val = open_source(request(data.val_split, class_map))
    for source in (train, val):
        refuse_known_bad(source.samples, data.on_bad_image)
    return train, val, train.classes


def build_model(
    options: ModelOptions, num_classes: int, device: torch.device, dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """The model to train, built as timm's train.py builds it: dropout, drop-path (--drop-connect is its
    old name), DropBlock, BatchNorm settings, --pretrained-path with its classifier adapted, classifier
    init, gradient checkpointing, and --model-dtype."""
    overlay = {"file": options.pretrained_path, "num_classes": -1} if options.pretrained_path else None
    model = create_model(
        options.model,
        pretrained=options.pretrained or bool(options.pretrained_path),
        num_classes=num_classes,
        in_chans=model_in_chans(options),
        model_kwargs=timm_model_kwargs(options),
        drop_rate=options.drop,
        drop_path_rate=options.drop_path if options.drop_path is not None else options.drop_connect,
        drop_block_rate=options.drop_block,
        bn_momentum=options.bn_momentum,
        bn_eps=options.bn_eps,
        pretrained_cfg_overlay=overlay,
        checkpoint=options.initial_checkpoint or None,
        device=device,
    )
    if options.head_init_scale is not None or options.head_init_bias is not None:
        init_head(model, options.head_init_scale, options.head_init_bias)
    if options.grad_checkpointing:
        model.set_grad_checkpointing(enable=True)
    if dtype is not None:
        model.to(dtype=dtype)
    return model


def init_head(model: torch.nn.Module, scale: float | None, bias: float | None) -> None:
    """--head-init-scale multiplies the classifier's weight and bias; --head-init-bias then sets the bias."""
    head = model.get_classifier()
    if not isinstance(head, torch.nn.Linear):
        raise UsageError(
            f"--head-init-scale/--head-init-bias need a linear classifier; this model's is {type(head).__name__}"
        )
    with torch.no_grad():
        if scale is not None:
            head.weight.mul_(scale)
            if head.bias is not None:
                head.bias.mul_(scale)
        if bias is not None and head.bias is not None:
            head.bias.fill_(bias)


@dataclass
class Loaders:
    train: DeviceLoader
    val: DeviceLoader
    sampler: EpochSampler | BalancedEpochSampler | StreamOrder  # StreamOrder: shards streamed from a server
    data_config: dict[str, Any]
    channels_last: bool

    def updates_per_epoch(self, grad_accum_steps: int) -> int:
        """Optimizer updates in an epoch: its batches over --grad-accum-steps, a last short group counting."""
        return (len(self.train) + grad_accum_steps - 1) // grad_accum_steps


def train_sampler(length: int, seed: int, aug_repeats: float, dist_info: DistInfo) -> EpochSampler:
    """This rank's share of each epoch's seeded order (``aug_repeats``: timm's repeated order)."""
    return EpochSampler(length, seed, dist_info.rank, dist_info.world_size, repeats=aug_repeats)


def balanced_sampler(source: Source, seed: int, augment: AugmentOptions, dist_info: DistInfo) -> BalancedEpochSampler:
    """--balanced-sampler: this rank's share of each epoch's draw by inverse class frequency."""
    labels = source.samples.labels
    if labels is None:
        raise UsageError(
            f"--balanced-sampler needs every training label before training, which {source.description} does "
            "not give (class folders do); use --class-weights FILE instead"
        )
    if augment.aug_repeats:
        raise UsageError("--balanced-sampler and --aug-repeats each choose the epoch's order: give one of them")
    return BalancedEpochSampler(np.asarray(labels), seed, dist_info.rank, dist_info.world_size)


def class_balance(
    augment: AugmentOptions, data: DataOptions, source: Source, classes: list[str], say: Callable[[str], None]
) -> torch.Tensor | None:
    """The loss's class weights (--class-weights; None without it), and the start line naming the rare
    classes when the loss or the sampler balances them."""
    labels = None if source.samples.labels is None else np.asarray(source.samples.labels)
    if labels is not None and (augment.class_weights or data.balanced_sampler):
        what = " and ".join(
            part
            for part, on in (
                (f"class weights ({Path(augment.class_weights).name})", augment.class_weights),
                ("balanced sampler", data.balanced_sampler),
            )
            if on
        )
        note = rare_classes_note(class_counts(labels, len(classes)), classes, what)
        if note:
            say(note)
    if not augment.class_weights:
        return None
    weights = class_weights_for(augment.class_weights, labels, classes, source.description)
    return torch.tensor(weights, dtype=torch.float32)


def fit_batch_to_set(
    batch_size: int, augment: AugmentOptions, seed: int, train_samples: int, dist_info: DistInfo
) -> tuple[int, str]:
    """A training set smaller than one batch trains in batches of the whole set (each process's share): an
    epoch drops its last partial batch, as timm's does, so --batch-size 128 on 7 images would make no
    update at all. Returns the batch size to train with (the caller records it in the job, config.yaml
    and the checkpoint, so a resume and ``train.py -c config.yaml`` agree) and the line that says so;
    ``(batch_size, '')`` when it fits."""
    available = len(train_sampler(train_samples, seed, augment.aug_repeats, dist_info).order)
    if available >= batch_size:
        return batch_size, ""
    pairs = mixup_requested(augment)
    size = available - available % 2 if pairs else available
    where = " per process" if dist_info.world_size > 1 else ""
    if size < 1:
        raise UsageError(
            f"--batch-size {batch_size}: the training set has {available} image(s){where}, too few for "
            f"{'a batch of pairs (--mixup/--cutmix)' if pairs else 'a batch'}"
        )
    note = (
        f"--batch-size {batch_size} is more than the {available} training images{where}: training in batches "
        f"of {size} (one update per epoch); give --batch-size to choose another size"
    )
    return size, note


def validation_sampler(length: int, dist_info: DistInfo) -> ShardSampler:
    """This rank's share of the validation set: every sample on exactly one rank."""
    return ShardSampler(length, dist_info.rank, dist_info.world_size)


def build_loaders(
    job: TrainJob,
    model: torch.nn.Module,
    train_source: Any,
    val_source: Any,
    device: torch.device,
    dist_info: DistInfo,
    workers: int,
    dtype: torch.dtype | None = None,
    keep_decoded: bool = True,
    channels_last: bool | None = None,
) -> Loaders:
    """Training batches (seeded order and augmentation) and exact-once validation batches, on the device
    (in ``dtype``, --model-dtype, when given). ``keep_decoded=False`` never keeps decoded images for later
    epochs, as for a set too large to fit (the bench's loader ceiling measures ImageNet's case so).
    ``channels_last``: the run plan's layout (vtools/train/plan.py); None decides it here the same way."""
    data, seed = job.data, job.run.seed
    data_config = data_config_for(model, preprocess_overrides(job.model))
    mode = data.input_img_mode or image_mode(data_config)
    check_input_mode(mode, data_config)
    keep = KEEP_TRAINING_BYTES // max(1, workers) if keep_decoded else 0  # each loader process keeps its own
    augment = recipe.build_train_transform(job.augment, data_config)
    transform = fuse(augment, mode, kind_of(device.type).computes_on_host) or augment
    check_training_memory(data, model, train_source, val_source, data_config, device, workers)
    if channels_last is None:
        channels_last = use_channels_last(job.model.channels_last, model, device)
    batches: Any
    if isinstance(train_source.samples, StreamedShards):
        if data.balanced_sampler:
            raise UsageError("--balanced-sampler needs indexed data; shards from a server are read as a stream")
        if job.augment.aug_repeats:
            raise UsageError("--aug-repeats needs indexed data; shards from a server are read as a stream")
        batches = stream_loader(
            train_source.samples,
            transform,
            mode,
            data.batch_size,
            device,
            workers,
            seed,
            dist_info.rank,
            dist_info.world_size,
            training=True,
            shuffle_size=data.wds_shuffle_size,
            replace_bad=data.on_bad_image == "skip",
        )
        sampler = batches.sampler
    else:
        train_set = SeededSamples(
            train_source.images(transform, mode, keep), seed, replace_bad=data.on_bad_image == "skip"
        )
        sampler = (
            balanced_sampler(train_source, seed, job.augment, dist_info)
            if data.balanced_sampler
            else train_sampler(len(train_set), seed, job.augment.aug_repeats, dist_info)
        )
        if len(sampler.order) < data.batch_size:
            raise UsageError(
                f"--batch-size {data.batch_size} is larger than the {len(sampler.order)} training images per process"
            )
        batches = make_loader(train_set, data.batch_size, device, workers, sampler=sampler, drop_last=True, seed=seed)
    train_loader = DeviceLoader(
        batches,
        device,
        data_config["mean"],
        data_config["std"],
        channels_last=channels_last,
        batch_transform=recipe.build_random_erasing(job.augment, device),
        on_bad=bad_image_handler(data.on_bad_image, [], keep_batches_full=True, during="training"),
        dtype=dtype,
    )
    val_batch_size = data.validation_batch_size or data.batch_size
    if isinstance(val_source.samples, StreamedShards):
        val_loader = stream_eval_loader(
            val_source.samples,
            data_config,
            mode,
            val_batch_size,
            device,
            workers,
            seed,
            dist_info,
            channels_last,
            data,
            dtype,
        )
        return Loaders(train_loader, val_loader, sampler, data_config, channels_last)
    val_loader = eval_device_loader(
        val_source.images(eval_transform(data_config), mode),
        val_batch_size,
        device,
        workers,
        data_config,
        channels_last,
        bad_image_handler(data.on_bad_image, [], during="validation"),
        sampler=validation_sampler(len(val_source), dist_info),
        persistent=True,
        keep_bytes=KEEP_VALIDATION_BYTES if keep_decoded else 0,
        dtype=dtype,
    )
    return Loaders(train_loader, val_loader, sampler, data_config, channels_last)


def stream_eval_loader(
    store: StreamedShards,
    data_config: dict[str, Any],
    mode: str,
    batch_size: int,
    device: torch.device,
    workers: int,
    seed: int,
    dist_info: DistInfo,
    channels_last: bool,
    data: DataOptions,
    dtype: torch.dtype | None = None,
) -> DeviceLoader:
    """Validation over shards from a server: each rank streams its shards in order, every sample once;
    the batches are kept in host memory when they fit, so later epochs do not fetch them again."""
    batches = stream_loader(
        store,
        eval_transform(data_config),
        mode,
        batch_size,
        device,
        workers,
        seed,
        dist_info.rank,
        dist_info.world_size,
        training=False,
    )
    return DeviceLoader(
        KeptBatches(batches, KEEP_VALIDATION_BYTES),  # type: ignore[arg-type]
        device,
        data_config["mean"],
        data_config["std"],
        channels_last=channels_last,
        on_bad=bad_image_handler(data.on_bad_image, [], during="validation"),
        dtype=dtype,
    )


def check_training_memory(
    data: DataOptions,
    model: torch.nn.Module,
    train_source: Any,
    val_source: Any,
    data_config: dict[str, Any],
    device: torch.device,
    workers: int,
) -> None:
    """Refuse a run whose training and validation batches (both loaders keep workers) cannot fit in the
    host's memory, before either loader starts; every rank on the host needs as much."""
    val_batch = data.validation_batch_size if data.validation_batch_size not in (None, data.batch_size) else None
    check_host_memory(
        [
            LoaderUse("training", data_config, train_source.samples, training=True),
            LoaderUse("validation", data_config, val_source.samples, batch_size=val_batch),
        ],
        data.batch_size,
        device,
        workers,
        lambda: activation_bytes_per_image(model, data_config["input_size"], training=True),
        weights_state=training_state_bytes(model),
        ranks_on_host=ranks_on_this_host()[1],
    )


def build_components(
    job: TrainJob,
    model: torch.nn.Module,
    loaders: Loaders,
    num_classes: int,
    device: torch.device,
    amp: Any,
    dist_info: DistInfo,
    dtype: torch.dtype | None = None,
    class_weights: torch.Tensor | None = None,
    multi_label: bool = False,
    planned: tuple[float, int] | None = None,
) -> tuple[TrainComponents, float, int]:
    """Layout, sync BN, optimizer, schedule, loss, mixup, EMA and GradScaler for this run, the learning
    rate, and the number of epochs to train (timm's: warmup prefix and cool-down included);
    ``class_weights`` (--class-weights) weight the loss's classes; ``multi_label``: multi-hot targets;
    ``planned``: the run plan's peak rate and updates per epoch (vtools/train/plan.py), which the optimizer
    and the schedule take; None (a recipe built alone, as parity's) decides both here the same way."""
    if loaders.channels_last:
        model.to(memory_format=torch.channels_last)
    optim = job.optim
    if dist_info.enabled and job.distributed.sync_bn:
        model = convert_sync_batchnorm(model)
    if planned is not None:
        lr, updates_per_epoch = planned
    else:
        lr = recipe.scaled_lr(optim, job.data.batch_size * optim.grad_accum_steps * dist_info.world_size)
        updates_per_epoch = loaders.updates_per_epoch(optim.grad_accum_steps)
    optimizer = recipe.build_optimizer(model, optim, lr)
    mixup = recipe.build_mixup(job.augment, num_classes, multi_label)
    scheduler, num_epochs = recipe.build_scheduler(
        optimizer, optim, updates_per_epoch, job.run.eval_metric, job.run.seed
    )
    loss_fn = recipe.build_train_loss(job.augment, mixup is not None, class_weights, multi_label).to(device)
    parts = TrainComponents(
        model=model,
        optimizer=optimizer,
        loss_fn=loss_fn,
        amp=amp,
        device=device,
        scaler=amp.grad_scaler(),
        scheduler=scheduler,
        mixup=mixup,
        ema=recipe.build_ema(model, optim),
        clip_grad=optim.clip_grad,
        clip_mode=optim.clip_mode,
        grad_accum_steps=optim.grad_accum_steps,
        task=build_distillation(job.distill, model_in_chans(job.model), model, loss_fn, device, dtype),
        synchronize_step=optim.synchronize_step,
    )
    return parts, lr, num_epochs


def build_distillation(
    distill: DistillOptions,
    in_chans: int | None,
    student: torch.nn.Module,
    loss_fn: torch.nn.Module,
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> LogitDistillationTask | None:
    """timm's logit distillation task for --kd-model-name (None without one). The teacher comes through
    vtools' model loading (model folders, hub names, safe weights) with its own classifier, frozen and in
    eval mode; it is rebuilt on resume, never saved in checkpoints. A teacher with other classes than the
    student is refused: timm would give it a new, random classifier, whose logits teach nothing."""
    if not distill.kd_model_name:
        return None
    teacher = create_model(
        distill.kd_model_name, pretrained=True, in_chans=in_chans, device=device, flag="--kd-model-name"
    )
    if teacher.num_classes != student.num_classes:
        raise UsageError(
            f"--kd-model-name {distill.kd_model_name} predicts {teacher.num_classes} classes and the student "
            f"{student.num_classes}: its classifier would be replaced by a random one, which teaches nothing; "
            f"distill from a teacher trained on these {student.num_classes} classes (e.g. a run's model folder)"
        )
    if dtype is not None:
        teacher.to(dtype=dtype)
    teacher.eval().requires_grad_(False)
    return LogitDistillationTask(
        student_model=student,
        teacher_model=teacher,
        criterion=loss_fn,
        loss_type=distill.kd_loss_type,
        distill_loss_weight=distill.distill_loss_weight,
        task_loss_weight=distill.task_loss_weight,
        temperature=distill.kd_temperature,
        device=device,
        dtype=dtype,
        verbose=False,
    )


def wrap_for_speed(
    parts: TrainComponents,
    model_options: ModelOptions,
    distributed: DistributedOptions,
    device: torch.device,
    dist_info: DistInfo,
) -> None:
    """DDP across processes, then torch.compile, once the weights are final (after resume)."""
    if dist_info.enabled:
        ddp_ids = [device.index] if device.type != "cpu" else None
        parts.model = torch.nn.parallel.DistributedDataParallel(
            parts.model, device_ids=ddp_ids, broadcast_buffers=not distributed.no_ddp_bb
        )
    if model_options.torchcompile:
        parts.model = compile_for(device, parts.model, model_options.torchcompile, model_options.torchcompile_mode)
    if parts.task is not None:
        parts.task.trainable_module = parts.model  # the task's student forward goes through DDP / compile

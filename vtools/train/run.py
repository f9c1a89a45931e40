"""A training run as verbs a reader can follow: set up, start, train an epoch, validate it, save it, stop
on a signal, finish.

commands/train.py calls them in this order and prints what they return, as torchvision's reference
script keeps ``train_one_epoch``, ``evaluate`` and ``main`` apart. What watches the run from above this
layer (TensorBoard, the profiler, the data-wait advice) is handed in as plain callables, so the verbs
stay the same for any caller. :func:`set_up` takes the typed :class:`~vtools.options.train_job.TrainJob` the
command built; the verbs read the few values of :class:`EpochSettings`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from timm.utils import distribute_bn

from vtools.data.readers.registry import Source
from vtools.data.readers.wds_stream import StreamLost
from vtools.data.transforms import data_config_for
from vtools.derived_options import model_in_chans, preprocess_overrides, timm_model_kwargs
from vtools.errors import RunFailed, UsageError
from vtools.evaluation.loops import EvalResult, evaluate
from vtools.evaluation.multilabel_eval import ScoreLog, scored
from vtools.evaluation.predictions import PredictionLog
from vtools.models.create import create_model
from vtools.models.prepare import unwrap
from vtools.options.train_job import ModelOptions, TrainJob
from vtools.outputs import Output, prove_writable
from vtools.run_events import LogPoint
from vtools.runtime import device as dev
from vtools.runtime.attempt_store import under_agent_store
from vtools.runtime.distributed import DistInfo, computed_by_main
from vtools.runtime.resolve import Runtime
from vtools.train import recipe
from vtools.train.assemble import (
    Loaders,
    build_components,
    build_datasets,
    build_loaders,
    build_model,
    class_balance,
    fit_batch_to_set,
    wrap_for_speed,
)
from vtools.train.checkpoint import CheckpointManager, load_training_state
from vtools.train.early_stop import EarlyStop, early_stop_of
from vtools.train.loop import (
    EpochResult,
    StopRequest,
    TrainComponents,
    UpdatePoint,
    alone,
    train_one_epoch,
)
from vtools.train.plan import RunPlan, plan_run
from vtools.train.recovery import PROGRESS_NAME, ProgressMark, RecoverySchedule, recovery_saver
from vtools.train.resume import (
    Position,
    RunFolder,
    SavedOptions,
    accumulation_keeping,
    carry_best_checkpoint,
    experiment_changes,
    global_batch,
    read_summary,
    restore,
    start_at_epoch,
    training_state,
)
from vtools.train.run_clock import RunClock
from vtools.train.run_files import (
    MODEL_DIR,
    SUMMARY,
    export_best,
    output_names,
    summary_row,
    write_eval_report,
    write_summary,
)
from vtools.train.run_lock import FolderClaim

Say = Callable[[str], None]


@dataclass(frozen=True)
class EpochSettings:
    """The options the epoch verbs read; the rest shaped the components at set-up."""

    val_interval: int
    log_interval: int
    batch_size: int  # after fit_batch_to_set: the size the run trains with
    mixup_off_epoch: int
    eval_metric: str
    threshold: float  # multi-label data: where a class counts as predicted
    dist_bn: str
    sync_bn: bool
    ema_force_cpu: bool

    @classmethod
    def of(cls, job: TrainJob) -> EpochSettings:
        return cls(
            val_interval=job.run.val_interval,
            log_interval=job.logging.log_interval,
            batch_size=job.data.batch_size,
            mixup_off_epoch=job.augment.mixup_off_epoch,
            eval_metric=job.run.eval_metric,
            threshold=job.run.threshold,
            dist_bn=job.distributed.dist_bn,
            sync_bn=job.distributed.sync_bn,
            ema_force_cpu=job.optim.model_ema_force_cpu,
        )


@dataclass(frozen=True)
class TrainingData:
    """The run's sources and the classes its model predicts."""

    train: Source
    val: Source
    classes: list[str]
    num_classes: int

    @property
    def multi_label(self) -> bool:
        """Whether each image carries a set of classes (multi-hot targets, scored by mAP)."""
        return self.train.samples.label_sets is not None


@dataclass(frozen=True)
class SavedEpoch:
    """An epoch's summary.csv row, whether it is the run's best (known on rank 0 only), and its validation
    figures (a multi-label run's with its mAP)."""

    row: dict[str, Any]
    best: bool
    metrics: EvalResult | None


@dataclass(frozen=True)
class Exported:
    """The best weights as a model folder, the files in it this run did not write, and the best epoch."""

    folder: Path
    others: list[str]
    best_metric: float
    best_epoch: int


@dataclass
class TrainingRun:
    """Everything the epochs share, and the verbs that move the run on."""

    settings: EpochSettings
    plan: RunPlan
    data: TrainingData
    parts: TrainComponents
    loaders: Loaders
    manager: CheckpointManager
    claim: FolderClaim
    dist_info: DistInfo
    num_epochs: int
    position: Position  # where this process begins
    decode_during_validation: bool  # the next epoch's decoding starts before validation (an accelerator)
    checkpoint_state: Callable[[Position, EpochResult | None], dict[str, Any] | None]
    empty_model: Callable[[], torch.nn.Module]  # the architecture again, for the best weights' export
    resume_path: Path | None = None  # the checkpoint this process continues
    num_updates: int = 0
    summary_rows: list[dict[str, Any]] = field(default_factory=list)
    clock: RunClock | None = None
    recovery: RecoverySchedule | None = None  # --recovery-interval (None: off)
    early_stop: EarlyStop | None = None  # --early-stop-patience (None: off)
    stopped_early: str = ""  # why the run stopped before its last epoch (every rank), once it has

    @property
    def resumed(self) -> bool:
        return self.resume_path is not None

    def validates(self, epoch: int) -> bool:
        return (epoch + 1) % self.settings.val_interval == 0 or epoch + 1 == self.num_epochs

    def epochs(self) -> range:
        return range(self.position.epoch, self.num_epochs)

    def continues(self, epoch: int, result: EpochResult) -> bool:
        """Whether another epoch follows this one."""
        return epoch + 1 < self.num_epochs and not result.interrupted

    def start(self) -> None:
        """Carry the summary.csv rows of the epochs before this process's first (a damaged file stops the
        run here) and start the run's clock."""
        self.summary_rows = read_summary(self.claim.folder, self.resume_path, self.position.epoch)
        self.num_updates = self.position.num_updates
        self.clock = RunClock(
            self.num_epochs,
            len(self.loaders.train),  # batches per epoch; the first log step reports the exact count
            self.validates,
            first=(self.position.epoch, self.position.step),
        )
        if self.recovery is not None:
            self.recovery.restart_clock()

    def train_epoch(
        self,
        epoch: int,
        stop: StopRequest,
        batches: Callable[[Iterable], Iterable] = lambda loader: loader,
        on_log: Callable[[LogPoint], None] | None = None,
    ) -> EpochResult:
        """Train ``epoch`` (from the resumed step in the first), until a stop is agreed; ``batches`` wraps
        the loader (the profiler)."""
        settings, loaders = self.settings, self.loaders
        if self.parts.mixup is not None and settings.mixup_off_epoch and epoch >= settings.mixup_off_epoch:
            self.parts.mixup = None
        resuming = epoch == self.position.epoch
        first_step = self.position.step if resuming else 0
        if not loaders.train.started:
            loaders.sampler.set_epoch(epoch, skip_samples=first_step * settings.batch_size)
        if self.validates(epoch):
            loaders.val.start()  # its workers decode the validation set while this epoch trains
        self.clock.epoch_started()
        result, self.num_updates = train_one_epoch(
            self.parts,
            batches(loaders.train),
            epoch,
            self.num_updates,
            settings.log_interval,
            stop,
            show_progress=self.dist_info.is_main,
            start_step=first_step,
            carried=self.position.carried if resuming else (0.0, 0),
            on_log=self.marking_progress(on_log),
            after_update=self.recovery_saver(),
        )
        result.epoch_samples = (self.position.samples_before if resuming else 0) + result.samples
        self.clock.epoch_trained(result.seconds, result.steps)
        if not result.interrupted:
            share_batchnorm_statistics(
                self.parts, self.dist_info, settings.dist_bn, settings.sync_bn, settings.ema_force_cpu
            )
        if self.continues(epoch, result) and self.decode_during_validation:
            start_epoch(loaders, epoch + 1)  # its first batches are decoded while the device validates
        return result

    def validate_epoch(
        self, epoch: int, result: EpochResult, stop: StopRequest
    ) -> tuple[EvalResult | None, PredictionLog | ScoreLog]:
        """The epoch's validation figures and predictions (multi-label data: scores); no figures where
        --val-interval skips it, it was interrupted, or a signal stopped the validation."""
        predictions = ScoreLog() if self.data.multi_label else PredictionLog()
        if not self.validates(epoch) or result.interrupted:
            return None, predictions
        try:
            metrics = evaluate(
                eval_model(self.parts, self.dist_info, self.settings.ema_force_cpu),
                self.loaders.val,
                self.parts.device,
                self.parts.amp,
                desc=f"validate {epoch}",
                show_progress=self.dist_info.is_main,
                should_stop=None if self.dist_info.enabled else (lambda: stop.requested),
                on_logits=predictions.add,
            )
        except StreamLost as lost:  # validation shards from a server: resumable, as a signal during validation
            result.lost = alone(lost)
            return None, predictions
        return metrics, predictions

    def stopped_within(self, epoch: int, result: EpochResult, metrics: EvalResult | None) -> bool:
        """Whether a signal stopped the epoch mid-training or mid-validation."""
        return result.interrupted or (self.validates(epoch) and metrics is None)

    def recovery_saver(self) -> Callable[[UpdatePoint], None] | None:
        """What takes the run's recovery checkpoints after an update (None without --recovery-interval)."""
        if self.recovery is None:
            return None
        return recovery_saver(self.recovery, self.checkpoint_state, self.manager, self.dist_info.is_main)

    def marking_progress(self, on_log: Callable[[LogPoint], None] | None) -> Callable[[LogPoint], None] | None:
        """``on_log``, and with recovery checkpoints on, rank 0 notes the log step's update count first
        (:class:`~vtools.train.recovery.ProgressMark`)."""
        if self.recovery is None or not self.dist_info.is_main:
            return on_log
        mark = ProgressMark(self.claim.folder)

        def log(point: LogPoint) -> None:
            path = self.claim.folder / PROGRESS_NAME
            if self.claim.owns(PROGRESS_NAME):  # never over a file of the user's
                self.claim.wrote(path, created=not path.exists())
                mark.write(point.epoch, point.step, point.num_updates)
            if on_log is not None:
                on_log(point)

        return log

    def save_interrupted(self, epoch: int, result: EpochResult, stop: StopRequest) -> Path | None:
        """A resumable checkpoint at the step the stop came after (its path on rank 0; every rank must
        call this, then wait for the others before leaving)."""
        where = Position(epoch, result.completed_steps, self.num_updates)
        state = self.checkpoint_state(where, result)
        if not self.dist_info.is_main:
            return None
        with stop.shielded():
            return self.manager.save_interrupted(state)

    def save_epoch(
        self,
        epoch: int,
        result: EpochResult,
        metrics: EvalResult | None,
        predictions: PredictionLog | ScoreLog,
        stop: StopRequest,
    ) -> SavedEpoch:
        """Step the schedule and save the finished epoch: its summary.csv row, its checkpoint and, for a new
        best, its class report (an epoch is committed whole: a failure before its checkpoint leaves the previous
        one, which a resume continues). A diverged epoch ends the run before it is saved."""
        check_finite(epoch, metrics, self.parts.model)
        if metrics is not None:
            self.clock.validated(metrics.seconds)
        names = output_names(self.data.classes, self.data.num_classes)
        gathered: Any = None
        if metrics is not None and isinstance(predictions, ScoreLog):  # every rank scores every rank's samples
            metrics, gathered = scored(
                metrics, predictions.gather(self.parts.device, len(names)), self.settings.threshold, names
            )
        elif metrics is not None:
            gathered = predictions.gather(self.parts.device)  # every rank's samples
        if self.continues(epoch, result) and not self.loaders.train.started:
            start_epoch(self.loaders, epoch + 1)  # validated on the host's cores: decode during the checkpoint
        lr_used = recipe.mean_lr(self.parts.optimizer)  # before the step: the rate this epoch trained with
        metric = getattr(metrics, self.settings.eval_metric) if metrics is not None else None
        if self.parts.scheduler is not None:
            self.parts.scheduler.step(epoch + 1, metric)  # as timm: after validation, fed its metric
        state = self.checkpoint_state(Position(epoch + 1, 0, self.num_updates), None)
        self.summary_rows.append(summary_row(epoch, result, metrics, lr_used, self.data.multi_label))
        best = False
        if self.dist_info.is_main:
            with stop.shielded():
                # the row before the checkpoint: a checkpoint must never record an epoch whose row is lost (a
                # resume drops a row its checkpoint does not reach, and trains that epoch again)
                write_summary(self.claim, self.summary_rows)
                best = self.manager.save(state, epoch, metric)
                if best and gathered is not None:
                    write_eval_report(self.claim, gathered, names, self.data.val, epoch)
        return SavedEpoch(self.summary_rows[-1], best, metrics)

    def stops_after(self, epoch: int, stop: StopRequest) -> bool:
        """Whether the ranks agree to stop after this saved epoch (a signal during its validation or its
        save); once its checkpoint is whole. After the last epoch the run finishes its files instead."""
        if stop.agreed() and epoch + 1 < self.num_epochs:
            self.manager.wait()
            return True
        return False

    def stops_early(self) -> bool:
        """Whether --early-stop-patience ends the run after the epochs saved so far (a resumed run's carried
        rows count: it remembers how long it has waited). Rank 0 holds every row, so its verdict goes to
        every rank, and no rank trains on alone; once the last checkpoint is whole."""
        rule = self.early_stop
        if rule is None:
            return False
        self.stopped_early = computed_by_main(lambda: rule.verdict(self.summary_rows, self.num_epochs)) or ""
        if self.stopped_early:
            self.manager.wait()
        return bool(self.stopped_early)

    def epochs_trained(self) -> int:
        """The epochs this process saved (a resumed run's carried rows are those before its first)."""
        return sum(int(row["epoch"]) >= self.position.epoch for row in self.summary_rows)

    def finish(self) -> Exported | None:
        """After the last epoch: the last checkpoint whole on disk, then (rank 0) the best weights as a
        model folder."""
        self.manager.wait()  # the last checkpoint is whole (or its failure raised) before best is read
        if not self.dist_info.is_main:
            return None
        folder = self.claim.folder
        self.claim.wrote(folder / MODEL_DIR, created=not (folder / MODEL_DIR).exists())
        use_ema = ema_on_device(self.parts, self.settings.ema_force_cpu) is not None
        exported, others = export_best(
            self.empty_model(), folder, self.data.classes, self.loaders.data_config, use_ema, self.data.multi_label
        )
        return Exported(exported, others, self.manager.best_metric, self.manager.best_epoch)


def set_up(
    job: TrainJob,
    folder: RunFolder,
    runtime: Runtime,
    dist_info: DistInfo,
    claim: FolderClaim,
    say: Say,
) -> TrainingRun:
    """Build the run as timm's train.py does (data, model, loaders, recipe) and restore a resumed one; its
    batch size is fitted to a tiny set here (``settings.batch_size`` is the size it trains with). Notes are
    said as set-up reaches them, so those before a refusal still show."""
    device = runtime.device
    resume_state = load_training_state(folder.resume) if folder.resume else None
    if folder.note:
        say(folder.note)
    if dist_info.is_main:
        prove_writable(Output("--output", folder.path / SUMMARY))
    dev.seed_everything(job.run.seed + dist_info.rank)
    data, batch_size = open_data(job, dist_info, say)
    eval_metric = multi_label_metric(job, data, say)
    job = replace(job, data=replace(job.data, batch_size=batch_size), run=replace(job.run, eval_metric=eval_metric))
    if resume_state is not None:
        job, elastic = keep_global_batch(job, resume_state, dist_info, say)
        check_same_experiment(
            resume_state,
            folder.resume,
            SavedOptions.of(job),
            job.optim.epochs,
            data.classes,
            len(data.train),
            dist_info,
            say,
            elastic,
        )
    class_weights = class_balance(job.augment, job.data, data.train, data.classes, say)
    model = build_model(job.model, data.num_classes, device, runtime.model_dtype)
    img_size = int(data_config_for(model, preprocess_overrides(job.model))["input_size"][-1])
    plan = plan_run(job, runtime, model, img_size, data.train, dist_info)
    loaders = build_loaders(
        job,
        model,
        data.train,
        data.val,
        device,
        dist_info,
        runtime.budget.workers,
        runtime.model_dtype,
        channels_last=plan.channels_last,
    )
    parts, _, _ = build_components(
        job,
        model,
        loaders,
        data.num_classes,
        device,
        runtime.amp,
        dist_info,
        runtime.model_dtype,
        class_weights,
        data.multi_label,
        planned=(plan.lr, plan.updates_per_epoch),
    )
    manager = CheckpointManager(
        folder.path,
        keep=job.run.checkpoint_hist,
        higher_is_better=job.run.eval_metric != "loss",
        on_write=lambda path: claim.wrote(path, created=not path.exists(), keep=True),
        keep_recovery=job.run.recovery_keep,
        wrote_here=lambda name: name in claim.ledger,  # never prune a file a run did not write
    )
    position = resume_position(job, resume_state, folder, parts, manager, loaders, dist_info, say)
    wrap_for_speed(parts, job.model, job.distributed, device, dist_info)
    if dist_info.is_main:
        carry_best_checkpoint(folder.resume, manager)
    return TrainingRun(
        EpochSettings.of(job),
        plan,
        data,
        parts,
        loaders,
        manager,
        claim,
        dist_info,
        plan.num_epochs,
        position,
        decode_during_validation=runtime.budget.decode_during_validation,
        checkpoint_state=checkpoint_recorder(job.values(), parts, data, loaders, dist_info),
        empty_model=lambda: architecture(job.model, data.num_classes),
        resume_path=folder.resume,
        recovery=RecoverySchedule.of(job.run.recovery_interval, stop_check_every(job, dist_info), device),
        early_stop=early_stop_of(job.run.eval_metric, job.run.early_stop_patience, job.run.early_stop_min_delta),
    )


def multi_label_metric(job: TrainJob, data: TrainingData, say: Say) -> str:
    """The --eval-metric the run keeps its best epoch by: multi-label data has no top-k, so map; single-label
    data has no mAP. Refuses the balancing that needs single labels on multi-label data."""
    metric = job.run.eval_metric
    if not data.multi_label:
        if metric == "map":
            raise UsageError(
                f"--eval-metric map needs multi-label data; {data.train.description} has one label per image"
            )
        return metric
    for flag, on in (("--class-weights", job.augment.class_weights), ("--balanced-sampler", job.data.balanced_sampler)):
        if on:
            raise UsageError(f"{flag} balances single-label classes; {data.train.description} is multi-label")
    if metric in ("top1", "top5"):
        say(f"multi-label data: the best epoch is the one with the highest mAP (--eval-metric map, not {metric})")
        return "map"
    return metric


def stop_check_every(job: TrainJob, dist_info: DistInfo) -> int:
    """How many updates pass between the ranks' agreements (on a stop signal, on a time-form recovery
    checkpoint): every update for one process, every log step under torchrun."""
    return job.logging.log_interval if dist_info.enabled else 1


def resume_position(
    job: TrainJob,
    state: dict[str, Any] | None,
    folder: RunFolder,
    parts: TrainComponents,
    manager: CheckpointManager,
    loaders: Loaders,
    dist_info: DistInfo,
    say: Say,
) -> Position:
    """Where this process begins: the resumed checkpoint's step (its state restored into ``parts``), or
    --start-epoch, or the start."""
    position = Position()
    if state is not None:
        position, note = restore(
            state,
            parts,
            manager,
            parts.device,
            dist_info,
            job.run.seed,
            job.data.batch_size,
            resume_optimizer=not job.run.no_resume_opt,
        )
        note += ProgressMark(folder.resume.parent).redone_note(position.num_updates)
        say(f"resumed from {folder.resume} at epoch {position.epoch}, step {position.step}{note}")
    if job.run.start_epoch is not None:
        updates_per_epoch = loaders.updates_per_epoch(job.optim.grad_accum_steps)
        position = start_at_epoch(parts, job.run.start_epoch, updates_per_epoch, job.optim.sched_on_updates)
    return position


def checkpoint_recorder(
    options: Mapping[str, Any], parts: TrainComponents, data: TrainingData, loaders: Loaders, dist_info: DistInfo
) -> Callable[[Position, EpochResult | None], dict[str, Any] | None]:
    """The run's state at a position, as its checkpoints hold it (with every option: a resume and
    validate.py --checkpoint read them); every rank calls it, rank 0 gets the state."""

    def record(where: Position, result: EpochResult | None) -> dict[str, Any] | None:
        return training_state(
            options, parts, where, data.classes, parts.device, dist_info, loaders.data_config, result, len(data.train)
        )

    return record


def architecture(options: ModelOptions, num_classes: int) -> torch.nn.Module:
    """The run's model built again without weights, for the best weights' export."""
    return create_model(
        options.model,
        pretrained=False,
        num_classes=num_classes,
        in_chans=model_in_chans(options),
        model_kwargs=timm_model_kwargs(options),
        bn_eps=options.bn_eps,
    )


def open_data(job: TrainJob, dist_info: DistInfo, say: Say) -> tuple[TrainingData, int]:
    """The training and validation sources and the classes, and the batch size fitted to a tiny set."""
    train_source, val_source, classes = build_datasets(job.data)
    num_classes = job.model.num_classes
    if not classes and not num_classes:
        raise UsageError(f"--dataset {job.data.dataset} does not name its classes: pass --num-classes")
    num_classes = num_classes or len(classes)
    check_labels_fit(train_source, classes, num_classes)
    if classes and num_classes > len(classes):
        say(
            f"--num-classes {num_classes} is more than the {len(classes)} classes of {train_source.description}: "
            f"outputs {len(classes)}-{num_classes - 1} have no images and are named by their index in the class "
            "report; leave --num-classes out to train one output per class"
        )
    check_same_label_kind(train_source, val_source)
    batch_size, batch_note = fit_batch_to_set(
        job.data.batch_size, job.augment, job.run.seed, len(train_source), dist_info
    )
    if batch_note:
        say(batch_note)
    classes = classes or [str(label) for label in range(num_classes)]
    return TrainingData(train_source, val_source, classes, num_classes), batch_size


def check_same_label_kind(train: Source, val: Source) -> None:
    """Both splits multi-label (over the same classes) or neither: a model trained on class sets cannot be
    scored by top-k, nor one trained on single labels by mAP."""
    kinds = [source.samples.label_sets for source in (train, val)]
    if (kinds[0] is None) != (kinds[1] is None):
        multi, single = (train, val) if kinds[0] is not None else (val, train)
        raise UsageError(
            f"{multi.description} is multi-label but {single.description} has one label per image: give both "
            "splits a labels file (labels.csv or labels.json), or neither"
        )
    if kinds[0] is not None and kinds[0].num_classes != kinds[1].num_classes:  # both are, after the check above
        raise UsageError(
            f"{train.description} has {kinds[0].num_classes} classes but {val.description} has "
            f"{kinds[1].num_classes}: the splits must name the same classes"
        )


def check_labels_fit(source: Source, classes: list[str] | None, num_classes: int) -> None:
    """Every training label must be one of the model's outputs: fewer --num-classes than the set has
    classes would fail inside the loss, mid-epoch."""
    top = source.highest_label(classes or [])
    if top >= num_classes:
        raise UsageError(
            f"--num-classes {num_classes} is fewer than the {top + 1} classes of {source.description}; leave "
            f"--num-classes out (it defaults to the class count) or give at least {top + 1}"
        )


def keep_global_batch(job: TrainJob, state: dict[str, Any], dist_info: DistInfo, say: Say) -> tuple[TrainJob, bool]:
    """A torchrun job continued with --resume auto on another number of processes (an elastic membership
    change, a restart on fewer nodes) keeps its global batch by accumulating more (or fewer) steps per
    update, and says so; where no whole number of steps keeps it, it goes on with the new global batch
    and says that. Returns the job and whether the global batch may differ from the checkpoint's (an elastic
    change). Any other resume is compared as it is."""
    if job.run.resume != "auto" or not under_agent_store() or state.get("world_size") in (None, dist_info.world_size):
        return job, False
    before, accum = global_batch(state), job.optim.grad_accum_steps
    kept = accumulation_keeping(state, job.data.batch_size, dist_info.world_size, accum)
    change = f"torchrun continues the run on {dist_info.world_size} process(es) instead of {state['world_size']}"
    if kept is not None:
        say(f"{change}: --grad-accum-steps {accum} -> {kept} keeps its global batch of {before}")
        return replace(job, optim=replace(job.optim, grad_accum_steps=kept)), True
    now = job.data.batch_size * dist_info.world_size * accum
    if now != before:
        say(f"{change}: the global batch is {now} (it was {before}; no whole --grad-accum-steps keeps it)")
    return job, True


def check_same_experiment(
    state: dict[str, Any],
    path: Path,
    options: SavedOptions,
    epochs: int,
    classes: list[str],
    train_samples: int,
    dist_info: DistInfo,
    say: Say,
    elastic: bool = False,
) -> None:
    """A resume continues the checkpoint's experiment or stops in one line naming what differs: what the
    start line, config.yaml and summary.csv show must be what the resumed run uses (an elastic change of
    the process count has said its change of global batch already)."""
    changes = experiment_changes(state, options, classes, train_samples, dist_info.world_size, elastic)
    if changes:
        raise UsageError(
            f"--resume {path}: this command line changes the run it continues ({'; '.join(changes)}); resume "
            f"with the run's options (its config.yaml), or start a new run from its weights with "
            f"--initial-checkpoint {path}"
        )
    saved = state.get("args") or {}
    if saved.get("epochs") not in (None, epochs):
        say(
            f"--epochs {epochs} (the run had {saved['epochs']}): the schedule is the one for {epochs} "
            "epochs from here on"
        )


def start_epoch(loaders: Loaders, epoch: int) -> None:
    """Have the workers start decoding ``epoch``'s batches now, ahead of its first step."""
    loaders.sampler.set_epoch(epoch)
    loaders.train.start()


def check_finite(epoch: int, metrics: EvalResult | None, model: torch.nn.Module) -> None:
    """A diverged epoch ends the run (exit 3) before it is saved, so it can never become best: its eval
    loss and every weight and buffer must be finite (one check per epoch, one host sync)."""
    tensors = [t for t in unwrap(model).state_dict().values() if t.is_floating_point()]
    weights_finite = bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()) if tensors else True
    loss_finite = metrics is None or not metrics.overflowed
    if not (weights_finite and loss_finite):
        what = (
            "the weights hold non-finite values" if not weights_finite else f"the eval loss {metrics.overflow_words()}"
        )
        raise RunFailed(
            f"epoch {epoch}: {what}: training diverged; the epoch is not saved (lower --lr, raise "
            "--warmup-epochs, or use --clip-grad), and the previous checkpoint is intact"
        )


def share_batchnorm_statistics(
    parts: TrainComponents, dist_info: DistInfo, dist_bn: str, sync_bn: bool, ema_force_cpu: bool
) -> None:
    """--dist-bn after an epoch under DDP, as timm's train.py: BatchNorm running statistics averaged over
    the ranks (``reduce``) or rank 0's everywhere (``broadcast``), in the model and in an EMA on the
    device. Off with --sync-bn, whose statistics are already shared."""
    if not dist_info.enabled or not dist_bn or sync_bn:
        return
    for model in (unwrap(parts.model), ema_on_device(parts, ema_force_cpu)):
        if model is not None:
            distribute_bn(model, dist_info.world_size, reduce=dist_bn == "reduce")


def ema_on_device(parts: TrainComponents, force_cpu: bool) -> torch.nn.Module | None:
    """The EMA weights that validation uses: none without --model-ema, or with --model-ema-force-cpu
    (timm validates the trained weights then)."""
    if parts.ema is None or force_cpu:
        return None
    return parts.ema.module


def eval_model(parts: TrainComponents, dist_info: DistInfo, ema_force_cpu: bool) -> torch.nn.Module:
    """The EMA weights when tracked on the device; never the DDP wrapper: its forward may broadcast
    buffers, a collective that shards differing by one batch could not match."""
    if (ema := ema_on_device(parts, ema_force_cpu)) is not None:
        return ema
    return unwrap(parts.model) if dist_info.enabled else parts.model

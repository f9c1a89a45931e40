"""One training epoch, the same on every device: autocast, GradScaler, accumulation, clipping, EMA.

The hot loop never waits for the device except at log steps: losses are kept
in a device-side window and checked for non-finite values there, which still
names the exact step where training broke. On a chip that saturates (no inf to
find, vtools/runtime/overflow.py) the window also keeps, per step, whether the
chip's float-status flag rose in the forward pass.
"""

from __future__ import annotations

import errno
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from timm.utils import dispatch_clip_grad

from vtools.data.loaders import STOP_SIGNALS
from vtools.data.readers.wds_stream import StreamLost
from vtools.errors import RunFailed
from vtools.models.prepare import unwrap
from vtools.progress import progress
from vtools.run_events import LogPoint
from vtools.runtime import device as dev
from vtools.runtime.amp import AmpPolicy
from vtools.runtime.distributed import all_reduce_sum, any_rank
from vtools.runtime.overflow import FloatStatusFlag, float_status_flag
from vtools.train.recipe import clip_parameters


class StopRequest:
    """Turns SIGINT/SIGTERM/SIGHUP into a flag the loop checks between updates, so it can checkpoint first.

    Under torchrun the ranks may see a signal at different moments (or only one
    rank may get it), so they decide together: every ``check_every`` updates one
    all-reduce tells every rank whether any rank was asked to stop, and all of
    them stop after the same update. A single process stops at the next update.
    """

    def __init__(self, device: torch.device | None = None, check_every: int = 1) -> None:
        self.signal_name: str | None = None
        self.device = device or torch.device("cpu")
        self.check_every = max(1, check_every)
        self._previous: dict[int, Any] = {}
        self._shielded = False
        self._signalled = False  # this process got a signal itself (not only another rank's, by agreement)
        self._streams: tuple[Any, Any] | None = None

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is not threading.main_thread():  # vtools.fit() from a thread
            print(
                "stop signals: not handled (Python lets only the main thread install handlers): Ctrl-C or SIGTERM "
                "end this run without a last checkpoint",
                file=sys.stderr,
                flush=True,
            )
            return self
        for sig in STOP_SIGNALS:
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # started under nohup: a closing terminal must not stop the run
            self._previous[sig] = signal.signal(sig, self._handle)
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = SurvivesHangUp(sys.stdout), SurvivesHangUp(sys.stderr)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._streams:
            sys.stdout, sys.stderr = self._streams

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """A process's first signal asks for a checkpoint, even when another rank's stop was agreed before
        it arrived (a batch system signals the ranks at different moments); its second stops it now."""
        if self._signalled and not self._shielded:  # a second signal: stop now, same code
            print(
                f"{signal.Signals(signum).name} again: stopping without waiting for a checkpoint",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(exit_code(self.signal_name))
        if signum == signal.SIGHUP:
            leave_hung_up_terminal()
        self._signalled = True
        self.signal_name = self.signal_name or signal.Signals(signum).name

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """While a checkpoint is written, further signals only note themselves: the save finishes."""
        self._shielded = True
        try:
            yield
        finally:
            self._shielded = False

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def agreed(self, num_updates: int | None = None) -> bool:
        """Whether every rank stops after update ``num_updates`` (always False between check points), or,
        without one, at this point that every rank reaches (after validation)."""
        if num_updates is not None and num_updates % self.check_every:
            return False
        stop = any_rank(self.requested, self.device)
        if stop and self.signal_name is None:
            self.signal_name = "SIGTERM"  # another rank's signal: leave as it would
        return stop


def leave_hung_up_terminal() -> None:
    """Send stdout and stderr to /dev/null where they are a terminal that hung up: every write there fails
    (EIO), and the progress bar's next one would end the run before it saves its checkpoint. Streams
    that go to a file or pipe (a log) keep their output."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                os.write(fd, b"")  # a hung-up terminal refuses even an empty write; a live one takes it
            except OSError as err:
                if err.errno == errno.EIO:
                    os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class SurvivesHangUp:
    """A text stream whose writes outlive a terminal that hung up. The kernel fails writes to a closed
    terminal (EIO) at once, while the SIGHUP it sends runs its Python handler only at the main thread's
    next instruction: a print or a progress-bar refresh in between would end the run with a traceback
    (exit 1) before it saves its checkpoint. Such a write sends the terminal's streams to /dev/null, as
    the handler does, and is dropped; everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as err:
            if err.errno != errno.EIO:
                raise
            leave_hung_up_terminal()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            if err.errno != errno.EIO:
                raise
            leave_hung_up_terminal()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def exit_code(signal_name: str | None) -> int:
    """128 + the signal's number, as a shell reports a process a signal ended: 129 SIGHUP, 130 SIGINT,
    143 SIGTERM."""
    return 128 + int(getattr(signal, signal_name or "SIGTERM"))


@dataclass
class TrainComponents:
    """What an epoch needs, built once by train.py."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: torch.nn.Module
    amp: AmpPolicy
    device: torch.device
    scaler: torch.amp.GradScaler | None = None
    scheduler: Any = None
    mixup: Callable | None = None
    ema: Any = None
    clip_grad: float | None = None
    clip_mode: str = "norm"
    grad_accum_steps: int = 1
    task: Any = None  # a timm TrainingTask (distillation) computing the loss from the student ``model``
    synchronize_step: bool = False  # --synchronize-step: wait for the device after each update

    def loss(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch: the task's (distillation), else the loss of the model's output."""
        if self.task is not None:
            return self.task(images, targets)["loss"]
        return self.loss_fn(self.model(images), targets)


@dataclass(frozen=True)
class UpdatePoint:
    """Where the epoch stands after an update, for a recovery checkpoint: the steps done (counted from the
    epoch's start), the run's update count, and this rank's loss sum (on the device: reading it waits for
    the device, which only a checkpoint needs; a copy, as the loop goes on adding to its own) and sample
    count over the epoch so far."""

    epoch: int
    completed_steps: int
    num_updates: int
    loss_sum: torch.Tensor
    samples: int

    def so_far(self) -> EpochResult:
        """This rank's share of the epoch up to this update, as a mid-epoch checkpoint records it."""
        return EpochResult(
            loss=0.0,
            samples=0,
            seconds=0.0,
            data_seconds=0.0,
            steps=0,
            skipped_updates=0,
            completed_steps=self.completed_steps,
            local_loss_sum=float(self.loss_sum),
            local_samples=self.samples,
        )


@dataclass
class EpochResult:
    loss: float
    samples: int
    seconds: float
    data_seconds: float
    steps: int
    skipped_updates: int
    interrupted: bool = False
    completed_steps: int = 0
    local_loss_sum: float = 0.0  # this rank's share of the epoch so far, carried over a mid-epoch resume
    local_samples: int = 0
    epoch_samples: int = 0  # every process's samples of the epoch, those before a resume included (set by the run)
    lost: str = ""  # why a streamed shard could not be read (a resumable stop), '' otherwise

    @property
    def images_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def data_wait(self) -> float:
        """Fraction of the epoch spent waiting for the next batch."""
        return self.data_seconds / self.seconds if self.seconds else 0.0


def _check_finite(
    window: torch.Tensor,
    filled: int,
    epoch: int,
    first_step: int,
    advice: str,
    saturated: torch.Tensor | None = None,
) -> None:
    """One device sync per log step: find the first loss in the window that overflowed, if any: non-finite, or
    (on a chip that saturates) computed by a forward pass that raised the float-status flag (``saturated``).
    ``advice``: what to try, for the run's precision (:meth:`AmpPolicy.non_finite_advice`)."""
    values = window[:filled]
    bad = ~torch.isfinite(values)
    if saturated is not None:
        bad |= saturated[:filled]
    where = bad.nonzero()
    if where.numel():
        index = int(where[0, 0])
        value = values[index].item()
        how = (
            f"it became {value}"
            if not math.isfinite(value)
            else f"the chip saturates: its float-status flag rose in the forward pass, and the loss read {value:.6g}"
        )
        raise RunFailed(
            f"training stopped: the loss overflowed at epoch {epoch} step {first_step + index} ({how}); {advice}"
        )


def alone(lost: StreamLost) -> str:
    """A lost stream's line, where this process can save a checkpoint by itself. Under torchrun the others
    are inside a collective this one will not join: it ends the job (exit 3) instead, and ``--resume auto``
    continues from the newest checkpoint."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise RunFailed(
            f"{lost}; under torchrun the other processes cannot stop with this one: continue with --resume auto "
            "from the newest checkpoint (--recovery-interval keeps it close)"
        ) from None
    return str(lost)


def accumulation_divisor(step: int, total_steps: int, accum: int) -> int:
    """How many batches the update that ``step`` belongs to averages over: ``accum``, except in an
    epoch's last, shorter group, which averages over its real size (as timm's train.py does)."""
    last_group = total_steps % accum
    return last_group if last_group and step >= total_steps - last_group else accum


def train_one_epoch(
    parts: TrainComponents,
    loader: Iterable,
    epoch: int,
    num_updates: int,
    log_interval: int = 50,
    stop: StopRequest | None = None,
    show_progress: bool = True,
    start_step: int = 0,
    carried: tuple[float, int] = (0.0, 0),
    on_log: Callable[[LogPoint], None] | None = None,
    after_update: Callable[[UpdatePoint], None] | None = None,
) -> tuple[EpochResult, int]:
    """Train for one epoch (or until a stop is agreed at an update boundary).

    ``start_step`` and ``carried`` (this rank's loss sum and sample count before
    the interruption) continue an epoch that a checkpoint interrupted, so its
    loss still covers the whole epoch. ``on_log`` receives each log step's figures;
    ``after_update`` is told of every update but the epoch's last (whose checkpoint
    the epoch's end writes).
    """
    model, device, accum = parts.model, parts.device, max(1, parts.grad_accum_steps)
    model.train()
    total_steps = start_step + len(loader)
    window = torch.zeros(max(1, log_interval), device=device)
    status = float_status_flag(device, parts.amp.overflow)  # a saturating chip's: whether a forward overflowed
    saturated = torch.zeros(len(window), dtype=torch.bool, device=device) if status is not None else None
    loss_sum = torch.full((), float(carried[0]), device=device)
    skipped = torch.zeros((), device=device, dtype=torch.int64)
    samples, filled, window_start, data_seconds = 0, 0, start_step, 0.0
    start = last_fetch = time.perf_counter()
    bar = progress(loader, f"epoch {epoch}", total=len(loader), enabled=show_progress)
    step = start_step - 1
    interrupted, lost = False, ""
    at_update = (step, loss_sum.clone(), 0)  # where a lost stream rolls back to: the last update
    batches = enumerate(bar, start=start_step)
    while True:
        try:
            step, batch = next(batches)
        except StopIteration:
            break
        except StreamLost as err:  # shards from a server: the server went away; stop where it can resume
            interrupted, lost = True, alone(err)
            step, loss_sum, samples = at_update[0], at_update[1], at_update[2]
            break
        data_seconds += time.perf_counter() - last_fetch
        images, targets = batch.images, batch.targets
        if parts.mixup is not None:
            images, targets = parts.mixup(images, targets)
        is_update = (step + 1) % accum == 0 or step + 1 == total_steps
        sync_context = model.no_sync() if hasattr(model, "no_sync") and not is_update else nullcontext()
        if status is not None:
            _lower_before_forward(status, parts.scaler)
        with sync_context:
            with parts.amp.autocast():
                loss = parts.loss(images, targets)
            if status is not None:
                saturated[filled] = status.raised()
            scaled = loss / accumulation_divisor(step, total_steps, accum)
            (parts.scaler.scale(scaled) if parts.scaler is not None else scaled).backward()
        if is_update:
            skipped += _optimizer_step(parts)
            num_updates += 1
            if parts.ema is not None:
                parts.ema.update(unwrap(model), step=num_updates)
            if parts.scheduler is not None:
                parts.scheduler.step_update(num_updates=num_updates)
            if parts.synchronize_step:
                dev.synchronize(device)
        detached = loss.detach().float()
        window[filled] = detached
        loss_sum += detached * len(targets)
        samples += len(targets)
        filled += 1
        if filled == len(window) or step + 1 == total_steps:
            _check_finite(window, filled, epoch, window_start, parts.amp.non_finite_advice(), saturated)
            window_loss, lr = window[:filled].mean().item(), parts.optimizer.param_groups[0]["lr"]
            elapsed = time.perf_counter() - start
            images_per_second = samples / elapsed
            bar.set_postfix(loss=f"{window_loss:.4f}", lr=f"{lr:.3g}", img_s=f"{images_per_second:.1f}")
            if on_log is not None:
                point = (epoch, step + 1, total_steps, start_step, num_updates, window_loss, lr, images_per_second)
                on_log(LogPoint(*point, data_seconds / elapsed))
            filled, window_start = 0, step + 1
        if is_update and accum > 1:
            at_update = (step, loss_sum.clone(), samples)
        elif is_update:
            at_update = (step, loss_sum, samples)  # every step is an update: nothing to roll back
        if after_update is not None and is_update and step + 1 < total_steps:
            after_update(UpdatePoint(epoch, step + 1, num_updates, loss_sum.clone(), samples + carried[1]))
        if stop is not None and is_update and stop.agreed(num_updates):
            interrupted = True
            break
        last_fetch = time.perf_counter()
    if filled:
        _check_finite(window, filled, epoch, window_start, parts.amp.non_finite_advice(), saturated)
    local = torch.stack(
        [loss_sum, loss_sum.new_tensor(float(samples + carried[1])), loss_sum.new_tensor(float(samples))]
    )
    local_loss_sum, local_samples, _ = local.tolist()
    loss_total, samples_total, samples_now = all_reduce_sum(local).tolist()
    seconds = time.perf_counter() - start
    return EpochResult(
        loss=loss_total / max(samples_total, 1.0),
        samples=int(samples_now),
        seconds=seconds,
        data_seconds=data_seconds,
        steps=step + 1 - start_step,
        skipped_updates=int(skipped.item()),
        interrupted=interrupted,
        completed_steps=step + 1,
        local_loss_sum=local_loss_sum,
        local_samples=int(local_samples),
        lost=lost,
    ), num_updates


def _lower_before_forward(status: FloatStatusFlag, scaler: torch.amp.GradScaler | None) -> None:
    """Lower the flag so that a rise shows this forward pass's own overflow, not one from before it (an
    evaluation, the update, the next batch's normalisation). An overflow of the update in progress (an earlier
    micro-batch's backward) is handed to the scaler first, which still owes it a skipped step."""
    hold = getattr(scaler, "hold_flag", None)
    if hold is not None:
        hold(status)
    status.clear()


def _optimizer_step(parts: TrainComponents) -> torch.Tensor:
    """Clip, step and zero the gradients; returns 1 (on the device) when a GradScaler skipped the step."""
    scaler = parts.scaler
    if scaler is not None and parts.clip_grad:
        scaler.unscale_(parts.optimizer)
    if parts.clip_grad:
        parameters = clip_parameters(unwrap(parts.model), parts.clip_mode)
        dispatch_clip_grad(parameters, value=parts.clip_grad, mode=parts.clip_mode)
    if scaler is None:
        parts.optimizer.step()
        parts.optimizer.zero_grad(set_to_none=True)
        return torch.zeros((), dtype=torch.int64, device=parts.device)
    # the scale stays on the device (get_scale() would wait for it); a GradScaler torch disabled has none
    scale_before = scaler._scale.clone() if scaler.is_enabled() and scaler._scale is not None else None
    scaler.step(parts.optimizer)
    scaler.update()
    parts.optimizer.zero_grad(set_to_none=True)
    if scale_before is None:
        return torch.zeros((), dtype=torch.int64, device=parts.device)
    return (scaler._scale < scale_before).to(torch.int64).reshape(())

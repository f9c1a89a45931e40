"""A run a person can follow from its log file: progress lines with the whole run's ETA, epoch durations.

On a terminal tqdm draws a bar; in a batch job's or torchrun's log there is
none, so every log step becomes one line instead: a timestamp, epoch k/N, the
step, loss, lr, img/s, the time so far and the estimated time to the end of
the run. The estimate is this process's measured seconds per training step
times the steps left, plus the mean validation time times the validations
left (a resumed run measures afresh).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from vtools.run_events import LogPoint


def clock_text(seconds: float) -> str:
    """h:mm:ss."""
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class RunClock:
    """The run's elapsed time and ETA; ``lines`` says whether log steps are printed as lines."""

    def __init__(
        self,
        epochs: int,
        steps_per_epoch: int,
        validates: Callable[[int], bool],
        first: tuple[int, int] = (0, 0),
        lines: bool | None = None,
    ) -> None:
        """``first``: the epoch and step this process begins at (a resumed epoch's earlier steps were
        not timed here)."""
        self.epochs = epochs
        self._first_epoch, self._first_step = first
        self.steps_per_epoch = steps_per_epoch
        self.validates = validates
        self.lines = (not sys.stderr.isatty()) if lines is None else lines  # no bar: lines instead
        self.started = time.perf_counter()
        self._train_seconds = 0.0  # completed epochs, this process
        self._train_steps = 0
        self._eval_seconds: list[float] = []
        self._epoch_started = self.started

    def epoch_started(self) -> None:
        self._epoch_started = time.perf_counter()

    def epoch_trained(self, seconds: float, steps: int) -> None:
        self._train_seconds += seconds
        self._train_steps += steps

    def validated(self, seconds: float) -> None:
        self._eval_seconds.append(seconds)

    @property
    def since_epoch_start(self) -> float:
        return time.perf_counter() - self._epoch_started

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def eta(self, epoch: int, step: int, validated_this_epoch: bool = False) -> float | None:
        """Seconds to the end of the run from step ``step`` of ``epoch`` (None before a step is timed)."""
        done_now = step - (self._first_step if epoch == self._first_epoch else 0)
        seconds = self._train_seconds + (time.perf_counter() - self._epoch_started if done_now > 0 else 0.0)
        steps = self._train_steps + max(done_now, 0)
        if steps == 0:
            return None
        left = (self.steps_per_epoch - step) + (self.epochs - epoch - 1) * self.steps_per_epoch
        validations = sum(self.validates(e) for e in range(epoch, self.epochs)) - validated_this_epoch
        mean_eval = sum(self._eval_seconds) / len(self._eval_seconds) if self._eval_seconds else 0.0
        return seconds / steps * left + validations * mean_eval

    def step_line(self, point: LogPoint) -> str | None:
        """The log line of a log step, or None where a progress bar shows it."""
        self.steps_per_epoch = point.steps
        if not self.lines:
            return None
        eta = self.eta(point.epoch, point.step)
        return (
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} epoch {point.epoch} ({point.epoch + 1} of {self.epochs}) step "
            f"{point.step}/{point.steps} loss {point.loss:.4f} lr {point.lr:.3g} {point.images_per_second:.1f} img/s "
            f"elapsed {clock_text(self.elapsed)} ETA {clock_text(eta) if eta is not None else '?'}"
        )

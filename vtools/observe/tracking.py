"""Experiment trackers (TensorBoard, W&B, MLflow) that never fail a run, nor keep it waiting past a bounded start.

Each tracker runs behind a queue on a thread of its own: the training loop only hands over figures
that are already on the host (a log step's, an epoch's summary.csv row), so a tracker adds no device
sync and no network wait to a step. Its start is bounded: a tracker that has not started within
``start_seconds`` is given up with one warning line, as is one whose call fails (a missing package,
an unreachable or dead server, a full disk). The run trains on; its last line says what was not
logged. Everything a tracker is sent after it failed is counted, never retried: a tracker's history
is the run's up to the failure, never a history with holes in it.

The run folder keeps the run's tracking id (``tracking.json``), so that ``--resume`` continues the
same W&B run and the same MLflow run.
"""

from __future__ import annotations

import importlib
import json
import queue
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vtools.atomic import atomic_write_text
from vtools.optional import TRACK
from vtools.options.shared import TrackingFlags
from vtools.run_events import ClaimedFolder, LogPoint, RunEnd

TRACKING_FILE = "tracking.json"
START_SECONDS = 60.0  # a tracker not started by then is given up (W&B's and MLflow's own timeouts are set below it)
END_SECONDS = 60.0  # the longest the run's end waits for a tracker to take what it was sent
AT_START = "the start"  # where a tracker that never started failed, whenever it was found out
AT_END = "the run's end"  # where the run is when the trackers are sent its end
KIND_NAMES = {  # what a tracker is sent: the name of its call, and how a line counts the ones not logged
    "step": "log step(s)",
    "epoch": "epoch row(s)",
    "result": "validation result(s)",
    "end": "the run's end (summary, tables, artifacts)",
}


@dataclass(frozen=True)
class TrackedRun:
    """What a training run's tracker is told about the run when it starts."""

    name: str  # the run folder's name
    folder: Path
    tracking_id: str  # the folder's id: W&B's run id, the MLflow run's tag vtools.run_id ('' if none resumes)
    resumed: bool
    options: dict[str, Any]  # the resolved options, as config.yaml holds them
    tags: dict[str, str]  # model, dataset, device
    claim: ClaimedFolder | None = None  # the folder's ledger (None: what a tracker writes there is not entered)
    start_seconds: float = START_SECONDS  # how long its start may take

    def writes(self, name: str) -> Path:
        """``folder/name``, entered in the run folder's ledger before a tracker writes there, so that the
        run's clean-up, its last line and the output guard know it as the run's."""
        path = self.folder / name
        if self.claim is not None:
            self.claim.wrote(path, created=not path.exists())
        return path


@dataclass(frozen=True)
class ValidationRun:
    """What a validation's tracker is told when it starts (validate.py has no run folder)."""

    options: dict[str, Any]  # the command's options, as the tracker's params
    tags: dict[str, str]  # dataset, device


class Tracker(Protocol):
    """One experiment tracker. Its calls run on the tracker's own thread and may raise anything. A tracker
    of validation runs has ``result(row)`` instead of ``step`` and ``epoch``."""

    name: str  # TensorBoard, W&B, MLflow
    where: str  # where the run is logged, known before the start (no network)

    def start(self) -> None: ...

    def step(self, point: LogPoint) -> None: ...

    def epoch(self, row: dict[str, Any]) -> None: ...

    def end(self, end: RunEnd) -> None: ...


TRACKING_INSTALL = TRACK


@dataclass(frozen=True)
class TrackerEntry:
    """One tracker as the commands know it (vtools/observe/run_trackers.py lists them): its name, the option
    fields that ask for it and configure it, and how train.py and validate.py build it from those options."""

    name: str
    flags: tuple[str, ...]  # its option fields (TrackingFlags); the first asks for it
    training: Callable[[TrackingFlags, TrackedRun], Tracker] | None = None  # train.py's (job.tracking); None: none
    validation: Callable[[TrackingFlags, ValidationRun], Tracker] | None = None  # validate.py's; None: none
    resumes: bool = False  # --resume continues its run, found by the folder's tracking id (tracking.json)
    asked: Callable[[TrackingFlags], bool] | None = None  # whether it is asked for, where no flag of its own says

    def wanted(self, options: TrackingFlags) -> bool:
        """Whether a command's options ask for this tracker: its first flag given (a value, or true)."""
        if self.asked is not None:
            return self.asked(options)
        return getattr(options, self.flags[0]) not in (None, False)


def tracker_package(name: str) -> Any:
    """Import a tracker's package (on the tracker's thread); a missing one fails the tracker's start with
    the install command, never the run."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ModuleNotFoundError(f"{err} ({TRACKING_INSTALL})") from None


def step_metrics(point: LogPoint) -> dict[str, float]:
    """A log step's figures as the trackers name them (TensorBoard's step/ names), all on the host already."""
    return {
        "step/loss": point.loss,
        "step/lr": point.lr,
        "step/img_per_sec": point.images_per_second,
        "step/data_wait": point.data_wait,
    }


def epoch_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a summary.csv row, by its column names; empty cells (an epoch not validated) left out."""
    return {
        key: float(value)
        for key, value in row.items()
        if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def failure_text(err: BaseException, limit: int = 300) -> str:
    """An exception in one line: its type and its first line that says something (SQLAlchemy, under MLflow,
    starts some messages with a remark in parentheses: the next line says what failed). A long line keeps
    its start and its end, where a wrapped connection error says why ("Connection refused")."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    said = [line for line in lines if not (line.startswith("(") and line.endswith(")"))]
    text = f"{type(err).__name__}: {(said or lines)[0]}" if lines else type(err).__name__
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


@dataclass
class TrackerFeed:
    """One tracker behind a queue and a daemon thread; the caller's thread waits on it only for its start
    (``wait_started``) and at the run's end (``wait``), each time until a deadline."""

    tracker: Tracker
    start_seconds: float = START_SECONDS
    sent: Counter = field(default_factory=Counter)
    done: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, Any, str] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._failure = ""  # why the tracker was given up ('' while it works)
        self._failed_at = ""  # where the run was then
        self._warned = False
        self._position = AT_START
        self._start_ended = threading.Event()  # set once start() returned or raised
        self._thread = threading.Thread(target=self._work, name=f"tracker {self.tracker.name}", daemon=True)
        self._thread.start()

    @property
    def label(self) -> str:
        return f"{self.tracker.name} ({self.tracker.where})"

    def send(self, kind: str, payload: Any, position: str) -> None:
        """Hand ``payload`` to the tracker's ``kind`` call; ``position`` says where the run is (for a warning)."""
        self._position = position
        self.sent[kind] += 1
        self._queue.put((kind, payload, position))

    def warning(self) -> str | None:
        """The one warning line, the first time it is asked for after the tracker was given up."""
        with self._lock:
            if not self._failure or self._warned:
                return None
            self._warned = True
            if self._failed_at == AT_END:
                return f"warning: {self.label}: the run's end was not logged ({self._failure})"
            return f"warning: {self.label}: not logging from {self._failed_at} on ({self._failure}); the run goes on"

    def finish(self, end: RunEnd) -> None:
        """Send the run's end: the last thing the tracker is sent."""
        self.send("end", end, AT_END)
        self._queue.put(None)

    def wait(self, deadline: float) -> None:
        """Wait (until ``deadline`` on ``time.monotonic``'s clock at most) for the tracker to take what it was
        sent; one that has not by then is given up."""
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            if self._thread.is_alive():
                self._fail("it had not taken everything it was sent by the end of the run's wait for it")

    def missed(self) -> str | None:
        """What was not logged, in one line, or None when everything was."""
        with self._lock:
            missing = [kind for kind in KIND_NAMES if self.sent[kind] > self.done[kind]]
            if not missing:
                return None
            parts = [
                KIND_NAMES[kind] if kind == "end" else f"{self.sent[kind] - self.done[kind]} {KIND_NAMES[kind]}"
                for kind in missing
            ]
            return f"not logged to {self.label}: {', '.join(parts)} ({self._failure}; from {self._failed_at} on)"

    def _fail(self, why: str, position: str | None = None) -> None:
        """Give the tracker up at ``position`` (where the run is now, by default); the lock is held."""
        if not self._failure:
            self._failure, self._failed_at = why, position or self._position

    def wait_started(self, deadline: float) -> None:
        """Wait (until ``deadline`` on ``time.monotonic``'s clock at most) for the start to end; one that has not
        by then is given up."""
        if not self._start_ended.wait(timeout=max(0.0, deadline - time.monotonic())):
            with self._lock:
                self._fail(f"it had not started within {self.start_seconds:g} s", AT_START)

    def _work(self) -> None:
        try:
            self.tracker.start()
        except (Exception, SystemExit) as err:  # a tracker may sys.exit on a bad key: never the run's exit
            with self._lock:
                self._fail(f"could not start: {failure_text(err)}", AT_START)
            return
        finally:
            self._start_ended.set()
        with self._lock:
            if self._failure:  # given up while it started
                return
        while (item := self._queue.get()) is not None:
            kind, payload, position = item
            with self._lock:
                if self._failure:
                    continue
            try:
                getattr(self.tracker, kind)(payload)
            except (Exception, SystemExit) as err:
                with self._lock:
                    self._fail(failure_text(err), position)
                continue
            with self._lock:
                self.done[kind] += 1


class Trackers:
    """The run's trackers (rank 0's; none elsewhere), fed from the training thread.

    They start together, and the command waits for their starts (``start_seconds`` in all) before it goes
    on, for two reasons found the hard way. A start may launch a program (W&B's service, git): a data-loader
    worker forked during the launch inherits the pipe the launch waits on, and hangs it for as long as the
    worker lives. And a start imports its package: a module half-imported on the tracker's thread is seen
    half-made by the main thread (MLflow's import of IPython made matplotlib's curves.png fail the run)."""

    def __init__(self, trackers: list[Tracker], say: Callable[[str], None], start_seconds: float = START_SECONDS):
        self.say = say
        self.start_seconds = start_seconds
        self.feeds = [TrackerFeed(tracker, start_seconds) for tracker in trackers]  # starting now

    def begin(self) -> None:
        """Say where the run is tracked, and wait for the trackers' starts (``start_seconds`` in all)."""
        for feed in self.feeds:
            self.say(f"tracking: {feed.label}")
        deadline = time.monotonic() + self.start_seconds
        for feed in self.feeds:
            feed.wait_started(deadline)
        self.warn()

    def __enter__(self) -> Trackers:
        """A command's tracker scope: says where it tracks now, and on leaving ends the trackers (FAILED
        when an exception leaves) and says what they missed."""
        self.begin()
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        for line in self.close(RunEnd("FINISHED" if kind is None else "FAILED", {})):
            self.say(line)

    def step(self, point: LogPoint) -> None:
        self._send("step", point, f"epoch {point.epoch} step {point.step}")

    def epoch(self, row: dict[str, Any]) -> None:
        self._send("epoch", row, f"epoch {row['epoch']}")

    def result(self, row: dict[str, Any]) -> None:
        """A validation's results row (validate.py)."""
        self._send("result", row, f"the results of {row.get('model', 'a model')}")

    def _send(self, kind: str, payload: Any, position: str) -> None:
        for feed in self.feeds:
            feed.send(kind, payload, position)
        self.warn()

    def warn(self) -> None:
        for feed in self.feeds:
            line = feed.warning()
            if line:
                self.say(line)

    def close(self, end: RunEnd, end_seconds: float = END_SECONDS) -> list[str]:
        """Send the run's end to every tracker and wait for them together (``end_seconds`` in all, not per
        tracker). Returns the warnings not yet said, then a line for each tracker that missed something."""
        deadline = time.monotonic() + end_seconds
        for feed in self.feeds:
            feed.finish(end)
        for feed in self.feeds:
            feed.wait(deadline)
        warnings = [feed.warning() for feed in self.feeds]
        missed = [feed.missed() for feed in self.feeds]
        return [line for line in warnings + missed if line]


def tracking_id(folder: Path, wrote: Callable[[Path, bool], None]) -> str:
    """The run folder's tracking id: the one an earlier process of the run wrote, else a new one (written
    now, before any tracker starts, so that a resume finds it whatever the trackers did)."""
    path = folder / TRACKING_FILE
    try:
        known = json.loads(path.read_text(encoding="utf-8")).get("id")
    except (OSError, ValueError, AttributeError):
        known = None
    if isinstance(known, str) and known:
        return known
    new = secrets.token_hex(8)
    wrote(path, not path.exists())
    atomic_write_text(path, json.dumps({"id": new}) + "\n")
    return new

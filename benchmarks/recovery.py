"""What recovery checkpoints cost a training step, and what a fault still costs with them.

``--recovery-interval N`` promises that a killed run loses at most N updates (2N when the kill lands while
the newest checkpoint is still being written), and that the steps do not wait for the disk: the state is
copied to host memory in the step, then written in the background. This task measures that promise on
train.py's own ``train_one_epoch`` and components, fed one batch already on the device (the cost measured is
the checkpoint's, not the loader's), three ways in one process:

- ``none``: no recovery checkpoints;
- ``recovery``: one every ``--recovery-every`` updates through the run's :class:`CheckpointManager`,
  holding the state a run saves (``checkpoint_recorder``: model, optimizer, schedule, random streams);
- ``slow-disk``: the same, its writer throttled to ``--recovery-slow-disk`` MB/s (each write lasts at
  least its size at that speed), so that a write can outlast the interval and the next step waits.

The ways take turns in stretches of ``--steps`` updates, ``--repeats`` times (a noisy machine slows
all of them alike), on one model and optimizer; each way counts its own updates, starting half an
interval in, so no checkpoint falls on a stretch's last update (``train_one_epoch`` leaves that one to
the epoch's end) and each write has half an interval to finish within its stretch. A write still in
flight when a stretch ends is waited for inside the stretch's time: charged to its way, never to the next.

A fault loses the updates since the newest complete checkpoint, on average half an interval plus the
write that was under way, and then the restart: the process start-up (measured here: imports, data
and model) and reading and restoring the newest checkpoint (from the page cache here: a cold disk reads
slower).
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.onepass import ONEPASS_FLAGS, Repeated, resident_batch
from benchmarks.options import BenchOptions
from vtools.train.checkpoint import CheckpointManager, recovery_files

WAYS = ("none", "recovery", "slow-disk")

MB = 1e6  # state sizes and disk speeds in decimal megabytes, as disks are sold


@dataclass
class TimedCheckpoints(CheckpointManager):
    """The run's checkpoint manager, its background writes timed; with ``bytes_per_second``, a slow
    disk: each recovery write lasts at least its file's size at that speed (the sleep comes after the
    file is complete, which only the steps waiting for it can notice)."""

    bytes_per_second: float | None = None
    write_seconds: list[float] = field(default_factory=list)
    write_cpu_seconds: list[float] = field(default_factory=list)  # the writer thread's own cpu time
    written_bytes: int = 0

    def _write_recovery(self, state: dict[str, Any], name: str) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        super()._write_recovery(state, name)
        if self._failure is not None:
            return
        self.write_cpu_seconds.append(time.thread_time() - cpu)
        self.written_bytes = (self.folder / name).stat().st_size
        if self.bytes_per_second:
            time.sleep(max(0.0, self.written_bytes / self.bytes_per_second - (time.perf_counter() - start)))
        self.write_seconds.append(time.perf_counter() - start)


@dataclass
class Way:
    """One way of training: its checkpoints (None: none), its own update count, and its stretches' seconds
    per update."""

    name: str
    manager: TimedCheckpoints | None
    num_updates: int
    step_seconds: list[float] = field(default_factory=list)
    tail_wait: float = 0.0  # the waits for the write a stretch ended with


def measure_recovery(options: BenchOptions, process_age: Callable[[], float]) -> list[dict[str, Any]]:
    """One row per way (see the module docstring); ``process_age`` tells the seconds this process has run
    (the bench's start-up clock)."""
    from benchmarks.options import train_job
    from vtools.runtime import device as dev
    from vtools.runtime.amp import resolve_amp
    from vtools.runtime.cpu_budget import setup_cpu_budget
    from vtools.runtime.distributed import DistInfo
    from vtools.train import assemble
    from vtools.train.loop import train_one_epoch
    from vtools.train.run import TrainingData, checkpoint_recorder

    device = dev.resolve_device(options.device, options.device_modules or ())
    setup_cpu_budget(device, options.workers)
    amp = resolve_amp(device, options.amp, options.amp_dtype)
    layout = "--channels-last" if options.channels_last else "--no-channels-last"
    flags = [options.data, *ONEPASS_FLAGS, "--model", options.model, "--batch-size", str(options.batch_size), layout]
    job = train_job(flags)
    train_source, val_source, classes = assemble.build_datasets(job.data)
    model = assemble.build_model(job.model, 10, device)  # random init, as train.py builds it
    loaders = assemble.build_loaders(job, model, train_source, val_source, device, DistInfo(), 0)
    parts, _, _ = assemble.build_components(job, model, loaders, 10, device, amp, DistInfo())
    data = TrainingData(train_source, val_source, list(classes or range(10)), 10)
    record = checkpoint_recorder(flat_options(job), parts, data, loaders, DistInfo())
    startup = process_age()
    size = loaders.data_config["input_size"][-1]
    batch = resident_batch(device, options.channels_last, options.batch_size, size)
    every = options.recovery_every

    def stretch(way: Way, steps: int, after_update: Callable[[Any], None] | None) -> float:
        """Seconds of ``steps`` updates of ``way``, its trailing write waited for."""
        dev.synchronize(device)
        start = time.perf_counter()
        batches = Repeated(batch, steps)
        _, way.num_updates = train_one_epoch(
            parts, batches, 0, way.num_updates, log_interval=steps, show_progress=False, after_update=after_update
        )
        if way.manager is not None:
            waiting = time.perf_counter()
            way.manager.wait()
            way.tail_wait += time.perf_counter() - waiting
        dev.synchronize(device)
        return time.perf_counter() - start

    with tempfile.TemporaryDirectory(prefix="vtools-bench-recovery-") as folder:
        ways = [Way(name, _manager(Path(folder), name, options), every // 2) for name in WAYS]
        if options.warmup:
            stretch(ways[0], options.warmup, None)
        for _ in range(options.repeats):
            for way in ways:
                saving = None if way.manager is None else recovery_saver(every, way.manager, record, device)
                way.step_seconds.append(stretch(way, options.steps, saving) / options.steps)
        restore_seconds = _restore_seconds(ways[1].manager, parts, device, options.batch_size)
    base = {
        "task": "recovery",
        "source": "synthetic",
        "model": options.model,
        "device": str(device),
        "amp_dtype": amp.dtype_name,
        "channels_last": options.channels_last,
        "batch_size": options.batch_size,
        "img_size": size,
        "interval": every,
        "updates": options.steps * options.repeats,
        "startup_s": round(startup, 2),
    }
    none_ms = _median_ms(ways[0])
    return [_row(way, base, none_ms, every, startup + restore_seconds) for way in ways]


def flat_options(options: Any) -> dict[str, Any]:
    """The job's options by their flags' names, its nested concerns flattened: the ``args`` a run's
    checkpoints store, less the timm flags train.py only refuses (a few hundred bytes of 90 MB)."""
    values: dict[str, Any] = {}
    for option in dataclasses.fields(options):
        value = getattr(options, option.name)
        values.update(flat_options(value) if dataclasses.is_dataclass(value) else {option.name: value})
    return values


def recovery_saver(
    every: int, manager: CheckpointManager, record: Callable[..., dict[str, Any] | None], device: Any
) -> Callable[[Any], None]:
    """``train_one_epoch``'s ``after_update`` taking a recovery checkpoint as a run does, every ``every``
    updates (one process)."""
    from vtools.train.recovery import RecoverySchedule, recovery_saver

    return recovery_saver(RecoverySchedule.of(every, 1, device), record, manager, is_main=True)


def _manager(folder: Path, way: str, options: BenchOptions) -> TimedCheckpoints | None:
    if way == "none":
        return None
    (folder / way).mkdir()
    slow = options.recovery_slow_disk * MB if way == "slow-disk" else None
    return TimedCheckpoints(folder / way, bytes_per_second=slow)


def _restore_seconds(manager: CheckpointManager | None, parts: Any, device: Any, batch_size: int) -> float:
    """Reading the newest recovery checkpoint and loading it into the model, optimizer and random streams,
    as ``--resume auto`` does (0 when none was taken)."""
    from vtools.runtime.distributed import DistInfo
    from vtools.train.checkpoint import load_training_state
    from vtools.train.resume import restore

    newest = recovery_files(manager.folder)[-1:] if manager is not None else []
    if not newest:
        return 0.0
    start = time.perf_counter()
    restore(load_training_state(newest[0]), parts, manager, device, DistInfo(), 0, batch_size)
    return time.perf_counter() - start


def _median_ms(way: Way) -> float:
    """The median of the way's stretches, in milliseconds per update as the row shows it."""
    return round(1000 * statistics.median(way.step_seconds), 3)


def _row(way: Way, base: dict[str, Any], none_ms: float, every: int, restart: float) -> dict[str, Any]:
    """The way's figures: the median time per update, against the way without checkpoints, and what it
    costs per checkpoint and per fault (computed from the rounded figures the row shows)."""
    step_ms = _median_ms(way)
    step, none = step_ms / 1000, none_ms / 1000
    row = {
        **base,
        "mode": way.name,
        "step_ms": step_ms,
        "steps_ms": " ".join(f"{1000 * s:.3f}" for s in way.step_seconds),
        "overhead_pct": round(100 * (step_ms / none_ms - 1), 2),
        "img_per_sec": round(base["batch_size"] / step, 2),
    }
    manager = way.manager
    if manager is None:
        return row
    stats = manager.recovery
    checkpoints = max(1, stats.count)
    write = statistics.median(manager.write_seconds) if manager.write_seconds else 0.0
    copy = round(stats.copy_seconds / checkpoints, 4)
    wait = round((stats.wait_seconds + way.tail_wait) / checkpoints, 4)
    write_cpu = round(statistics.median(manager.write_cpu_seconds), 4) if manager.write_cpu_seconds else 0.0
    return {
        **row,
        "checkpoints": stats.count,
        "state_mb": round(manager.written_bytes / MB, 2),
        "copy_s": copy,
        "wait_s": wait,
        "write_s": round(write, 4),
        "write_cpu_s": write_cpu,
        # what a checkpoint can take from the steps, measured without the stretches' noise: the copy, the
        # wait, and at most the cpu time the writer takes from them; over an interval without checkpoints
        "cpu_cost_pct": round(100 * (copy + wait + write_cpu) / (every * none), 2),
        "disk_mbps": round(manager.bytes_per_second / MB, 2) if manager.bytes_per_second else None,
        "overhead_s_per_checkpoint": round((step - none) * every, 4),
        # the newest complete checkpoint is on average half an interval and one write behind
        "lost_per_fault_s": round(every * step / 2 + write + restart, 2),
    }

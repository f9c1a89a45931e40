"""``--profile N``: where N steps of a script's real loop spend their time, on the host and the device.

The profiler wraps the loop's loader, so a step is exactly what the script
does between two batches (data wait included) and no loop needs a hook. It
skips the first steps (allocator and autotuning warm-up), records N, writes a
trace that TensorBoard's profiler plugin and Perfetto (ui.perfetto.dev) open,
and prints the top operators by device time (when the device records its own
activity, per the device table) and by host time. A device whose backend has
its own profiler (Ascend's, as the device table names it) is
profiled with that one instead, which writes its own trace folder.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from vtools.runtime import device as dev

WARMUP_STEPS = 2
TOP_OPERATORS = 12


def backend_profiler(device: torch.device) -> tuple[ModuleType, list[Any]] | None:
    """The device's own profiler module (Ascend's, on npu) and its activities, when the table
    names one and it imports; None means torch.profiler."""
    name = dev.kind_of(device.type).profiler_module
    if name is None:
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    activity = module.ProfilerActivity
    return module, [activity.CPU, getattr(activity, device.type.upper())]


def profiler_activities(device: torch.device) -> list[Any]:
    """torch.profiler activities for ``device``: the host's, plus the device's own from the table when this
    torch build can record them."""
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    name = dev.kind_of(device.type).profiler_activity
    activity = getattr(ProfilerActivity, name, None) if name else None
    if activity is not None and activity in torch.profiler.supported_activities():
        activities.append(activity)
    return activities


class StepProfiler:
    """Profile ``steps`` steps of the first loop whose loader goes through :meth:`wrap` (0: off)."""

    def __init__(self, steps: int, device: torch.device, out_dir: Path, label: str, enabled: bool = True) -> None:
        self.steps = steps if enabled else 0
        self.device = device
        self.trace = self.trace_path(out_dir, label)
        self.done = self.steps <= 0
        self.taken = 0  # steps the loop has taken under the profiler

    @staticmethod
    def trace_path(out_dir: Path, label: str) -> Path:
        """Where the trace of ``label`` goes: a command checks it before any work."""
        return out_dir / f"profile-{label}.pt.trace.json"

    def wrap(self, loader: Any) -> Any:
        """The loader itself, or (until one profile is taken) a view of it that steps the profiler."""
        return loader if self.done else _Profiled(loader, self)

    def profile(self, batches: Iterable[Any]) -> Iterator[Any]:
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # Kineto's start-up chatter stays off the console
        own = backend_profiler(self.device)
        module, activities = own if own is not None else (torch.profiler, profiler_activities(self.device))
        ready = self._report if own is None else self._backend_handler(module)
        recorder = module.profile(
            activities=activities,
            on_trace_ready=ready,
            schedule=module.schedule(wait=0, warmup=WARMUP_STEPS, active=self.steps, repeat=1),
        )
        recorder.start()
        try:
            for batch in batches:
                yield batch
                if not self.done:
                    self.taken += 1
                    recorder.step()
        finally:
            if not self.done:  # the loop ended (or failed) before the last profiled step
                self.done = True
                if self.recorded == 0:
                    print(
                        f"--profile {self.steps}: the loop ended after {self.taken} step(s), within the "
                        f"{WARMUP_STEPS} warm-up steps: nothing was recorded (profile a longer loop)",
                        flush=True,
                    )
                recorder.stop()

    @property
    def recorded(self) -> int:
        """Steps recorded so far: those after the warm-up, at most the ones asked for."""
        return min(self.steps, max(0, self.taken - WARMUP_STEPS))

    def _described(self) -> str:
        ended = f" (the loop ended after {self.recorded})" if self.recorded < self.steps else ""
        return f"profile of {self.recorded} steps{ended} after {WARMUP_STEPS} warm-up"

    def _backend_handler(self, module: Any) -> Any:
        """A backend's own profiler writes its own trace folder, which that backend's tools analyse."""
        folder = self.trace.with_name(self.trace.name.removesuffix(".pt.trace.json"))
        write = module.tensorboard_trace_handler(str(folder))

        def handler(recorder: Any) -> None:
            self.done = True
            if self.recorded == 0:
                return
            write(recorder)
            print(
                f"{self._described()} by {module.__name__}: {folder} "
                "(open it with that backend's tools, e.g. MindStudio Insight on Ascend)",
                flush=True,
            )

        return handler

    def _report(self, recorder: Any) -> None:
        self.done = True
        if self.recorded == 0:
            return
        self.trace.parent.mkdir(parents=True, exist_ok=True)
        recorder.export_chrome_trace(str(self.trace))
        averages = recorder.key_averages()
        if len(profiler_activities(self.device)) > 1:
            print(f"top operators by {self.device.type} time:")
            print(averages.table(sort_by="self_device_time_total", row_limit=TOP_OPERATORS))
        print("top operators by host time:")
        print(averages.table(sort_by="self_cpu_time_total", row_limit=TOP_OPERATORS))
        print(
            f"{self._described()}: {self.trace} (open in TensorBoard's profiler or ui.perfetto.dev)",
            flush=True,
        )


class _Profiled:
    """A loader seen through the profiler: same length and dataset, batches stepped."""

    def __init__(self, loader: Any, profiler: StepProfiler) -> None:
        self.loader = loader
        self.profiler = profiler

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        return self.profiler.profile(self.loader)

"""Operators the device backend ran on the host CPU instead of the device, counted from its own words.

A backend with a boxed CPU fallback runs an operator it has no kernel for on CPU copies of its
inputs and says so. Ascend's backend prints, once per operator and process::

    [W... compiler_depend.ts:51] Warning: CAUTION: The operator 'aten::isin.Tensor_Tensor_out' is not
    currently supported on the NPU backend and will fall back to run on the CPU. This may have
    performance implications. (function npu_cpu_fallback)

and its kernels have sentences of their own (unquoted, some naming several overloads at once, some
for arguments the device kernel does not take); the device row's ``host_fallback`` patterns hold every
form Ascend's real wheel has (tests/runtime/test_device_kinds_wheel.py reads them from its library).
It prints them through its own ``c10::WarningHandler`` (its warn macro), i.e. straight to file descriptor 2:
it never reaches Python's ``warnings`` module. MPS and XPU warn through ``warnings`` (once per
process), which Python also prints on file descriptor 2. So :class:`FallbackWatch` tees that
descriptor (vtools/observe/stderr_tee.py): everything written there still reaches the terminal or log
as it came, and each line that matches one of the device table's ``host_fallback`` patterns
(vtools/runtime/device_kinds.py) is counted, once for each operator it names.

A count is a number of announcements, not of calls: Ascend's backend announces most operators once
per process (its boxed fallback), some at every call (Adam's fused step below Ascend950, a plain warning);
what matters is which operators, and where the run was when each first fell back (the main thread's
innermost frame outside torch when the line arrived: the model code's line for a forward operator, the
``backward()`` call for a backward one).

Slow paths are counted beside them, each with its kind: work the backend keeps on the device but runs
slowly or at another precision (the row's ``slow_paths``: on Ascend, integer sorts on the AI CPU instead of
the AI Core, float64 cast to float32). They go in the same file with their kind, and their own summary
line; ``--no-cpu-fallback`` stops at host fallbacks only.

``fatal=True`` (``--no-cpu-fallback``) ends the run at the first one: the watcher raises
:class:`HostFallbackStop` in the main thread at its next Python instruction, and leaving the
``with`` block turns it into :class:`~vtools.errors.RunFailed` (exit 3) naming the operator.

Devices whose row has no pattern (cpu, cuda) are not watched: nothing is redirected.
Limits: announcements made before the watch starts (the backend makes each only once) or by other
processes (loader workers run no device operators) are not seen; output written in the last
instant before a hard crash of the process can be lost with the tee thread.
"""

from __future__ import annotations

import csv
import ctypes
import io
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType

import torch

from vtools.atomic import atomic_write_text
from vtools.errors import RunFailed
from vtools.observe import stderr_tee
from vtools.runtime import device as dev
from vtools.runtime.device_kinds import SlowPath, fallback_operators

CSV_NAME = "cpu_fallbacks.csv"
CSV_COLUMNS = ("op", "count", "first_seen_at", "kind")
HOST = "cpu"  # the kind of a host fallback; the row's slow paths name theirs ("aicpu", "float64 cast")


class HostFallbackStop(BaseException):
    """Raised asynchronously in the main thread at the first host fallback under ``fatal``. A
    BaseException, so that no ``except Exception`` on the way swallows it; the watch turns it into
    RunFailed."""


@dataclass
class Fallback:
    op: str
    count: int
    first_seen_at: str
    kind: str = HOST


class FallbackWatch:
    """Count the host fallbacks a backend announces while the ``with`` block runs (see the module)."""

    def __init__(self, device_type: str, fatal: bool = False, patterns: tuple[str, ...] | None = None) -> None:
        self.device_type = device_type
        row = dev.kind_of(device_type)
        self.patterns = patterns if patterns is not None else row.host_fallback
        self.fatal = fatal
        self._regexes = [re.compile(pattern) for pattern in self.patterns]
        self._slow = [(path, re.compile(path.pattern)) for path in (row.slow_paths if patterns is None else ())]
        self._counts: dict[tuple[str, str], Fallback] = {}
        self._lock = threading.Lock()
        self._main = threading.get_ident()  # the thread that runs the watched work: a fatal one stops it
        self._first_fatal: list[Fallback] = []  # the operators of the line a fatal watch stopped at
        self._closed = False
        # under ``fatal`` a line is held until complete, so that the announcement the run stops for is not
        # printed as well as the run's one-line error
        self._tee = stderr_tee.StderrTee(self._on_line, whole_lines=fatal) if self.watching else None

    @property
    def watching(self) -> bool:
        return bool(self._regexes or self._slow)

    # --- counting -----------------------------------------------------------------------------

    def feed(self, line: str) -> list[Fallback]:
        """Count ``line`` if it announces a host fallback (one entry per operator it names: a backend may name
        several overloads in one line) or a slow path (one entry, of the path's kind); returns those entries,
        empty for any other line."""
        kind, ops = HOST, announced_operators(line, self._regexes)
        if not ops:
            kind, ops = slow_path(line, self._slow)
        if not ops:
            return []
        with self._lock:
            entries = []
            for op in ops:
                entry = self._counts.get((kind, op))
                if entry is None:
                    entry = self._counts[kind, op] = Fallback(op, 0, main_thread_location(self._main), kind)
                entry.count += 1
                entries.append(entry)
            if kind == HOST and self.fatal and not self._first_fatal and not self._closed:
                self._first_fatal = entries
                _raise_in_thread(self._main, HostFallbackStop)
        return entries

    def _on_line(self, line: str) -> bool:
        """The tee's callback: count the line; True keeps the announcement a fatal run stops for off stderr."""
        entries = self.feed(line)
        return bool(entries) and entries[0].kind == HOST and self.fatal

    def _entries(self, host: bool) -> list[Fallback]:
        with self._lock:
            entries = [Fallback(e.op, e.count, e.first_seen_at, e.kind) for e in self._counts.values()]
        return sorted((e for e in entries if (e.kind == HOST) == host), key=lambda e: (-e.count, e.kind, e.op))

    def fallbacks(self) -> list[Fallback]:
        """Every operator run on the host, most announcements first."""
        return self._entries(host=True)

    def slow_paths(self) -> list[Fallback]:
        """Every kernel or cast the backend said it ran slowly or at another precision on the device."""
        return self._entries(host=False)

    @property
    def total(self) -> int:
        """Host-fallback announcements (slow paths not counted)."""
        return sum(entry.count for entry in self.fallbacks())

    # --- reporting ----------------------------------------------------------------------------

    def summary(self, where: str | None = None, top: int = 10) -> str:
        """The end-of-run report: a line, and one more per operator (the ``top`` most frequent); then a line for
        the slow paths, where there were any."""
        if not self.watching:
            return f"cpu fallbacks: 0 ({self.device_type} has no host fallback to watch)"
        entries, slow = self.fallbacks(), self.slow_paths()
        file_note = f"; all in {where}" if where else ""
        if not entries:
            lines = [f"cpu fallbacks: 0 (no operator ran on the host instead of the {self.device_type} device)"]
        else:
            lines = [
                f"cpu fallbacks: {len(entries)} operator(s) ran on the host instead of the {self.device_type} "
                f"device ({self.total} announcement(s): most operators are announced once per process, some at "
                f"every call){file_note}:"
            ]
            lines += _table(entries, top)
        if slow:
            kinds = sorted({e.kind for e in slow})
            lines.append(
                f"slow paths: {len(slow)} on the {self.device_type} device itself ({', '.join(kinds)}){file_note}:"
            )
            lines += _table(slow, top, kinds=True)
        return "\n".join(lines)

    def csv_text(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for entry in (*self.fallbacks(), *self.slow_paths()):
            writer.writerow((entry.op, entry.count, entry.first_seen_at, entry.kind))
        return out.getvalue()

    def write_csv(self, path: str | os.PathLike) -> Path:
        """``op,count,first_seen_at,kind`` (a header only when there were none), written atomically."""
        return atomic_write_text(path, self.csv_text())

    def fatal_message(self) -> str:
        entries = self._first_fatal
        assert entries
        ops = ", ".join(entry.op for entry in entries)
        return (
            f"--no-cpu-fallback: the {self.device_type} backend ran {ops} on the host CPU (announced while "
            f"the run was at {entries[0].first_seen_at}); the run stops at the first host fallback: give the model "
            "operators the device supports, or run without --no-cpu-fallback to count them all"
        )

    # --- watching ------------------------------------------------------------------------------

    def __enter__(self) -> FallbackWatch:
        if self._tee is not None:
            self._tee.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        for _ in range(3):  # a HostFallbackStop already on its way may land in here once
            try:
                self.close()
                break
            except HostFallbackStop:
                continue
        if self._first_fatal:
            raise RunFailed(self.fatal_message()) from None
        return False

    def close(self) -> None:
        """Stop counting: file descriptor 2 is the original again and every line written before is counted.
        Idempotent. (Loader workers forked meanwhile still write through the tee; it forwards until they
        exit.)"""
        with self._lock:
            self._closed = True
        if self.fatal:
            _raise_in_thread(self._main, None)  # cancel a HostFallbackStop not delivered yet
        if self._tee is not None:
            self._tee.close()


def _table(entries: list[Fallback], top: int, kinds: bool = False) -> list[str]:
    """The summary's rows: name, count, where first seen (and the kind, for slow paths); ``top`` at most."""
    width = max(len(e.op) for e in entries[:top])
    rows = [
        f"  {e.op.ljust(width)}  {e.count:>6}  {f'{e.kind}  ' if kinds else ''}first at {e.first_seen_at}"
        for e in entries[:top]
    ]
    return rows + ([f"  ... and {len(entries) - top} more"] if len(entries) > top else [])


def slow_path(line: str, paths: list[tuple[SlowPath, re.Pattern[str]]]) -> tuple[str, list[str]]:
    """The kind and the kernel (or the path's name) of a slow-path sentence; ``("", [])`` for any other line."""
    for path, regex in paths:
        match = regex.search(line)
        if match is not None:
            return path.kind, [match.groupdict().get("ops") or path.name]
    return "", []


def announced_operators(line: str, regexes: list[re.Pattern[str]]) -> list[str]:
    """The operators ``line`` announces as run on the host, by the first of ``regexes`` (the device row's
    ``host_fallback``) that matches it; empty for any other line."""
    for regex in regexes:
        match = regex.search(line)
        if match is not None:
            return fallback_operators(match.group("ops"))
    return []


def _raise_in_thread(thread_id: int | None, exc_type: type[BaseException] | None) -> None:
    """Have ``thread_id`` raise ``exc_type`` at its next Python instruction (None: cancel that)."""
    if thread_id is None:
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type is not None else None
    )


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _internal(frame: FrameType) -> bool:
    """Frames that are not "where the run was": torch's own, this module's, the tee's, threading's, and those
    of modules that hide themselves from tracebacks (``__tracebackhide__``, pytest's convention)."""
    filename = frame.f_code.co_filename
    return (
        filename in (__file__, stderr_tee.__file__, threading.__file__)
        or filename.startswith(_TORCH_DIR)
        or bool(frame.f_globals.get("__tracebackhide__"))
    )


def main_thread_location(thread_id: int | None) -> str:
    """``file:line in function`` of the innermost frame of ``thread_id`` outside torch (where the run was)."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    innermost = frame
    while frame is not None and _internal(frame):
        frame = frame.f_back
    frame = frame or innermost
    if frame is None:
        return "unknown"
    return f"{_short_path(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


def _short_path(filename: str) -> str:
    """A path relative to the working folder or to the sys.path entry it was imported from."""
    roots = sorted({os.getcwd(), *(p for p in sys.path if p)}, key=len, reverse=True)
    for root in roots:
        prefix = os.path.join(os.path.abspath(root), "")
        if filename.startswith(prefix):
            return filename[len(prefix) :]
    return filename

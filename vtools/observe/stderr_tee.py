"""A tee on file descriptor 2: what is written there still reaches the terminal or log, and each line is
also handed to a callback.

Native code (a backend's C++ warning handler, say) writes to the descriptor itself, never through
``sys.stderr``, so the tee puts a pipe in the descriptor's place and a thread forwards what arrives
to the original descriptor, line by line to the callback. Closing puts the original back and waits
until every line written before has been handed over: a sentinel written into the pipe marks where
that is. Processes forked meanwhile (loader workers) still write into the pipe; the thread forwards
their output until they exit, without handing it to the callback.
"""

from __future__ import annotations

import os
import select
import sys
import threading
from collections.abc import Callable
from types import TracebackType

SENTINEL = b"\x00vtools-stderr-tee-end\x00"
MAX_LINE = 1 << 20  # a "line" longer than this is passed on, not collected
HOLD_SECONDS = 0.1  # how long ``whole_lines`` holds a partial line before it shows it


class StderrTee:
    """Hand each line written to file descriptor 2 to ``on_line`` while the tee is open.

    Bytes are forwarded as they come (little is lost if the process dies), and what ``on_line``
    returns is ignored. With ``whole_lines`` a line is held until it is complete (or
    :data:`HOLD_SECONDS` passed without more), so that ``on_line`` can keep it off the terminal by
    returning True.
    """

    def __init__(self, on_line: Callable[[str], bool], whole_lines: bool = False) -> None:
        self.on_line = on_line
        self.whole_lines = whole_lines
        self._saved_fd: int | None = None
        self._write_fd: int | None = None
        self._drained = threading.Event()
        self._restored = False

    def __enter__(self) -> StderrTee:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        flush_stderr()
        self._saved_fd = os.dup(2)
        read_fd, self._write_fd = os.pipe()
        os.dup2(self._write_fd, 2)
        thread = threading.Thread(target=self._pump, args=(read_fd, self._saved_fd), name="vtools-stderr-tee")
        thread.daemon = True
        thread.start()

    def close(self) -> None:
        """File descriptor 2 is the original again, and every line written before was handed to ``on_line``.
        Idempotent; a no-op when the tee never started."""
        if self._saved_fd is None or self._restored:
            return
        flush_stderr()
        os.dup2(self._saved_fd, 2)
        self._restored = True
        os.write(self._write_fd, SENTINEL)
        os.close(self._write_fd)
        self._drained.wait(timeout=30)

    def _pump(self, read_fd: int, out_fd: int) -> None:
        """Forward what arrives on the pipe to the original descriptor and hand its lines over until the
        sentinel; then only forward, until every writer has closed the pipe."""
        pending = b""  # read, not yet past the sentinel check
        line = b""  # the current line, for the callback
        sent = 0  # how much of ``line`` has been forwarded
        counting = True
        out: int | None = out_fd

        def forward(data: bytes) -> None:
            nonlocal out
            if out is not None and data and not write_all(out, data):
                out = None  # the original stderr is gone: keep draining, never block the writers

        def take(data: bytes) -> None:
            nonlocal line, sent
            if not counting:
                forward(data)
                return
            line += data
            while (cut := line.find(b"\n")) >= 0:
                complete, line = line[: cut + 1], line[cut + 1 :]
                dropped = self.on_line(complete.decode("utf-8", "replace"))
                if not (self.whole_lines and dropped):
                    forward(complete[sent:])
                sent = 0
            if not self.whole_lines or len(line) > MAX_LINE:
                forward(line[sent:])
                sent = len(line)
            if len(line) > MAX_LINE:
                line, sent = b"", 0

        while True:
            if counting and self.whole_lines and sent < len(line):
                ready, _, _ = select.select([read_fd], [], [], HOLD_SECONDS)
                if not ready:  # a partial line that stays partial: show it
                    forward(line[sent:])
                    sent = len(line)
                    continue
            try:
                chunk = os.read(read_fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            if not counting:
                forward(chunk)
                continue
            pending += chunk
            end = pending.find(SENTINEL)
            if end >= 0:
                take(pending[:end])
                if line:
                    self.on_line(line.decode("utf-8", "replace"))
                    forward(line[sent:])
                counting = False
                self._drained.set()
                forward(pending[end + len(SENTINEL) :])
                pending = b""
                continue
            keep = sentinel_prefix(pending)
            take(pending[: len(pending) - keep])
            pending = pending[len(pending) - keep :]
        take(pending)
        if counting and line:
            forward(line[sent:])
        self._drained.set()
        for fd in (read_fd, out_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def sentinel_prefix(data: bytes) -> int:
    """Length of the longest end of ``data`` that begins the sentinel (kept back until more arrives)."""
    for size in range(min(len(SENTINEL) - 1, len(data)), 0, -1):
        if data.endswith(SENTINEL[:size]):
            return size
    return 0


def write_all(fd: int, data: bytes) -> bool:
    """Write everything; False when the descriptor is gone (the rest is then dropped, never blocked on)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except OSError:
            return False
    return True


def flush_stderr() -> None:
    try:
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass

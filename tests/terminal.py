"""A terminal window that closes: a command in a pseudo-terminal of its own, hung up once it prints a line.

Closing the pty's main side hangs the terminal up only when that close drops the last reference to it. A
test process is not a safe place to hold it: any process forked there in the meantime (a thread's
subprocess, a data-loader worker) keeps a copy, the close then hangs nothing up, and the command under test
writes on for good (seen once in a loaded full suite). So the terminal is opened and closed by this file run
as a fresh single-threaded process, which forks nothing but the command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # not from tests.conftest: the driver imports nothing heavy

HANG_UP_TERMINAL = (  # start the command with the pty on stdin as its controlling terminal, as a login shell does;
    # SIGHUP back to its default, as there: a suite started under nohup would hand its children SIGHUP ignored
    "import fcntl, os, signal, sys, termios; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execv(sys.executable, sys.argv[1:])"
)


def close_terminal_after(command: list[str], marker: str, log: bool, env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``command`` (a Python command line, in environment ``env``) with stdin, stderr and stdout on a
    terminal of its own, or, with ``log``, stdout into a pipe as into a log file; close the terminal once
    ``marker`` is printed, as a user closes the window. Returns the exit code, what was seen before the
    close, and stdout after it."""
    plan = json.dumps({"command": command, "marker": marker, "log": log})
    driver = subprocess.run(
        [sys.executable, str(Path(__file__)), plan],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a hang bound: the command stops when its terminal closes, within a minute when well
    )
    assert driver.returncode == 0, driver.stderr[-3000:]
    ended = json.loads(driver.stdout)
    return ended["code"], ended["seen"], ended["out"]


def _drive(plan: dict) -> dict:
    """The driver's side: open the terminal, start the command, close the terminal at the marker, wait."""
    import pty

    main, terminal = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-c", HANG_UP_TERMINAL, *plan["command"]],
        cwd=REPO,
        stdin=terminal,
        stdout=subprocess.PIPE if plan["log"] else terminal,
        stderr=terminal,
        text=True,
        start_new_session=True,
    ) as proc:
        os.close(terminal)
        seen = ""
        while plan["marker"] not in seen:
            try:
                chunk = proc.stdout.readline() if plan["log"] else os.read(main, 1 << 16).decode(errors="replace")
            except OSError:  # the command ended and closed the terminal's last handle
                chunk = ""
            if not chunk:
                break
            seen += chunk
        os.close(main)  # the terminal window closes
        out = proc.communicate(timeout=300)[0] or ""
    return {"code": proc.returncode, "seen": seen, "out": out}


if __name__ == "__main__":
    json.dump(_drive(json.loads(sys.argv[1])), sys.stdout)

"""User-facing errors: a bad flag, file or device ends the run with one line.

Everything that a user can fix by changing their command line or their files
is raised as a :class:`UsageError`; the entry scripts turn it into
``<script>: error: <message>`` on stderr and exit code 2, with no traceback.
This module imports nothing heavy so that it works even when torch cannot.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

EXIT_USAGE = 2
EXIT_RUN_FAILED = 3


class UsageError(Exception):
    """An error the user can fix; reported as one line, exit code 2."""


class RunFailed(Exception):
    """The input was fine but the run failed on its own (a diverged loss); one line, exit code 3."""


def fail(message: str, prog: str | None = None, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``prog: error: message`` as a single line and exit with ``code`` (2: unusable input)."""
    if prog is None:
        prog = os.path.basename(sys.argv[0] or "vtools")
        prog = "vtools" if prog == "__main__.py" else prog
    one_line = " ".join(str(message).split())
    print(f"{prog}: error: {one_line}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def is_dead_worker(err: BaseException) -> bool:
    """Whether ``err`` is torch's report of a loader worker process that died. It is raised from a
    SIGCHLD handler, so at any point of the main loop, not only where batches are fetched."""
    return isinstance(err, RuntimeError) and str(err).startswith("DataLoader worker (pid")


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> NoReturn:
    """Run an entry point, turning :class:`UsageError` into a one-line exit 2."""
    try:
        code = main(argv)
    except UsageError as err:
        fail(str(err))
    except RunFailed as err:
        fail(str(err), code=EXIT_RUN_FAILED)
    except RuntimeError as err:
        if not is_dead_worker(err):
            raise
        # torch's SIGCHLD handler raises this again as the other workers exit: report it once
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        fail(f"a data-loader worker died ({str(err).strip().rstrip('.')}); often the host ran out of memory: "
             "lower --workers or --batch-size", code=EXIT_RUN_FAILED)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None
    exit_without_teardown(code or 0)


def exit_without_teardown(code: int) -> NoReturn:
    """End a finished run now. The interpreter's teardown frees every module and object torch, timm and
    torchvision loaded, about a second on a small machine (more than a short validation's work), and
    nothing of it is needed once the results are written; what a normal exit guarantees is kept:
    non-daemon threads are joined, exit handlers run, output is flushed."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a reader that went away: nothing left to say
            pass
    os._exit(code)

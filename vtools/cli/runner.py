"""Running a command: parse first, then the guarded torch import, one-line errors, exit codes, and an exit
without teardown.

Every entry point (``train.py``, ``validate.py``, ``inference.py``, ``vtools COMMAND``) goes through
:func:`run_command`. A command the registry (vtools/cli/registry.py) gives a flags module has its options
parsed and checked there before torch, timm or the data libraries are imported (a few seconds on a small
machine), so ``--help``, a mistyped flag, every refusal that reads only the command line and a data path
that is not there answer at once; then comes the guarded ``import torch``, and the command runs with its
typed options (vtools/cli/typed.py). Every failure a user can act on ends as one line with the exit code of
the table in docs/training.md. This module imports nothing heavy, so it works when torch cannot.
"""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from vtools.cli.data_path import check_data_exists
from vtools.cli.registry import command
from vtools.cli.typed import command_options
from vtools.errors import EXIT_RUN_FAILED, RunFailed, UsageError, fail, is_dead_worker
from vtools.runtime.torch_import import import_torch


def command_main(name: str) -> Callable[[list[str] | None], int | None]:
    """``vtools.commands.<name>`` as a function of the command line: its options parsed first where they can
    be without torch, then torch imported safely, then the command run."""

    def main(argv: list[str] | None) -> int | None:
        found = command(name)
        flags = importlib.import_module(found.flags)
        options = flags.parse(argv)
        if hasattr(flags, "data_source"):  # a typo in a data path said before the imports
            check_data_exists(flags.data_source(options), options.dataset)
        import_torch()
        return importlib.import_module(found.module).run(command_options(found.name, options))

    return main


def run_command(name: str, argv: list[str] | None = None) -> NoReturn:
    """Run command ``name`` as a script does: parse, guarded torch import, one-line errors, exit code."""
    run_cli(command_main(name), argv)


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
        fail(
            f"a data-loader worker died ({str(err).strip().rstrip('.')}); often the host ran out of memory: "
            "lower --workers or --batch-size",
            code=EXIT_RUN_FAILED,
        )
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

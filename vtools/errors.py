"""User-facing errors: a bad flag, file or device ends the run with one line.

Everything that a user can fix by changing their command line or their files is
raised as a :class:`UsageError` (exit 2); a run that fails on its own is a
:class:`RunFailed` (exit 3). ``vtools.cli.runner`` turns them into
``<script>: error: <message>`` on stderr, with no traceback. This module imports
nothing heavy so that it works even when torch cannot.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

EXIT_USAGE = 2


EXIT_RUN_FAILED = 3

EXIT_STREAM_LOST = 75  # sysexits' EX_TEMPFAIL: shards from a server could not be read; a resume continues


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

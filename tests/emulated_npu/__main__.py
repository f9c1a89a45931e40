"""Run a Python program with the emulated NPU installed.

    python -m tests.emulated_npu -m package.module [args...]
    python -m tests.emulated_npu path/to/script.py [args...]
    python -m tests.emulated_npu -c "code" [args...]

Meant for CLI tests: the child process gets "npu" devices without any change
to the program under test. Run from the repository root (or put it on
PYTHONPATH) so that ``tests.emulated_npu`` is importable.
"""

from __future__ import annotations

import runpy
import sys

import tests.emulated_npu  # noqa: F401  (installs the backend)


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if argv else 2)
    if argv[0] == "-m" and len(argv) >= 2:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c" and len(argv) >= 2:
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])

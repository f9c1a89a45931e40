#!/usr/bin/env python3
"""Top-1 / top-5 validation of timm models on any device.

A thin entry point: the code is vtools/commands/validate.py (also `vtools validate` once
vtools is installed). `python validate.py --help` lists the options.
"""

import vtools  # noqa: F401  (guards `import torch` against broken device backends)
from vtools.commands.validate import build_parser, main  # noqa: F401  (build_parser: for tests and tools)
from vtools.errors import run_cli

if __name__ == "__main__":
    run_cli(main)

#!/usr/bin/env python3
"""Top-k predictions of a timm model, on any device.

A thin entry point: the code is vtools/commands/inference.py (also `vtools infer` once
vtools is installed). `python inference.py --help` lists the options.
"""

import vtools  # noqa: F401  (guards `import torch` against broken device backends)
from vtools.commands.inference import build_parser, main  # noqa: F401  (build_parser: for tests and tools)
from vtools.errors import run_cli

if __name__ == "__main__":
    run_cli(main)

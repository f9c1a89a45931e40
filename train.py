#!/usr/bin/env python3
"""ImageNet-style training of timm models from a YAML run file, on any device.

A thin entry point: the code is vtools/commands/train.py (also `vtools train` once
vtools is installed). `python train.py --help` lists the options.
"""

import vtools  # noqa: F401  (guards `import torch` against broken device backends)
from vtools.commands.train import build_parser, main  # noqa: F401  (build_parser: for tests and tools)
from vtools.errors import run_cli

if __name__ == "__main__":
    run_cli(main)

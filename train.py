#!/usr/bin/env python3
"""ImageNet-style training of timm models from a YAML run file, on any device.

A thin entry point: the code is vtools/commands/train.py (also `vtools train` once
vtools is installed). `python train.py --help` lists the options.
"""

from vtools.cli.runner import run_command

if __name__ == "__main__":
    run_command("train")

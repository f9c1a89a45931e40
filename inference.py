#!/usr/bin/env python3
"""Top-k predictions of a timm model, on any device.

A thin entry point: the code is vtools/commands/infer.py (also `vtools infer` once
vtools is installed). `python inference.py --help` lists the options.
"""

from vtools.cli.runner import run_command

if __name__ == "__main__":
    run_command("infer")

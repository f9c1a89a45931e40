#!/usr/bin/env python3
"""Top-1 / top-5 validation of timm models on any device.

A thin entry point: the code is vtools/commands/validate.py (also `vtools validate` once
vtools is installed). `python validate.py --help` lists the options.
"""

from vtools.cli.runner import run_command

if __name__ == "__main__":
    run_command("validate")

"""Turning a command line (and a YAML run file) into options, and running a command.

Rule: argument parsing and the command runner, nothing that builds models or data; may import
``vtools.runtime`` and the base modules. The parse path (the scripts' flags modules and what they import)
imports no torch, timm, torchvision or data library, so that the runner can parse before importing them
(tests/cli/test_runner.py).
"""

"""Turning a command line (and a YAML run file) into options, and running a command.

Rule: argument parsing and the command runner, nothing that builds models or data;
may import ``vtools.runtime`` and the base modules.
"""

"""vtools: train, validate and run timm models on any PyTorch accelerator.

Importing vtools (or any of its modules) only imports: no handlers, no exits. A command
installs what it needs when it starts (``vtools.cli.runner``).

The packages are layers; a module imports from its own layer and the ones below, never above:

    errors, optional, progress, atomic, run_ledger, run_events, derived_options, outputs, results
                  the base: errors, imports, files, a run's events, what groups of option values amount to
    runtime/      devices, guarded torch import, AMP policy, cpu budget, torch.distributed
    options/      every command's options declared once: typed concerns, their flags, ranges and resume marks
    cli/          the command registry, parsers generated from the declarations, YAML run files, the runner
    models/       timm models: creation, weights and checkpoints, model folders, ONNX models
    data/         decoding, datasets, loaders, sampling, readers/ (one per source kind), shard writer
    evaluation/   the evaluation and prediction loops
    observe/      trackers, curves, profiling, environment report, cpu fallbacks, parity (none of train/)
    train/ deploy/     the training loop, recipe, checkpoints, resume, run folder lock; ONNX export
    commands/     one module per command, named as the command
    api, __main__    the Python API (fit, validate, predict; any command's options) and the ``vtools`` command

``tests/rules/test_package_layers.py`` checks this order.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

API = (
    "fit",
    "validate",
    "predict",
    "command_options",
)  # vtools/api.py's functions, imported on first use: a light import


def __getattr__(name: str) -> Any:
    if name in API:
        from vtools import api

        return getattr(api, name)
    raise AttributeError(f"module 'vtools' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])

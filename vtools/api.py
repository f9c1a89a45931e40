"""Train, validate and predict from Python with the scripts' options and defaults: a notebook, a sweep or
another program calls these instead of building a command line.

    outcome = vtools.fit("configs/fashion_mnist_cpu.yaml", epochs=5, lr=0.001)
    rows = vtools.validate(data="data/fashion-mnist-mini/val", model=outcome.model_dir)

A keyword is an option's argparse dest (``batch_size=64``, ``data_dir=...``). Options resolve as on the
command line, with the same checks: the command's defaults < the YAML file ``config`` < the keywords
(vtools.cli.config.resolve_options). Each function then runs what its script runs (printing what it
prints, writing what it writes) and returns the rows it wrote. A refusal is the :class:`UsageError` the
script would print as one line, and a run that failed on its own is a :class:`RunFailed`.

Nothing heavy is imported until a function is called: the commands (torch, timm) load then. The process
setup of vtools.cli.runner (a guarded torch import, exit codes, an exit without teardown) belongs to a
script, not a library; the training run installs its own signal handlers for its duration, as the script's.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vtools.cli import registry
from vtools.cli.config import resolve_options
from vtools.cli.typed import command_options as typed_command_options
from vtools.errors import UsageError

if TYPE_CHECKING:
    from vtools.options.declare import ParsedOptions
    from vtools.options.train_job import TrainJob
    from vtools.train.run_files import TrainOutcome

__all__ = ["command_options", "fit", "predict", "validate"]


def fit(config: str | Path | None = None, **options: Any) -> TrainOutcome:
    """Train as ``train.py -c config --option value ...`` does. The outcome holds the exit code (non-zero
    where a signal stopped the run after saving it), the run folder, the exported model folder and the
    summary.csv rows."""
    from vtools.commands.train import train_run

    return train_run(train_options(config, options))


def validate(config: str | Path | None = None, **options: Any) -> list[dict[str, Any]]:
    """Validate as ``validate.py`` does: one row per model (and checkpoint), as --results-file holds them."""
    from vtools.commands.validate import validate_models

    return validate_models(validate_options(config, options))


def predict(config: str | Path | None = None, **options: Any) -> list[dict[str, Any]]:
    """Classify as ``inference.py`` does: one row per image, as its results files hold them."""
    from vtools.commands.infer import predict_rows

    return predict_rows(infer_options(config, options))


def command_options(command: str, config: str | Path | None = None, **keywords: Any) -> Any:
    """Any command's options (``vtools.command_options("benchmark", model="resnet18", drop=0.1)``), as its command
    line would give them to its ``run`` (train's a ``TrainJob``, every other command's a frozen dataclass with a
    typed field per flag): its declarations' defaults < the YAML file ``config`` < the keywords, each value
    checked against its declared range, then the command's checks of several options together. A value it
    would refuse raises the :class:`UsageError` it would print. ``command`` is a name of vtools/cli/registry.py."""
    return _resolved(command, config, keywords, f"command_options({command!r})")


def _resolved(command: str, config: str | Path | None, keywords: dict[str, Any], caller: str) -> Any:
    try:
        found = registry.command(command)
    except KeyError:
        names = ", ".join(known.name for known in registry.COMMANDS)
        raise UsageError(f"{caller}: no command {command!r} (commands: {names})") from None
    flags = importlib.import_module(found.flags)
    resolved = resolve_options(flags.build_parser(), config, keywords, caller)
    check = getattr(flags, "check", None)  # the cross-option checks; a tool whose flags need none has none
    return typed_command_options(found.name, check(resolved) if check is not None else resolved)


def train_options(config: str | Path | None, options: dict[str, Any]) -> TrainJob:
    """train.py's options for these keywords, through train.py's own checks."""
    return _resolved("train", config, options, "fit()")


def validate_options(config: str | Path | None, options: dict[str, Any]) -> ParsedOptions:
    """validate.py's options for these keywords, through validate.py's own checks."""
    return _resolved("validate", config, options, "validate()")


def infer_options(config: str | Path | None, options: dict[str, Any]) -> ParsedOptions:
    """inference.py's options for these keywords, through inference.py's own checks."""
    return _resolved("infer", config, options, "predict()")

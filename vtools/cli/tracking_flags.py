"""The experiment-tracker flag groups, generated from their declarations (vtools/options/shared.py
``TrackingFlags``, the one tracking concern): TensorBoard's and timm's W&B flags (train.py) and MLflow's (train.py
and validate.py).

The trackers themselves live in vtools/observe/ (their registry: run_trackers.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from vtools.cli.declared import add_declared
from vtools.errors import UsageError
from vtools.options.shared import TrackingFlags

WANDB_FLAGS = ("log_wandb", "wandb_project", "wandb_tags", "wandb_resume_id")
MLFLOW_HELP = (
    "log {what} to MLflow at URI (a server's http://host:port, sqlite:///file.db, databricks; "
    "default: $MLFLOW_TRACKING_URI, else MLflow's local mlflow.db and ./mlruns)"
)


def add_mlflow_args(group: Any, training: bool) -> None:
    """--log-mlflow and --mlflow-experiment; train.py also has --mlflow-artifacts."""
    what = (
        "the options, the metrics of every log step and epoch, and the run's summary"
        if training
        else "one run per model with its results row"
    )
    names = ("log_mlflow", "mlflow_experiment") + ("mlflow_artifacts",) * training
    add_declared(group, TrackingFlags, only=names, changes={"log_mlflow": {"help": MLFLOW_HELP.format(what=what)}})


def add_tensorboard_arg(group: Any) -> None:
    """--log-tensorboard (train.py): its scalars in the run folder."""
    add_declared(group, TrackingFlags, only=("log_tensorboard",))


def add_wandb_args(group: Any) -> None:
    """timm's four W&B flags, with timm's names, defaults and meaning."""
    add_declared(group, TrackingFlags, only=WANDB_FLAGS)


def check_tracking_args(args: argparse.Namespace) -> None:
    """--mlflow-artifacts means something only beside --log-mlflow. (timm's W&B flags without --log-wandb
    are accepted and unused, as timm accepts them: its args.yaml always holds them.)"""
    if getattr(args, "mlflow_artifacts", False) and args.log_mlflow is None:
        raise UsageError("--mlflow-artifacts uploads to MLflow: add --log-mlflow [URI]")

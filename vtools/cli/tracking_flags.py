"""The experiment-tracker flags: timm's W&B flags (train.py) and MLflow's (train.py and validate.py).

They choose where figures are sent, never how a run trains: a resumed run may change every one of them.
The trackers themselves live in vtools/observe/ (tracking.py, wandb_tracker.py, mlflow_tracker.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from vtools.cli.options import may_change_on_resume
from vtools.errors import UsageError

MLFLOW_DEFAULT = ""  # --log-mlflow without a URI: MLFLOW_TRACKING_URI, else MLflow's local default


def mlflow_target(text: str) -> str | None:
    """--log-mlflow's value: a tracking URI, or '' for the default. YAML's ``log_mlflow: true`` means the
    default and ``false`` means off, as they read."""
    lowered = text.strip().lower()
    if lowered == "true":
        return MLFLOW_DEFAULT
    if lowered == "false":
        return None
    return text


def add_mlflow_args(group: Any, training: bool) -> None:
    """--log-mlflow and --mlflow-experiment; train.py also has --mlflow-artifacts."""
    what = (
        "the options, the metrics of every log step and epoch, and the run's summary"
        if training
        else ("one run per model with its results row")
    )
    may_change_on_resume(
        group.add_argument(
            "--log-mlflow",
            nargs="?",
            const=MLFLOW_DEFAULT,
            default=None,
            type=mlflow_target,
            metavar="URI",
            help=f"log {what} to MLflow at URI (a server's http://host:port, sqlite:///file.db, databricks; "
            "default: $MLFLOW_TRACKING_URI, else MLflow's local mlflow.db and ./mlruns)",
        )
    )
    may_change_on_resume(
        group.add_argument(
            "--mlflow-experiment",
            default=None,
            metavar="NAME",
            help="MLflow experiment (made if new; default: $MLFLOW_EXPERIMENT_NAME, else MLflow's Default)",
        )
    )
    if training:
        may_change_on_resume(
            group.add_argument(
                "--mlflow-artifacts",
                action="store_true",
                default=False,
                help="with --log-mlflow: also upload the model folder and the class report when the run ends",
            )
        )


def add_wandb_args(group: Any) -> None:
    """timm's four W&B flags, with timm's names, defaults and meaning."""
    may_change_on_resume(
        group.add_argument(
            "--log-wandb",
            action="store_true",
            default=False,
            help="log to Weights & Biases: the options, every log step and epoch, the best epoch's per-class "
            "table and the run's summary, into <run>/wandb (WANDB_MODE=offline: there only)",
        )
    )
    may_change_on_resume(
        group.add_argument("--wandb-project", default=None, metavar="NAME", help="W&B project (default: W&B's)")
    )
    may_change_on_resume(group.add_argument("--wandb-tags", nargs="+", default=[], metavar="TAG", help="W&B tags"))
    may_change_on_resume(
        group.add_argument(
            "--wandb-resume-id",
            default="",
            metavar="ID",
            help="continue this W&B run (default: the run folder's own, so that --resume continues its W&B run)",
        )
    )


def check_tracking_args(args: argparse.Namespace) -> None:
    """--mlflow-artifacts means something only beside --log-mlflow. (timm's W&B flags without --log-wandb
    are accepted and unused, as timm accepts them: its args.yaml always holds them.)"""
    if getattr(args, "mlflow_artifacts", False) and args.log_mlflow is None:
        raise UsageError("--mlflow-artifacts uploads to MLflow: add --log-mlflow [URI]")

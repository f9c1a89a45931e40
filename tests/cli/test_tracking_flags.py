"""The tracker flags: timm's W&B flags with timm's defaults, --log-mlflow's optional URI (YAML too), and
the flags a resume may change."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.timm_reference import timm_options
from vtools.cli import train_flags, validate_flags
from vtools.cli.declared import resume_changeable
from vtools.errors import UsageError
from vtools.options.shared import MLFLOW_DEFAULT, mlflow_target

TRACKER_DESTS = (
    "log_wandb",
    "wandb_project",
    "wandb_tags",
    "wandb_resume_id",
    "log_mlflow",
    "mlflow_experiment",
    "mlflow_artifacts",
)


def parse(*argv: str, config: Path | None = None):
    return train_flags.parse([*(["-c", str(config)] if config else []), "/data", *argv])


def test_timms_wandb_flags_keep_timms_defaults_and_act() -> None:
    timm = {option["dest"]: option for option in timm_options("train.py")}
    defaults = parse()
    for dest in ("log_wandb", "wandb_project", "wandb_tags", "wandb_resume_id"):
        assert getattr(defaults, dest) == timm[dest]["default"], dest
    given = parse("--log-wandb", "--wandb-project", "p", "--wandb-tags", "a", "b", "--wandb-resume-id", "x1")
    assert (given.log_wandb, given.wandb_project, given.wandb_tags, given.wandb_resume_id) == (
        True,
        "p",
        ["a", "b"],
        "x1",
    )


def test_wandb_names_without_log_wandb_are_accepted_as_timm_accepts_them() -> None:
    assert parse("--wandb-project", "p").log_wandb is False


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], None),
        (["--log-mlflow"], MLFLOW_DEFAULT),
        (["--log-mlflow", "http://127.0.0.1:5000"], "http://127.0.0.1:5000"),
    ],
)
def test_log_mlflow_takes_an_optional_uri(argv: list[str], expected: str | None) -> None:
    assert parse(*argv).log_mlflow == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [("log_mlflow: true", MLFLOW_DEFAULT), ("log_mlflow: false", None), ("log_mlflow: ''", MLFLOW_DEFAULT),
     ("log_mlflow: sqlite:///m.db", "sqlite:///m.db"), ("log-mlflow: null", None)],
)  # fmt: skip
def test_log_mlflow_in_yaml_reads_as_written(tmp_path: Path, line: str, expected: str | None) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"model: test_resnet\n{line}\n")
    assert parse(config=config).log_mlflow == expected


def test_mlflow_target_words() -> None:
    assert mlflow_target("TRUE") == MLFLOW_DEFAULT and mlflow_target(" false ") is None
    assert mlflow_target("databricks") == "databricks"


def test_mlflow_artifacts_needs_log_mlflow() -> None:
    with pytest.raises(UsageError, match="--mlflow-artifacts uploads to MLflow: add --log-mlflow"):
        parse("--mlflow-artifacts")
    assert parse("--mlflow-artifacts", "--log-mlflow").mlflow_artifacts is True


def test_a_resume_may_change_every_tracker_flag() -> None:
    assert set(TRACKER_DESTS) <= resume_changeable(train_flags.build_parser())


def test_validate_has_mlflow_only() -> None:
    args = validate_flags.parse(["/data", "--model", "m", "--log-mlflow", "--mlflow-experiment", "e"])
    assert (args.log_mlflow, args.mlflow_experiment) == (MLFLOW_DEFAULT, "e")
    assert not hasattr(args, "log_wandb") and not hasattr(args, "mlflow_artifacts")

"""W&B tracking end to end in W&B's offline mode: what train.py logs is read back from the run's .wandb files
with W&B's own reader (``wandb leet inspect --json``) and compared with the run's own files and printed lines;
``--resume`` continues the same W&B run, timm's args.yaml with ``log_wandb: true`` runs unchanged, and a
missing W&B package costs one warning line and a last line saying what was not logged."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import DEVICE_TYPES, REPO, device_flags, run_script, summary, train_args
from tests.emulated_npu._build import build_dir
from vtools.observe.tracking import TRACKING_FILE
from vtools.observe.wandb_tracker import RESOLVED_KEY

STEP_LINE = re.compile(r"^\S+ \S+ epoch (\d+) \(\d+ of \d+\) step (\d+)/(\d+) loss (\S+) lr (\S+) ")
STEP_KEYS = {"num_updates", "epoch_step", "step/loss", "step/lr", "step/img_per_sec", "step/data_wait"}


# ---------------------------------------------------------------- a hermetic offline W&B


def offline_env(tmp: Path) -> dict[str, str | None]:
    """W&B offline with every file it writes under ``tmp``: no W&B variable of this shell (an API key, an
    entity, a base URL, WANDB_DIR), no user settings or netrc (HOME, W&B's config, cache and data folders in
    ``tmp``). The emulated npu's build is kept where this process found it (it lives under HOME)."""
    home = tmp / "home"
    env: dict[str, str | None] = {key: None for key in os.environ if key.startswith("WANDB_")}
    env.update(
        HOME=str(home),
        NETRC=None,
        XDG_CONFIG_HOME=None,
        XDG_CACHE_HOME=None,
        WANDB_MODE="offline",
        WANDB_CONFIG_DIR=str(home / "wandb-config"),
        WANDB_CACHE_DIR=str(home / "wandb-cache"),
        WANDB_DATA_DIR=str(home / "wandb-data"),
        VTOOLS_EMU_NPU_BUILD_DIR=os.environ.get("VTOOLS_EMU_NPU_BUILD_DIR") or str(build_dir()),
    )
    return env


def offline_runs(folder: Path) -> list[Path]:
    """The run folder's W&B offline runs, oldest first (their names start with their start time)."""
    return sorted((folder / "wandb").glob("offline-run-*"))


def wandb_records(offline_run: Path, env: dict[str, str | None]) -> list[dict[str, Any]]:
    """The records of an offline run's .wandb file, as W&B's own reader gives them."""
    full_env = {key: value for key, value in {**os.environ, **env}.items() if value is not None}
    proc = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(offline_run)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert records and records[-1]["type"] == "exit", [r["type"] for r in records[-3:]]
    return records


def of_type(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [record[kind] for record in records if record["type"] == kind]


def history(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The logged rows, W&B's own keys (_step, _runtime, _timestamp) left out."""
    return [{k: v for k, v in row["item"].items() if not k.startswith("_")} for row in of_type(records, "history")]


def merged(records: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The run's config or summary: its updates in order (the run record's config first)."""
    values: dict[str, Any] = {}
    if kind == "config":
        for run in of_type(records, "run"):
            values.update(run.get("config", {}).get("update", {}))
    for record in of_type(records, kind):
        values.update(record.get("update", {}))
    return values


# ---------------------------------------------------------------- comparing with the run's files and lines


def step_lines(stdout: str) -> list[tuple[int, int, int, str, str]]:
    """The printed log steps: epoch, step, steps per epoch, loss and lr as printed."""
    found = []
    for line in stdout.splitlines():
        match = STEP_LINE.match(line)
        if match:
            epoch, step, steps, loss, lr = match.groups()
            found.append((int(epoch), int(step), int(steps), loss, lr))
    return found


def assert_steps_match(rows: list[dict[str, Any]], printed: list[tuple[int, int, int, str, str]]) -> None:
    """A step row per printed log step, with the printed figures (loss to 4 decimals, lr to 3 digits)."""
    steps = [row for row in rows if "num_updates" in row]
    assert len(steps) == len(printed) > 0, (len(steps), len(printed))
    for row, (epoch, step, per_epoch, loss, lr) in zip(steps, printed, strict=True):
        assert set(row) == STEP_KEYS, row
        assert row["epoch_step"] == step and row["num_updates"] == epoch * per_epoch + step, (row, epoch, step)
        assert (f"{row['step/loss']:.4f}", f"{row['step/lr']:.3g}") == (loss, lr), (row, loss, lr)
        assert row["step/img_per_sec"] > 0 and 0 <= row["step/data_wait"] <= 1, row


def assert_epochs_match(rows: list[dict[str, Any]], csv_rows: list[dict[str, str]]) -> None:
    """An epoch row per summary.csv row with every numeric column, to the float (csv writes a float's repr)."""
    epochs = [row for row in rows if "epoch" in row]
    expected = [
        {"epoch": int(line["epoch"]), **{k: float(v) for k, v in line.items() if k != "epoch" and v != ""}}
        for line in csv_rows
    ]
    assert epochs == expected


def assert_config_is_the_options(config: dict[str, Any], folder: Path, device_type: str) -> None:
    """The run's config holds config.yaml's options as they are, and under "run" what the run resolved
    them to (model, data, device)."""
    options = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    differing = {
        key: (value, config.get(key, "missing"))
        for key, value in options.items()
        if config.get(key, "missing") != _as_logged(value)
    }
    assert not differing
    resolved = config[RESOLVED_KEY]
    assert resolved["model"] == "test_resnet" and resolved["device"].split(":")[0] == device_type
    assert resolved["dataset"] == options["data_dir"]


def _as_logged(value: Any) -> Any:
    """A YAML value as W&B's config holds it (JSON: tuples are lists)."""
    return json.loads(json.dumps(value))


def assert_summary_matches(summary_values: dict[str, Any], csv_rows: list[dict[str, str]]) -> None:
    """The run's end summary: its epochs, its best top-1 and epoch, its per-class table."""
    best = max(float(row["eval_top1"]) for row in csv_rows)
    assert summary_values["epochs"] == len(csv_rows) and summary_values["best_top1"] == best
    assert float(csv_rows[int(summary_values["best_epoch"])]["eval_top1"]) == best
    assert summary_values["seconds"] > 0
    assert summary_values.get("eval/per_class._type") == "table-file", sorted(summary_values)


def assert_tracked_cleanly(proc: subprocess.CompletedProcess, project: str) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"tracking: W&B (offline, project {project}, run " in proc.stdout, proc.stdout[-3000:]
    assert "not logged" not in proc.stdout and "warning: W&B" not in proc.stdout, proc.stdout[-3000:]


# ---------------------------------------------------------------- train.py and its resume


@pytest.mark.slow
@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_offline_run_and_its_resume_hold_what_the_run_wrote_and_printed(
    device_type: str, fashion4: Path, tmp_path: Path
) -> None:
    """Every summary.csv row is an epoch row (every numeric column, to the float), every printed log step a
    step row; config, name, project, tags and id are the run's; --resume auto continues the same W&B run."""
    env = offline_env(tmp_path)
    tracked = ["--log-wandb", "--wandb-project", "vtools-test", "--wandb-tags", "a", "b", "--log-interval", "2"]
    common = [*device_flags(device_type), *tracked]
    out = tmp_path / "out"
    first = run_script(train_args(fashion4, out, "run", *common, "--epochs", "1"), env=env)
    assert_tracked_cleanly(first, "vtools-test")
    folder = out / "run"
    tracking_id = json.loads((folder / TRACKING_FILE).read_text())["id"]
    assert f"run {tracking_id}, files in {folder / 'wandb'})" in first.stdout
    [offline] = offline_runs(folder)
    assert offline.name.endswith(f"-{tracking_id}") and (offline / f"run-{tracking_id}.wandb").is_file()
    records = wandb_records(offline, env)
    [run] = of_type(records, "run")
    assert (run["display_name"], run["project"], run["run_id"]) == ("run", "vtools-test", tracking_id)
    assert run["tags"] == ["a", "b"]
    first_rows = history(records)
    assert_epochs_match(first_rows, summary(folder))
    assert_steps_match(first_rows, step_lines(first.stdout))
    config = merged(records, "config")
    assert_config_is_the_options(config, folder, device_type)
    assert (config["epochs"], config["batch_size"]) == (1, 32)
    assert_summary_matches(merged(records, "summary"), summary(folder))
    assert of_type(records, "exit")[-1]["exit_code"] == 0

    resumed = run_script(train_args(fashion4, out, "run", *common, "--epochs", "2", "--resume", "auto"), env=env)
    assert_tracked_cleanly(resumed, "vtools-test")
    runs = offline_runs(folder)
    assert len(runs) == 2 and runs[0] == offline and runs[1].name.endswith(f"-{tracking_id}"), runs
    again = wandb_records(runs[1], env)
    [second] = of_type(again, "run")
    assert (second["display_name"], second["project"], second["run_id"]) == ("run", "vtools-test", tracking_id)
    rows = first_rows + history(again)
    csv_rows = summary(folder)
    assert len(csv_rows) == 2
    assert_epochs_match(rows, csv_rows)
    assert_steps_match(rows, step_lines(first.stdout) + step_lines(resumed.stdout))
    assert merged(again, "config")["epochs"] == 2  # a resume may change --epochs: the config says the new one
    assert_summary_matches(merged(again, "summary"), csv_rows)


# ---------------------------------------------------------------- timm's args.yaml


@pytest.mark.slow
@pytest.mark.cpu_only(reason="reading timm's W&B keys is host-side; the tracker on every device: the test above")
def test_timms_args_yaml_with_log_wandb_runs_unchanged(fashion4: Path, tmp_path: Path) -> None:
    """timm's args.yaml with ``log_wandb: true`` and ``wandb_project`` (and timm's other W&B keys at their
    defaults) trains and logs to that project; with the user's WANDB_DIR (a cluster's scratch space) W&B's
    files go there, not into the run folder."""
    from tests.timm_reference import timm_args_yaml

    recipe = "--model test_resnet --img-size 32 --epochs 1 -b 32 --workers 1 --warmup-epochs 0".split()
    args_yaml = tmp_path / "args.yaml"
    args_yaml.write_text(timm_args_yaml("train.py", [*recipe, "--log-wandb", "--wandb-project", "someproject"]))
    timm_values = yaml.safe_load(args_yaml.read_text(encoding="utf-8"))
    assert timm_values["log_wandb"] is True and timm_values["wandb_project"] == "someproject"
    assert timm_values["wandb_tags"] == [] and timm_values["wandb_resume_id"] == ""
    env = offline_env(tmp_path) | {"WANDB_DIR": str(tmp_path / "scratch")}
    given = ["--device", "cpu", "--data-dir", str(fashion4), "--output", str(tmp_path / "out"), "--experiment", "run"]
    proc = run_script(["train.py", "-c", str(args_yaml), *given], env=env)
    assert_tracked_cleanly(proc, "someproject")
    folder = tmp_path / "out" / "run"
    assert f"files in {tmp_path / 'scratch' / 'wandb'})" in proc.stdout
    assert not (folder / "wandb").exists() and "wandb/" not in proc.stdout.splitlines()[-1]
    [offline] = offline_runs(tmp_path / "scratch")
    records = wandb_records(offline, env)
    [run] = of_type(records, "run")
    assert (run["project"], run["display_name"]) == ("someproject", "run")
    assert_epochs_match(history(records), summary(folder))


# ---------------------------------------------------------------- W&B not installed


def shadowed_wandb(root: Path) -> Path:
    """A folder whose ``wandb`` package fails to import as a missing one does (put it first on PYTHONPATH)."""
    package = root / "shadow" / "wandb"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError(\"No module named 'wandb'\", name='wandb')\n")
    return root / "shadow"


@pytest.mark.slow
@pytest.mark.cpu_only(reason="importing the tracker's package is host-side; the device changes nothing in it")
def test_without_wandb_installed_the_run_trains_with_one_warning_and_says_what_was_not_logged(
    fashion4: Path, tmp_path: Path
) -> None:
    env = {**offline_env(tmp_path), "PYTHONPATH": os.pathsep.join([str(shadowed_wandb(tmp_path)), str(REPO)])}
    proc = run_script(
        train_args(fashion4, tmp_path / "out", "run", "--device", "cpu", "--epochs", "1", "--log-wandb"), env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    warnings = [line for line in lines if line.startswith("warning: W&B")]
    assert len(warnings) == 1 and "requirements-track.txt" in warnings[0], proc.stdout[-3000:]
    assert lines[-1].startswith("not logged to W&B"), lines[-3:]
    assert len(summary(tmp_path / "out" / "run")) == 1
    assert not offline_runs(tmp_path / "out" / "run")

"""Where commands write: never over an input, never inside the data they read, never two results into one
path, and only where a file can be written (vtools/outputs.py). The refusals, one per command, are rows of
tests/scripts/test_one_line_errors.py; here are the shared check itself and the results that land where they should."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, run_script
from vtools.atomic import atomic_write_text
from vtools.cli.runner import command_main
from vtools.errors import RunFailed, UsageError
from vtools.outputs import Output, check_outputs

pytestmark = pytest.mark.cpu_only(reason="paths and files are host-side")


@pytest.mark.parametrize("spelling", ["data/x.csv", "data/./x.csv", "other/../data/x.csv", "link/x.csv"])
def test_an_input_is_refused_however_the_output_spells_it(tmp_path: Path, spelling: str) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "data" / "x.csv").write_text("kept")
    (tmp_path / "link").symlink_to(tmp_path / "data")
    said = f"--out {tmp_path / spelling} would write over the table {tmp_path / 'data' / 'x.csv'}, an input"
    with pytest.raises(UsageError, match=re.escape(said)):
        check_outputs([("the table", tmp_path / "data" / "x.csv")], [Output("--out", tmp_path / spelling)])
    assert (tmp_path / "data" / "x.csv").read_text() == "kept"


def test_beside_an_input_file_is_allowed_and_the_write_test_leaves_nothing(tmp_path: Path) -> None:
    """A model folder is passed as the files it is read from: writing another file beside them is fine (an
    exported model.onnx, results). The proof of writing leaves no file, and removes the folders it made."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    outputs = [Output("--out", tmp_path / "model" / "model.onnx"), Output("--report", tmp_path / "new" / "r", ("a",))]
    check_outputs([("the config", tmp_path / "model" / "config.json")], outputs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["config.json"]


def test_a_data_folder_holds_no_output(tmp_path: Path) -> None:
    (tmp_path / "data" / "cat").mkdir(parents=True)
    for inside in ("data", "data/cat", "data/cat/report", "data/new/r.csv"):
        with pytest.raises(UsageError, match="inside the data|is the data"):
            check_outputs([("the data", tmp_path / "data")], [Output("--report", tmp_path / inside, ())])
    check_outputs([("the data", tmp_path / "data")], [Output("--report", tmp_path / "database", ())])  # a sibling
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cat", "data"]


def test_two_outputs_on_one_path_are_refused(tmp_path: Path) -> None:
    """Two files on one path, or a file on one that a folder output writes; another file there is fine."""
    report = Output("--report", tmp_path / "R", ("overall.csv", "per_class.csv"))
    check_outputs([], [report, Output("--results-file", tmp_path / "R" / "results.csv")])
    for clash in (tmp_path / "R" / "overall.csv", tmp_path / "x" / ".." / "R" / "per_class.csv"):
        with pytest.raises(
            UsageError, match=re.escape(f"--report {tmp_path}/R and --results-file {clash} are one path")
        ):
            check_outputs([], [report, Output("--results-file", clash)])
    with pytest.raises(UsageError, match="are one path"):
        check_outputs([], [Output("a", tmp_path / "r.csv"), Output("b", tmp_path / "." / "r.csv")])


def test_a_folder_that_cannot_be_made_is_said_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(UsageError, match=rf"cannot create folder {tmp_path}/a_file/sub \(Not a directory\)"):
        check_outputs([], [Output("--out", tmp_path / "a_file" / "sub" / "r.csv")])
    with pytest.raises(UsageError, match="is a folder, not a file"):
        check_outputs([], [Output("--out", tmp_path)])
    with pytest.raises(UsageError, match="is a file; give a folder"):
        check_outputs([], [Output("--report", tmp_path / "a_file", ())])


def test_a_write_that_fails_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """The temporary file of an atomic write is made inside the guarded block: a folder gone (or never
    writable) between the check and the write is a run failure (exit 3), not an OSError."""
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(RunFailed, match="could not write .*a_file/r.csv .*r.csv was not created"):
        atomic_write_text(tmp_path / "a_file" / "r.csv", "rows")


@pytest.mark.parametrize(
    "name, label",
    [
        ("runs/a/model", "a"),
        ("runs/a/model/", "a"),
        ("local-dir:runs/a/model", "a"),
        ("runs/a/model/model.onnx", "a.onnx"),
        ("exports/resnet.onnx", "resnet.onnx"),
        ("models/tiny_vit_21m_512", "tiny_vit_21m_512"),
        ("resnet50.a1_in1k", "resnet50.a1_in1k"),
        ("hf-hub:timm/resnet18.a1_in1k", "resnet18.a1_in1k"),
    ],
)
def test_a_runs_model_folder_is_named_after_its_run(
    name: str, label: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vtools.models.create import model_label

    for folder in ("runs/a/model", "models/tiny_vit_21m_512"):
        (tmp_path / folder).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert model_label(name) == label


def _two_runs(tmp_path: Path, custom_model_dir: Path) -> list[str]:
    """Two training runs' model folders (each called model/, as train.py names them)."""
    models = [tmp_path / "runs" / run / "model" for run in ("a", "b")]
    for model in models:
        shutil.copytree(custom_model_dir, model)
    return [str(model) for model in models]


def test_inference_results_of_two_runs_do_not_replace_each_other(
    tmp_path: Path, custom_images: Path, custom_model_dir: Path
) -> None:
    """timm's default name, <model>-topk<K>, was model-topk1.csv for every run: the second run's results
    silently replaced the first's."""
    work = tmp_path / "work"
    work.mkdir()
    for model in _two_runs(tmp_path, custom_model_dir):
        proc = run_script(
            [str(REPO / "inference.py"), str(custom_images), "--model", model, "--device", "cpu"], cwd=work
        )
        assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in work.iterdir()) == ["a-topk1.csv", "b-topk1.csv"]
    assert all(len(pd.read_csv(work / name)) == 12 for name in ("a-topk1.csv", "b-topk1.csv"))


def test_class_reports_of_two_runs_get_a_folder_each(
    tmp_path: Path, custom_images: Path, custom_model_dir: Path
) -> None:
    models = _two_runs(tmp_path, custom_model_dir)
    report = tmp_path / "R"
    proc = run_script(["validate.py", str(custom_images), "--model", ",".join(models), "--report", str(report)])
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in report.iterdir()) == ["a", "b"]
    for run, model in zip("ab", models):
        assert pd.read_csv(report / run / "overall.csv")["model"].tolist() == [model]


def test_plot_draws_one_run_into_its_own_picture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not ./curves.png: that replaced whatever file of that name the current folder held."""

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.csv").write_text(
        "epoch,train_loss,eval_loss,eval_top1,lr\n0,1.0,0.9,50.0,0.1\n1,0.8,0.7,60.0,0.1\n"
    )
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "curves.png").write_text("someone else's file")
    monkeypatch.chdir(tmp_path / "work")
    assert command_main("plot")([str(run)]) == 0
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "work" / "curves.png").read_text() == "someone else's file"


# ---------------------------------------------------------------- a run folder's files are that run's


def _run_folder(root: Path, *files: str) -> Path:
    """A run folder as train.py leaves it: the files, and its ledger naming them."""
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / ".vtools-run.lock").write_text("\n".join(["123", *files]) + "\n")
    return root


@pytest.mark.cpu_only(reason="paths only")
def test_another_runs_files_are_refused_and_a_runs_own_readers_may_write_beside_them(tmp_path: Path) -> None:
    a = _run_folder(tmp_path / "runs" / "A", "summary.csv", "model/model.safetensors", "eval/per_class.csv")
    b = _run_folder(tmp_path / "runs" / "B", "summary.csv", "model/model.safetensors")
    reads_a = [("the model's model.safetensors", a / "model" / "model.safetensors")]
    for target, words in (
        (b / "summary.csv", f"would replace summary.csv of the run {b}"),
        (b / "model" / "model.safetensors", f"would replace model/model.safetensors of the run {b}"),
        (a / "eval" / "per_class.csv", f"would replace eval/per_class.csv of the run {a}"),  # even its own reader
        (b / "results.csv", f"is inside the run folder {b}, which this command does not read"),
    ):
        with pytest.raises(UsageError, match=re.escape(words)):
            check_outputs(reads_a, [Output("--results-file", target)])
        assert not target.exists() or target.read_text() != ""
    check_outputs(reads_a, [Output("--results-file", a / "results.csv")])  # beside what it reads: allowed
    check_outputs(reads_a, [Output("the run's picture", a / "summary.csv", refreshes_run_file=True)])
    # as train.py writes it: the model folder listed whole, not its files
    c = _run_folder(tmp_path / "runs" / "C", "summary.csv", "model/model.safetensors")
    (c / ".vtools-run.lock").write_text("123\nsummary.csv\nmodel\n")
    with pytest.raises(UsageError, match=re.escape(f"would replace model/model.safetensors of the run {c}")):
        check_outputs([("REPORT", c / "summary.csv")], [Output("--output", c / "model" / "model.safetensors")])
    check_outputs([("REPORT", c / "summary.csv")], [Output("--output", c / "model" / "model.onnx")])  # new file
    (b / ".vtools-run.lock").write_bytes(b"\xff\xfenot a ledger")  # damaged: every file there may be the run's
    with pytest.raises(UsageError, match="would replace summary.csv of the run"):
        check_outputs([("the model", b / "model" / "model.safetensors")], [Output("--output", b / "summary.csv")])


@pytest.mark.cpu_only(reason="paths only")
def test_a_folder_output_inside_another_run_is_refused_before_its_files_are_known(tmp_path: Path) -> None:
    """vtools shards' OUT names no files in advance: the folder itself must not land in a run folder it
    does not read, while one beside the runs is fine."""
    b = _run_folder(tmp_path / "runs" / "B", "summary.csv")
    with pytest.raises(UsageError, match=re.escape(f"OUT {b / 'shards'} is inside the run folder {b}")):
        check_outputs([("FOLDER", tmp_path / "data")], [Output("OUT", b / "shards", files=())])
    assert not (b / "shards").exists()
    check_outputs([("FOLDER", tmp_path / "data")], [Output("OUT", tmp_path / "runs" / "shards", files=())])

"""tools/mutation_score.py, the one command behind the documented mutation score: how it counts mutmut's
results (killed, survived, unreached, not run, equivalent), its exit code under --min, and that --run starts
mutmut from scratch on every group, touching no folder but mutmut's own."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.cpu_only(reason="a script reading files")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("mutation_score", REPO / "tools" / "mutation_score.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_results(folder: Path) -> Path:
    """mutmut's result file for loops.py: two killed (one by a timeout), one survivor, one no test reached,
    one not run, and a function outside the scope."""
    name = "vtools.evaluation.loops.x_topk_correct__mutmut_{}"
    codes = {name.format(1): 1, name.format(2): 0, name.format(3): 33, name.format(4): None, name.format(5): 36}
    codes["vtools.evaluation.loops.x_elsewhere__mutmut_1"] = 0
    meta = folder / "vtools" / "evaluation" / "loops.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    return folder


def test_the_score_counts_what_was_not_killed(tool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = fake_results(tmp_path / "mutants")
    assert tool.main(["--mutants", str(folder), "--min", "41", "--survivors"]) == 1
    out = capsys.readouterr().out
    assert "| `vtools/evaluation/loops.py` | 5 | 2 | 1 | 1 | 0 | 1 | 40.0 % |" in out
    assert "| **all** | 5 | 2 | 1 | 1 | 0 | 1 | **40.0 %** |" in out
    listed = [line for line in out.splitlines() if line.startswith("vtools.")]
    assert listed == [f"vtools.evaluation.loops.x_topk_correct__mutmut_{n}" for n in (2, 3, 4)]
    assert tool.main(["--mutants", str(folder), "--min", "40"]) == 0


def test_equivalent_mutants_leave_the_denominator(tool, tmp_path: Path) -> None:
    listed = tmp_path / "equivalents.txt"
    listed.write_text("# comment\nvtools.evaluation.loops.x_topk_correct__mutmut_2  # same behaviour\n\n")
    equivalents = tool.read_equivalents(listed)
    assert equivalents == {"vtools.evaluation.loops.x_topk_correct__mutmut_2": "same behaviour"}
    results = tool.read_results(fake_results(tmp_path / "mutants"))
    (row,) = tool.score_rows(results, equivalents)
    assert (row["killed"], row["equivalent"], row["score"]) == (2, 1, 50.0)


def test_every_listed_equivalent_is_in_scope_with_a_reason(tool) -> None:
    equivalents = tool.read_equivalents()
    assert equivalents
    assert [name for name in equivalents if not tool.in_scope(name)] == []
    assert [name for name, reason in equivalents.items() if len(reason) < 10] == []


def test_run_starts_mutmut_afresh_on_each_group(tool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(tool, "MUTMUT_FOLDER", tmp_path / "mutants")
    monkeypatch.setattr(tool.subprocess, "run", lambda command, **kwargs: calls.append(command))
    (tmp_path / "mutants").mkdir()
    (tmp_path / "mutants" / "stale.py.meta").write_text("{}")
    assert tool.main(["--run"]) == 2  # mutmut (stubbed here) wrote nothing
    assert not (tmp_path / "mutants").exists()
    assert [call[4:] for call in calls] == list(tool.GROUPS.values())
    assert all(call[:3] == ["mutmut", "run", "--max-children"] for call in calls)


def test_a_group_runs_and_scores_only_its_own_patterns(
    tool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    calls = []
    monkeypatch.setattr(tool, "MUTMUT_FOLDER", tmp_path / "mutants")

    def mutmut(command: list[str], **kwargs: object) -> None:  # writes one result of each group's module
        calls.append(command)
        meta = tmp_path / "mutants" / "vtools" / "train" / "recovery.py.meta"
        meta.parent.mkdir(parents=True, exist_ok=True)
        codes = {
            "vtools.train.recovery.x_recovery_saver__mutmut_1": 1,
            "vtools.train.loop.x__optimizer_step__mutmut_1": 0,
        }
        meta.write_text(json.dumps({"exit_code_by_key": codes}))

    monkeypatch.setattr(tool.subprocess, "run", mutmut)
    group = "epoch driver's decisions, recovery"
    assert tool.main(["--run", "--group", group, "--min", "100"]) == 0  # the other group's survivor is not counted
    assert [call[4:] for call in calls] == [tool.GROUPS[group]]
    assert "100.0 %" in capsys.readouterr().out


def test_run_refuses_another_folder(tool, tmp_path: Path) -> None:
    kept = tmp_path / "mine"
    kept.mkdir()
    with pytest.raises(SystemExit) as stopped:
        tool.main(["--run", "--mutants", str(kept)])
    assert stopped.value.code == 2 and kept.is_dir()

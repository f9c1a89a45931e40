"""Statement deletion: the mutation mutmut does not make. Each call whose result is unused (``ema.update(...)``,
``optimizer.step()``, ``load_state_dict(...)``, ``set_rng_state(...)``, ``barrier()``) is removed in turn, and
the tests that state its module's behaviour must fail.

    python3 tools/delete_calls.py                     # every call statement in SCOPE, then the table
    python3 tools/delete_calls.py --min 95 --jobs 2   # exit 1 under 95 %; two mutants at a time
    python3 tools/delete_calls.py --list              # the mutants only, nothing run
    python3 tools/delete_calls.py --only 'vtools/train/run.py::*' --tests FILE::TEST   # which test kills them?

mutmut changes operators, constants and arguments, so a deleted ``parts.ema.update(...)`` (the EMA keeps its
initial weights) is a bug it never plants. This pass parses each module in SCOPE, finds every expression
statement that is a call (its value thrown away: the call is there for its effect) inside the functions SCOPE
names, replaces it with ``pass`` in a copy of the tree, and runs the module's fast-tier test files there (then
the whole-run tests SCOPE names by node id, whatever their tier: the epoch driver's verbs only run in those). A
mutant is killed when a test fails or the run passes the timeout (the deletion hung the code); it survives when
every test passes. Equivalent deletions (a call whose effect no test can observe, e.g. a progress bar's
postfix) are listed with their reason in tests/data/deletion_equivalents.txt as ``<mutant id>  # reason``
and leave the denominator.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "tests" / "data" / "deletion_equivalents.txt"
TIMEOUT_S = 600

UNWRITABLE_LISTINGS = "test_an_unwritable_listings_folder_is_a_warning_and_the_run_goes_on"  # a whole process

# module -> (function qualname patterns, the fast-tier test files that state its behaviour)
SCOPE: dict[str, tuple[list[str], list[str]]] = {
    "vtools/train/loop.py": (
        ["train_one_epoch", "_optimizer_step", "TrainComponents.*"],
        ["tests/train/test_loop.py", "tests/train/test_loop_ema.py", "tests/train/test_resume.py"],
    ),
    "vtools/train/resume.py": (["restore", "start_at_epoch", "load_scheduler_state"], ["tests/train/test_resume.py"]),
    "vtools/train/recipe.py": (
        ["build_*", "init_head", "load_optimizer_state"],
        ["tests/train/test_recipe_values.py", "tests/train/test_recipe_multilabel.py", "tests/cli/test_train_flags.py"]
        + ["tests/train/test_resume.py", "tests/data/test_augment_ops.py"],
    ),
    "vtools/train/checkpoint.py": (["*"], ["tests/train/test_resume.py", "tests/train/test_recovery.py"]),
    "vtools/data/sampling.py": (["*"], ["tests/data/test_sampling.py"]),
    "vtools/data/balanced_sampling.py": (["*"], ["tests/data/test_balanced_sampling.py"]),
    "vtools/train/recovery.py": (["*"], ["tests/train/test_recovery.py", "tests/train/test_loop.py"]),
    "vtools/data/color_jitter.py": (["*"], ["tests/data/test_train_augment.py", "tests/train/test_loop_fast_paths.py"]),
    "vtools/data/train_augment.py": (["*"], ["tests/data/test_train_augment.py"]),
    "vtools/cli/timm_compat.py": (
        ["*"],
        [f"tests/cli/test_{name}.py" for name in ("timm_compat", "train_flags", "eval_flags")],
    ),
    "vtools/cli/config.py": (
        ["*"],
        ["tests/cli/test_config.py", "tests/cli/test_timm_compat.py", "tests/cli/test_train_flags.py"]
        + ["tests/options/test_train_job.py", "tests/data/test_augment_ops.py"],
    ),
    "vtools/train/run.py": (  # the epoch driver: its verbs are whole runs, so the scripts' tests state them
        ["TrainingRun.*", "set_up", "multi_label_metric", "resume_position", "open_data", "keep_global_batch"]
        + ["check_same_experiment", "start_epoch", "share_batchnorm_statistics"],
        ["tests/train/test_run.py", "tests/train/test_run_checks.py"]
        + [f"tests/scripts/test_{name}.py" for name in ("schedule", "run_safety", "train", "recovery")],
    ),
    **{
        f"vtools/data/readers/{name}.py": (["*"], [f"tests/data/readers/test_{test}.py" for test in tests])
        for name, tests in {
            "scan": ("scan", "split_scan"),
            "path_table": ("path_table", "label_file"),
            "split_scan": ("split_scan", "listing", "label_file", "listing.py::" + UNWRITABLE_LISTINGS),
            "listing": ("listing", "split_scan"),
        }.items()
    },
}


@dataclass(frozen=True)
class Mutant:
    """One call statement deleted: ``id`` names it by module, function and call text (stable when lines move)."""

    module: str
    function: str
    line: int  # 1-based, the statement's first line
    end_line: int
    text: str

    @property
    def id(self) -> str:
        return f"{self.module}::{self.function}::{self.text}"


def call_statements(source: str, module: str, patterns: list[str]) -> list[Mutant]:
    """Every expression statement that is a call, inside the functions (or methods, as ``Class.method``)
    whose qualified names match ``patterns``; a call repeated in one function gets ``#2``, ``#3`` ..."""
    tree = ast.parse(source)
    found: list[Mutant] = []
    seen: dict[tuple[str, str], int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
                    collect(child, name)
                visit(child, f"{name}.")

    def own_statements(function: ast.AST):
        """The function's nodes, less those of functions and classes nested in it (visited under their own name)."""
        pending = list(ast.iter_child_nodes(function))
        while pending:
            node = pending.pop()
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                yield node
                pending.extend(ast.iter_child_nodes(node))

    def collect(function: ast.AST, name: str) -> None:
        for node in sorted(own_statements(function), key=lambda node: getattr(node, "lineno", 0)):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                text = ast.unparse(node.value)
                count = seen[(name, text)] = seen.get((name, text), 0) + 1
                shown = text if count == 1 else f"{text} #{count}"
                found.append(Mutant(module, name, node.lineno, node.end_lineno or node.lineno, shown))

    visit(tree, "")
    return sorted(found, key=lambda mutant: mutant.line)


def deleted(source: str, mutant: Mutant) -> str:
    """``source`` with the mutant's statement replaced by ``pass`` at its indentation."""
    lines = source.splitlines(keepends=True)
    first = lines[mutant.line - 1]
    indent = first[: len(first) - len(first.lstrip())]
    return "".join(lines[: mutant.line - 1] + [f"{indent}pass\n"] + lines[mutant.end_line :])


def all_mutants(root: Path = ROOT) -> list[Mutant]:
    mutants = []
    for module, (patterns, _) in SCOPE.items():
        mutants += call_statements((root / module).read_text(encoding="utf-8"), module, patterns)
    return mutants


def copy_tree(root: Path, into: Path) -> None:
    """The files of ``root`` git tracks or would (what a clean clone holds, and new files) copied into ``into``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (root / name).is_file():
            shutil.copy2(root / name, target)


def run_mutant(mutant: Mutant, tree: Path, tests: list[str], timeout: float = TIMEOUT_S) -> str:
    """'killed', 'survived' or 'no tests': the module's tests run on the tree with the statement deleted.
    Test files run their fast tier; tests named by node id (``file::test[param]``) run whatever their tier,
    after the files pass (whole runs, for the code only they reach)."""
    path = tree / mutant.module
    original = path.read_text(encoding="utf-8")
    path.write_text(deleted(original, mutant), encoding="utf-8")
    files = [test for test in tests if "::" not in test]
    named = [test for test in tests if "::" in test]
    stages = ([["-m", "not slow", *files]] if files else []) + ([named] if named else [])
    base = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    codes = []
    try:
        for stage in stages:
            codes.append(subprocess.run(base + stage, cwd=tree, capture_output=True, timeout=timeout).returncode)
            if codes[-1] not in (0, 5):  # 5: pytest collected no test
                return "killed"
    except subprocess.TimeoutExpired:
        return "killed"
    finally:
        path.write_text(original, encoding="utf-8")
    return "survived" if 0 in codes else "no tests"


def read_equivalents(path: Path = EQUIVALENTS) -> dict[str, str]:
    """mutant id -> why no test can observe the deletion, from lines ``id  # reason``."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, reason = line.rpartition("  # ")
            found[name.strip()] = reason.strip()
    return found


def score(outcomes: dict[str, str], equivalents: dict[str, str]) -> tuple[float, list[str]]:
    """Killed over the mutants that are not equivalent (100 when there are none), and the survivors."""
    counted = {name: outcome for name, outcome in outcomes.items() if name not in equivalents}
    survivors = sorted(name for name, outcome in counted.items() if outcome != "killed")
    killed = len(counted) - len(survivors)
    return (100.0 * killed / len(counted) if counted else 100.0), survivors


def table(outcomes: dict[str, str], equivalents: dict[str, str]) -> str:
    """Per module: mutants run, killed, survived (or no tests), equivalent (listed, not run), score; as markdown."""
    rows: dict[str, dict[str, int]] = {}
    for name, outcome in [*outcomes.items(), *((name, "equivalent") for name in equivalents)]:
        counts = rows.setdefault(name.split("::")[0], {"killed": 0, "survived": 0, "equivalent": 0})
        counts["killed" if outcome == "killed" else "equivalent" if outcome == "equivalent" else "survived"] += 1
    lines = ["| module | mutants | killed | survived | equivalent | score |", "|---|---|---|---|---|---|"]
    for module, counts in rows.items():
        judged = counts["killed"] + counts["survived"]
        value = 100.0 * counts["killed"] / judged if judged else 100.0
        cells = [f"`{module}`", str(judged + counts["equivalent"]), *map(str, counts.values()), f"{value:.1f} %"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--min", type=float, default=0.0, help="exit 1 when the score is under this percent")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at a time, each in its own tree copy")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument(
        "--only", action="append", metavar="GLOB", help="only mutant ids matching GLOB (repeat for more)"
    )
    parser.add_argument(
        "--tests",
        nargs="+",
        metavar="TEST",
        help="run these test files or node ids instead of SCOPE's (which test kills a survivor?)",
    )
    args = parser.parse_args(argv)
    globs = args.only or ["*"]
    chosen = lambda name: any(fnmatch.fnmatchcase(name, glob) for glob in globs)  # noqa: E731
    mutants = [m for m in all_mutants() if chosen(m.id)]
    if args.list:
        print("\n".join(f"{m.module}:{m.line}  {m.id}" for m in mutants))
        return 0
    equivalents = read_equivalents()
    todo = [m for m in mutants if m.id not in equivalents]
    with tempfile.TemporaryDirectory(prefix="delete-calls-") as work:
        trees = [Path(work) / f"tree{i}" for i in range(max(1, args.jobs))]
        for tree in trees:
            copy_tree(ROOT, tree)
        chunks = [todo[i :: len(trees)] for i in range(len(trees))]

        def run_chunk(index: int) -> dict[str, str]:
            found = {}
            for mutant in chunks[index]:
                found[mutant.id] = run_mutant(mutant, trees[index], args.tests or SCOPE[mutant.module][1])
                print(
                    f"{found[mutant.id]:>9}  {mutant.module}:{mutant.line}  {mutant.function}: {mutant.text}",
                    flush=True,
                )
            return found

        outcomes: dict[str, str] = {}
        with ThreadPoolExecutor(len(trees)) as pool:
            for found in pool.map(run_chunk, range(len(trees))):
                outcomes.update(found)
    value, survivors = score(outcomes, equivalents)
    listed = {name: why for name, why in equivalents.items() if chosen(name)}
    print(table(outcomes, listed))
    print(f"statement deletion: {len(outcomes)} mutants run, {len(listed)} equivalent, score {value:.1f} %")
    for name in survivors:
        print(f"  survived: {name}")
    return 1 if value < args.min else 0


if __name__ == "__main__":
    sys.exit(main())

"""The mutation score of the code that decides the numbers a user reads, measured with mutmut.

    python3 tools/mutation_score.py --run --min 90   # a fresh mutmut run on SCOPE (fast tier), then the table;
                                                     # exit 1 under 90 %
    python3 tools/mutation_score.py --survivors      # the table again, and the survivors, from mutants/
    python3 tools/mutation_score.py --run --group "folder scanner and index"   # one group only

GROUPS names the functions (mutmut's mutant-name patterns, in the files pyproject.toml's [tool.mutmut] lists):
top-k and the metrics, the best-epoch rule, the class report, the per-sample outcomes and their gather, the training and
validation samplers, the training step, the schedule driver, the checkpoint and resume state, the export's
parity check, the readers' labels, the epoch driver's decisions, recovery, the fused training
augmentation and colour jitter, the timm-compatibility refusals and YAML configs, and the folder scanner and
index. Each mutant faces the fast-tier test files pyproject.toml lists
(mutmut runs only the tests that reach the mutated function).

A mutant is killed when a test failed (or ran past mutmut's timeout: the change hung the code); it survived
when every test passed. Equivalent mutants (a change no test can observe, since the behaviour is the same)
are listed with their reason in tests/data/mutation_equivalents.txt and leave the denominator; any other
survivor, any mutant no test reaches and any mutant mutmut did not run (a run that broke off) count against
the score.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
C = "\u01c1"  # mutmut's separator between a class and its method in mutant names
SAMPLE = "[05]"  # mutant numbers ending in 0 or 5: one in five, for the largest functions
# the epoch driver's decisions (vtools/train/run.py): which epochs validate, when a run stops, where a resume
# starts, what it refuses; set_up, train_epoch, save_epoch and finish only call other modules in order and are
# checked by deleting those calls (tools/delete_calls.py) and by the whole-run tests
RUN_DECISIONS = ["validates", "epochs", "continues", "stopped_within", "stops_after", "stops_early", "epochs_trained"]
RUN_CHECKS = [
    "multi_label_metric",
    "stop_check_every",
    "resume_position",
    "check_same_label_kind",
    "check_labels_fit",
    "keep_global_batch",
    "check_same_experiment",
    "check_finite",
    "ema_on_device",
    "eval_model",
]
GROUPS = {  # run in this order: what decides reported numbers first
    "top-k, metrics, samplers": [
        "vtools.evaluation.loops.x_topk_correct__mutmut_*",
        "vtools.evaluation.metrics.x_averaged_scores__mutmut_*",
        "vtools.evaluation.metrics.x__ratio__mutmut_*",
        "vtools.evaluation.metrics.x_per_class_scores__mutmut_*",
        f"vtools.evaluation.metrics.x{C}ClassCounts{C}*",
        "vtools.evaluation.best_epoch.x_*__mutmut_*",
        f"vtools.data.sampling.x{C}EpochSampler{C}*",
        "vtools.data.sampling.x_sample_seed__mutmut_*",
        f"vtools.runtime.distributed.x{C}ShardSampler{C}*",
        "vtools.runtime.distributed.x_gather_rows__mutmut_*",
        "vtools.runtime.distributed.x_all_reduce_sum__mutmut_*",
    ],
    "export parity, readers' labels": [
        "vtools.deploy.export.x_compare__mutmut_*",
        "vtools.data.readers.wds.x__label_of__mutmut_*",
        f"vtools.data.readers.wds.x{C}ShardSamples{C}locate__mutmut_*{SAMPLE}",
        f"vtools.data.readers.hfds.x__check_labels__mutmut_*{SAMPLE}",
        f"vtools.data.readers.hfds.x{C}TableSamples{C}locate__mutmut_*",
        "vtools.data.readers.folder.x_read_class_map__mutmut_*",
        "vtools.data.readers.folder.x_imagenet_class_map__mutmut_*",
        "vtools.data.readers.folder.x_labelled_images__mutmut_*",
        "vtools.data.readers.scan.x__walk__mutmut_*",
        "vtools.data.readers.scan.x_scan_folder__mutmut_*",
        f"vtools.data.readers.scan.x{C}EntryList{C}*",
        f"vtools.data.readers.path_table.x{C}PathTable{C}__init____mutmut_*",
        f"vtools.data.readers.path_table.x{C}PathTable{C}__getitem____mutmut_*",
        f"vtools.data.readers.path_table.x{C}PathTableBuilder{C}*",
        f"vtools.data.readers.listing.x{C}SplitScan{C}is_current__mutmut_*",
        "vtools.data.readers.split_scan.x__kept_or_new__mutmut_*",
        "vtools.data.readers.split_scan.x__new_scan__mutmut_*",
        "vtools.data.readers.split_scan.x__joined__mutmut_*",
        "vtools.data.readers.split_scan.x_find_class_folders__mutmut_*",
    ],
    "training step": [
        "vtools.train.loop.x_accumulation_divisor__mutmut_*",
        "vtools.train.loop.x__optimizer_step__mutmut_*",
        "vtools.train.loop.x__check_finite__mutmut_*",
        f"vtools.train.loop.x{C}TrainComponents{C}loss__mutmut_*",
    ],
    "schedule driver, checkpoint and resume state": [
        "vtools.train.recipe.x_scaled_lr__mutmut_*",
        "vtools.train.recipe.x_build_scheduler__mutmut_*",
        "vtools.train.recipe.x_mean_lr__mutmut_*",
        "vtools.train.resume.x_start_at_epoch__mutmut_*",
        "vtools.train.resume.x_restore__mutmut_*",
        "vtools.train.resume.x_training_state__mutmut_*",
        "vtools.train.resume.x_rank_state__mutmut_*",
        "vtools.train.resume.x_scheduler_state__mutmut_*",
        "vtools.train.resume.x_load_scheduler_state__mutmut_*",
        "vtools.train.checkpoint.x_portable_rng__mutmut_*",
        "vtools.train.checkpoint.x_native_rng__mutmut_*",
        "vtools.train.checkpoint.x_load_training_state__mutmut_*",
        "vtools.train.checkpoint.x_host_copy__mutmut_*",
        f"vtools.train.checkpoint.x{C}CheckpointManager{C}*",
    ],
    "epoch driver's decisions, recovery": [
        f"vtools.train.run.x{C}EpochSettings{C}of__mutmut_*",
        *(f"vtools.train.run.x{C}TrainingRun{C}{name}__mutmut_*" for name in RUN_DECISIONS),
        *(f"vtools.train.run.x_{name}__mutmut_*" for name in RUN_CHECKS),
        "vtools.train.recovery.x*",
    ],
    "fused training augmentation, colour jitter": [
        "vtools.data.color_jitter.x*",
        f"vtools.data.train_augment.x*{SAMPLE}",
    ],
    "timm-compatibility refusals, YAML": [
        "vtools.cli.timm_compat.x*",
        f"vtools.cli.config.x*{SAMPLE}",
    ],
    "folder scanner and index": [
        "vtools.data.readers.scan.x*",
        "vtools.data.readers.path_table.x*",
        "vtools.data.readers.split_scan.x*",
        "vtools.data.readers.listing.x*",
    ],
    "class report, outcomes, epoch loop (one in five)": [
        f"vtools.evaluation.class_report.*__mutmut_*{SAMPLE}",
        f"vtools.evaluation.predictions.x{C}PredictionLog{C}*{SAMPLE}",
        f"vtools.train.loop.x_train_one_epoch__mutmut_*{SAMPLE}",
    ],
}
SCOPE = [pattern for patterns in GROUPS.values() for pattern in patterns]
EQUIVALENTS = ROOT / "tests" / "data" / "mutation_equivalents.txt"
MUTMUT_FOLDER = ROOT / "mutants"  # where mutmut works: its copy of the tree and its results
KILLED = {1, 3, 36, 24, -24, 152, 255}  # a test failed, or the mutant hung (timeout)
SURVIVED = {0}
NO_TESTS = {5, 33}


def read_equivalents(path: Path = EQUIVALENTS) -> dict[str, str]:
    """mutant name -> why it is equivalent, from lines ``name  # reason``."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, reason = line.partition("#")
            found[name.strip()] = reason.strip()
    return found


def in_scope(name: str, patterns: list[str] = SCOPE) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def read_results(mutants: Path, patterns: list[str] = SCOPE) -> dict[str, dict[str, int | None]]:
    """module path -> {mutant name: mutmut exit code} for the mutants ``patterns`` name (all of SCOPE)."""
    results = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        module = meta.relative_to(mutants).as_posix().removesuffix(".meta")
        codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        results[module] = {name: code for name, code in codes.items() if in_scope(name, patterns)}
    return results


def score_rows(results: dict[str, dict[str, int | None]], equivalents: dict[str, str]) -> list[dict[str, object]]:
    rows = []
    for module, codes in results.items():
        if not codes:
            continue
        counts = Counter()
        for name, code in codes.items():
            if name in equivalents:
                counts["equivalent"] += 1
            elif code in KILLED:
                counts["killed"] += 1
            elif code in SURVIVED:
                counts["survived"] += 1
            elif code in NO_TESTS:
                counts["no tests"] += 1
            elif code is None:
                counts["not run"] += 1
            else:
                counts["other"] += 1
        judged = len(codes) - counts["equivalent"]
        score = 100 * counts["killed"] / judged if judged else 100.0
        rows.append({"module": module, "mutants": len(codes), **counts, "score": score})
    return rows


def survivors(results: dict[str, dict[str, int | None]], equivalents: dict[str, str]) -> list[str]:
    return [
        name
        for codes in results.values()
        for name, code in codes.items()
        if name not in equivalents and code not in KILLED
    ]


def overall_score(rows: list[dict[str, object]]) -> float:
    """Killed over all mutants but the equivalent ones, across the rows."""
    killed = sum(int(row.get("killed", 0)) for row in rows)
    judged = sum(int(row["mutants"]) - int(row.get("equivalent", 0)) for row in rows)
    return 100 * killed / judged if judged else 100.0


def markdown(rows: list[dict[str, object]]) -> str:
    columns = ["module", "mutants", "killed", "survived", "no tests", "equivalent", "not run", "score"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [f"`{row['module']}`"] + [str(row.get(c, 0)) for c in columns[1:-1]] + [f"{row['score']:.1f} %"]
        lines.append("| " + " | ".join(cells) + " |")
    total = Counter()
    for row in rows:
        total.update({k: v for k, v in row.items() if isinstance(v, int)})
    cells = ["**all**"] + [str(total.get(c, 0)) for c in columns[1:-1]] + [f"**{overall_score(rows):.1f} %**"]
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", default=str(MUTMUT_FOLDER), help="mutmut's folder to read (default: ./mutants)")
    parser.add_argument("--min", type=float, default=0.0, help="exit 1 when the overall score is below this")
    parser.add_argument("--survivors", action="store_true", help="list the mutants that count against the score")
    parser.add_argument(
        "--run", action="store_true", help="delete --mutants and run mutmut on SCOPE first (about 25 mutants a minute)"
    )
    parser.add_argument(
        "--group",
        action="append",
        choices=list(GROUPS),
        help="run and score only this group (repeat for more; default: every group)",
    )
    args = parser.parse_args(argv)
    groups = {name: GROUPS[name] for name in args.group} if args.group else GROUPS
    if args.run and Path(args.mutants).resolve() != MUTMUT_FOLDER:
        parser.error(f"--run writes mutmut's results to {MUTMUT_FOLDER}; leave --mutants out")
    if args.run:  # from scratch: mutmut keeps results across edits to files it does not track
        shutil.rmtree(MUTMUT_FOLDER, ignore_errors=True)
    for group, patterns in groups.items() if args.run else ():
        print(f"mutmut: {group}", flush=True)
        subprocess.run(["mutmut", "run", "--max-children", str(os.cpu_count() or 1), *patterns], cwd=ROOT, check=False)
    results = read_results(Path(args.mutants), [pattern for patterns in groups.values() for pattern in patterns])
    if not results:
        print(f"no mutmut results in {args.mutants}: run `mutmut run` first", file=sys.stderr)
        return 2
    equivalents = read_equivalents()
    rows = score_rows(results, equivalents)
    print(markdown(rows))
    if args.survivors:
        print("\n".join(survivors(results, equivalents)))
    return 1 if overall_score(rows) < args.min else 0


if __name__ == "__main__":
    sys.exit(main())

"""Write tests/data/timm_options.json: every option of timm's train.py, validate.py, inference.py and benchmark.py.

The list is read from timm's own scripts (their ``add_argument`` calls, parsed,
never imported or run), so the compatibility test checks vtools against the
reference's full list rather than against a list we typed:

    python tools/extract_timm_options.py /path/to/pytorch-image-models [--commit SHA]

Each option keeps its flags, dest, default, nargs, type, action, const and
choices. Defaults that are expressions (``3. / 4.``) are evaluated; those
that name timm objects (``action=utils.ParseKwargs``) are kept as source text.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPTS = ("train.py", "validate.py", "inference.py", "benchmark.py")
OUTPUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "timm_options.json"
_ARITHMETIC = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.List, ast.Tuple, ast.Dict, ast.operator, ast.unaryop)


def _value(node: ast.expr) -> Any:
    """A literal (or arithmetic on literals) as its value; anything else as its source text."""
    if all(isinstance(part, (*_ARITHMETIC, ast.expr_context)) for part in ast.walk(node)):
        return eval(compile(ast.Expression(node), "<timm option>", "eval"), {"__builtins__": {}})  # literals only
    return {"source": ast.unparse(node)}


def _dest(flags: list[str], keywords: dict[str, Any]) -> str:
    if "dest" in keywords:
        return keywords["dest"]
    long = next((flag for flag in flags if flag.startswith("--")), flags[0])
    return long.lstrip("-").replace("-", "_")


def options_of(source: str) -> list[dict[str, Any]]:
    """The options a script declares, in declaration order."""
    options = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "add_argument":
            continue
        flags = [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
        keywords = {kw.arg: _value(kw.value) for kw in node.keywords if kw.arg not in ("help", "metavar")}
        if isinstance(keywords.get("type"), dict):
            keywords["type"] = keywords["type"]["source"]
        positional = not flags[0].startswith("-")
        default = keywords.get("default", False if keywords.get("action") == "store_true" else None)
        options.append(
            {
                "flags": flags,
                "dest": flags[0] if positional else _dest(flags, keywords),
                "default": default,
                **{key: keywords[key] for key in ("nargs", "type", "action", "const", "choices") if key in keywords},
            }
        )
    options.sort(key=lambda option: option["flags"] != ["-c", "--config"])  # train.py's config parser first
    return options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timm_checkout", type=Path, help="a git checkout of pytorch-image-models")
    parser.add_argument("--commit", default="HEAD", help="read the scripts at this commit (default: HEAD)")
    args = parser.parse_args(argv)

    def git(*command: str) -> str:
        return subprocess.run(
            ["git", "-C", str(args.timm_checkout), *command], check=True, capture_output=True, text=True
        ).stdout

    sha = git("rev-parse", args.commit).strip()
    version = git("show", f"{sha}:timm/version.py").split("=")[-1].strip().strip("'\"")
    data = {
        "timm_commit": sha,
        "timm_commit_date": git("show", "-s", "--format=%cs", sha).strip(),
        "timm_version": version,
        "scripts": {script: options_of(git("show", f"{sha}:{script}")) for script in SCRIPTS},
    }
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    counts = ", ".join(f"{script} {len(options)}" for script, options in data["scripts"].items())
    print(f"{OUTPUT}: timm {version} at {sha[:10]}: {counts} options", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

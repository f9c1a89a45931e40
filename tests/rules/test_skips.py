"""A test never skips on the outcome of the code it tests, enforced on the test sources.

A skip that depends on a result ("the run finished before the signal arrived", "onnxruntime matched bit for
bit") turns the very bug the test guards against into a skip: a comparison that always passes makes such a
test skip instead of fail. So ``pytest.skip`` may only sit directly under an ``if`` that asks about the
host (a device or a dependency present, cores available), whose names are the device under test, modules,
or locals that a host probe assigned; and it gives its reason as a literal string. Everything else is a
violation. ``pytest.importorskip`` and ``skipif`` marks decide before the test runs and are always fine.
"""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.cpu_only(reason="reads the test sources")

MODULES = {"torch", "os", "sys", "shutil", "importlib", "dev", "platform"}
DEVICE_NAMES = {"device", "device_type"}
BUILTINS = {"len", "not", "any", "all"}
PROBES = {"usable_cores", "find_spec", "which", "device_count", "cpu_count", "is_available", "getenv", "get"}


def skip_violations(source: str, name: str = "<test>") -> list[str]:
    """Every ``pytest.skip`` in ``source`` that is not a host question, as 'name:line: why'."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not _is_skip(node):
            continue
        function = _enclosing(node, parents, ast.FunctionDef)
        statement = parents.get(node)
        branch = parents.get(statement)
        why = None
        if not isinstance(branch, ast.If) or statement not in branch.body:
            why = "not directly under an if that asks about the host"
        elif not (node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            why = "its reason is not a literal string"
        else:
            probed = _probed_locals(function) if function is not None else set()
            allowed = MODULES | DEVICE_NAMES | BUILTINS | probed
            used = {n.id for n in ast.walk(branch.test) if isinstance(n, ast.Name)}
            if used - allowed:
                why = f"skips on {', '.join(sorted(used - allowed))}, not on the host"
        if why:
            found.append(f"{name}:{node.lineno}: {why}")
    return found


def _is_skip(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "skip"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "pytest"
    )


def _enclosing(node: ast.AST, parents: dict, kind: type) -> ast.AST | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, kind):
            return node
    return None


def _probed_locals(function: ast.FunctionDef) -> set[str]:
    """Locals assigned only from host probes (``cores = usable_cores()``)."""
    probed, other = set(), set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            call = node.value
            callee = call.func if isinstance(call, ast.Call) else None
            attr = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", None)
            (probed if attr in PROBES else other).update(names)
    return probed - other


def test_no_test_skips_on_the_outcome_of_the_code_it_tests() -> None:
    violations = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        violations += skip_violations(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    assert not violations, "skips that depend on a result (fail instead):\n" + "\n".join(violations)


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("def test(proc):\n    if proc.returncode == 0:\n        pytest.skip('finished early')\n", True),
        ("def test():\n    ok = compare()\n    if ok:\n        pytest.skip('matched')\n", True),
        ("def test():\n    pytest.skip('always')\n", True),
        ("def test(device):\n    if device.type == 'cpu':\n        pytest.skip(reason)\n", True),
        ("def test():\n    if not torch.cuda.is_available():\n        pytest.skip('needs cuda')\n", False),
        (
            "def test():\n    cores = usable_cores()\n    if len(cores) < 2:\n        pytest.skip('needs 2 cores')\n",
            False,
        ),
        ("def test():\n    if importlib.util.find_spec('x') is None:\n        pytest.skip('needs x')\n", False),
        ("def test(device):\n    if device.type == 'cpu':\n        pytest.skip('cpu takes no index')\n", False),
    ],
)
def test_the_rule_tells_host_questions_from_outcomes(source: str, bad: bool) -> None:
    assert bool(skip_violations(source)) is bad

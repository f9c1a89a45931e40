"""A script run in a child of the warm interpreter (tests/warm_python.py) ends as the same script started
fresh: same exit code, same stdout, same stderr, byte for byte, for each way a Python program can end."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, WARM_ENV
from tests.warm_python import WarmPython, can_run_warm

# slow: the warm server it starts imports torch, torchvision and timm (a process the marker's scan cannot see)
pytestmark = [pytest.mark.cpu_only(reason="runs the interpreter itself; no device is involved"), pytest.mark.slow]

ENDINGS = {
    "prints-and-returns": "import sys\nprint('out', sys.argv[1:])\nprint('err', file=sys.stderr)\n",
    "exit-code": "import sys\nprint('partial', end='')\nsys.exit(3)\n",
    "exit-message": "import sys\nsys.exit('train.py: error: a one-line reason')\n",
    "traceback": "def inner():\n    raise ValueError('planted')\n\ninner()\n",
    "atexit": "import atexit\natexit.register(lambda: print('atexit ran'))\nprint('body ran')\n",
    "thread": (
        "import threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread finished', flush=True))).start()\n"
        "print('main returned', flush=True)\n"
    ),
    "interrupt": "raise KeyboardInterrupt\n",
    "where-am-i": (
        "import os, sys, tempfile\n"
        "print(__name__, os.getcwd(), sys.path[0], os.environ.get('VTOOLS_PLANTED'), tempfile.gettempdir())\n"
    ),
    "multiprocessing-spawn": (
        "import multiprocessing as mp\n"
        "def square(x):\n    return x * x\n"
        "if __name__ == '__main__':\n"
        "    with mp.get_context('spawn').Pool(1) as pool:\n        print(pool.map(square, [2, 3]))\n"
    ),
}


@pytest.fixture(scope="module")
def warm() -> Iterator[WarmPython]:
    """A server of its own (the suite's runs only with VTOOLS_TESTS_WARM_PYTHON=1)."""
    server = WarmPython(REPO, WARM_ENV)
    yield server
    server.finish()


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_warm_child_ends_as_a_fresh_process(ending: str, warm: WarmPython, tmp_path: Path) -> None:
    script = tmp_path / f"{ending.replace('-', '_')}.py"
    script.write_text(ENDINGS[ending])
    env = {**WARM_ENV, "VTOOLS_PLANTED": "seen"}
    args = [str(script), "one", "two"]
    assert warm.can_run(args, env)
    fresh = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    child = warm.run(args, env, tmp_path, timeout=120)
    assert (child.returncode, child.stdout, child.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_the_vtools_module_runs_warm_as_it_runs_fresh(warm: WarmPython) -> None:
    env = {**WARM_ENV}
    fresh = subprocess.run(
        [sys.executable, "-m", "vtools", "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    child = warm.run(["-m", "vtools", "--help"], env, REPO, timeout=300)
    assert (child.returncode, child.stdout, child.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode == 0 and "train" in fresh.stdout


def test_a_child_past_its_timeout_is_killed(warm: WarmPython, tmp_path: Path) -> None:
    """As subprocess.run does: the child is killed and TimeoutExpired carries what it printed. (The bound is
    the point of the test; the sleep is 100 times longer.)"""
    script = tmp_path / "sleeps.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(100)\n")
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        warm.run([str(script)], dict(WARM_ENV), tmp_path, timeout=1)
    assert stopped.value.output == "started\n"


@pytest.mark.parametrize(
    "args, change, runs_warm",
    [
        (["train.py", "--help"], {}, True),
        (["-m", "vtools", "env"], {"VTOOLS_EMU_NPU_CHIP": "910A"}, True),
        (["train.py"], {"PYTEST_CURRENT_TEST": "another test", "RANK": "1", "MASTER_ADDR": "10.0.0.2"}, True),
        (["-c", "print(1)"], {}, False),  # code, not a script
        (["-X", "importtime", "train.py"], {}, False),  # an interpreter flag
        (["-m", "torch.distributed.run", "train.py"], {}, False),  # another module
        (["train.py"], {"HF_HUB_OFFLINE": "1"}, False),  # huggingface_hub reads it at import: recorded
        (["train.py"], {"TIMM_FUSED_ATTN": "0"}, False),  # timm reads it at import: recorded
        (["train.py"], {"PYTHONPATH": "/elsewhere"}, False),  # the interpreter (and torch's backend autoload)
        (["train.py"], {"OMP_NUM_THREADS": "2"}, False),  # OpenMP reads it when torch loads
    ],
)
def test_what_runs_warm(args: list[str], change: dict[str, str], runs_warm: bool, warm: WarmPython) -> None:
    assert warm.can_run(args, {**WARM_ENV, **change}) is runs_warm


def test_a_removed_variable_counts_as_a_change() -> None:
    present = {**WARM_ENV, "HF_HOME": "/somewhere"}
    assert not can_run_warm(["train.py"], {k: v for k, v in present.items() if k != "HF_HOME"}, present, {"HF_HOME"})
    assert can_run_warm(["train.py"], {k: v for k, v in present.items() if k != "HF_HOME"}, present, set())


def test_the_server_follows_what_the_test_process_changed(warm: WarmPython) -> None:
    """torch sets TORCHINDUCTOR_CACHE_DIR in the test process once it has compiled: the server restarts under
    it (once) instead of every later script starting fresh; a variable no import reads leaves it running."""
    running = warm.server
    warm.follow({**WARM_ENV, "RANK": "1"})
    assert warm.server is running and warm.server is not None
    changed = {**WARM_ENV, "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor-elsewhere"}
    warm.follow(changed)
    assert warm.server is None and warm.env == changed
    assert warm.can_run(["train.py"], changed) and not warm.can_run(["train.py"], dict(WARM_ENV))
    warm.follow(dict(WARM_ENV))  # back as the module's other tests expect it

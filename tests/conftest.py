"""Shared fixtures: every device-facing test runs on cpu, the emulated npu and cuda when present.

The emulated npu (tests/emulated_npu) is a PrivateUse1 backend named "npu"
whose memory is host memory; it drives the same code path a real Ascend
device does, which is the point: no test here mocks ``torch.npu`` alone.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The suite runs one test process per core (-n auto), each starting scripts whose torch keeps an OpenMP
# thread per core spinning while it waits: two such processes on two cores steal each other's cores
# (two trainings at once ran 7.7x slower here: 115 s against 15 s). Passive waiting ends that, and changes
# no result (same threads, same split of the work); set before torch loads OpenMP, inherited by every
# script a test starts. An environment that sets it keeps its own. docs/testing.md has the measurement.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One intra-op thread in every test process and script, unless a test clears it: the cpu budget runs fewer
# threads on a busy host (vtools/runtime/host_load.py), and a suite on two cores is always busy, so two runs a
# test compares bit for bit could otherwise sum in different orders (seen: wds against folder training, 1 thread
# against 2). The tests of the default budget clear it (tests/runtime/test_cpu_budget.py, test_host_load.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.warm_python import WarmPython  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EMULATED_NPU_MODULE = "tests.emulated_npu"

DEVICE_TYPES = ["cpu", "npu"] + (["cuda"] if torch.cuda.is_available() else [])
# A second device, for the runs that must not assume device 0 (a rank's device under torchrun).
SECOND_DEVICES = ["npu:1"] + (["cuda:1"] if torch.cuda.device_count() > 1 else [])


def load_emulated_npu() -> None:
    """Register the emulated npu in this process (built and cached on first use)."""
    import tests.emulated_npu  # noqa: F401


AUTOLOAD_DIR = REPO / "tests" / "emulated_npu" / "autoload"


def autoload_env() -> dict[str, str]:
    """Environment in which ``import torch`` loads the emulated npu through torch's backend autoload,
    as it loads torch_npu: no ``--device-modules`` needed (see tests/emulated_npu/autoload)."""
    return {"PYTHONPATH": os.pathsep.join([str(REPO), str(AUTOLOAD_DIR)])}


def device_flags(device_type: str) -> list[str]:
    """Command-line flags that select ``device_type`` in a script run from the repo root."""
    flags = ["--device", device_type]
    if device_type.split(":")[0] == "npu":
        flags += ["--device-modules", EMULATED_NPU_MODULE]
    return flags


def pytest_configure(config: pytest.Config) -> None:
    """Register the emulated npu before any test runs backward: autograd sizes its per-device work
    queues at its first backward, and a device registered later makes every npu backward in this
    process fail (so in-process npu tests would pass or fail with the order the tests ran in).
    The markers (cpu_only, npu_only, slow) are declared in pyproject.toml. Then the environment the warm
    interpreter starts with is taken (loading the emulator may have put ninja on PATH)."""
    load_emulated_npu()
    WARM_ENV.update({**os.environ, "PYTHONPATH": str(REPO)})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test that starts a process (a script run as a user runs it, directly, through a
    helper of its module or through a fixture of its module or conftest): the fast tier,
    ``pytest -m "not slow"``, is the in-process tests. An in-process test that grows slow may carry
    ``@pytest.mark.slow`` itself."""
    starters: dict[Path, set[str]] = {}
    conftest_starters = functions_that_start_processes(Path(__file__))
    for item in items:
        path = Path(str(item.fspath))
        if path not in starters:
            starters[path] = functions_that_start_processes(path, conftest_starters)
        reached = starters[path] | conftest_starters
        if item.originalname in reached or set(getattr(item, "fixturenames", ())) & reached:
            item.add_marker(pytest.mark.slow)


PROCESS_STARTERS = {"run_script", "Popen", "check_output", "check_call"}


def functions_that_start_processes(path: Path, known: set[str] = frozenset()) -> set[str]:
    """Names of the module-level functions (tests, helpers, fixtures) of ``path`` that start a process,
    directly or through each other, ``known`` or ``subprocess.run``."""
    import ast

    functions = {n.name: n for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.FunctionDef)}

    def calls(function: ast.FunctionDef) -> set[str]:
        names = {arg.arg for arg in function.args.args}  # fixtures it requests
        for node in ast.walk(function):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute):
                    is_subprocess = isinstance(func.value, ast.Name) and func.value.id == "subprocess"
                    names.add("Popen" if is_subprocess else func.attr)
                elif isinstance(func, ast.Name):
                    names.add(func.id)
        return names

    reached = (PROCESS_STARTERS | set(known)) - {"run"}
    called = {name: calls(function) for name, function in functions.items()}
    changed = True
    while changed:
        changed = False
        for name, names in called.items():
            if name not in reached and names & reached:
                reached.add(name)
                changed = True
    return reached & set(functions) | (set(known) & reached)


@pytest.fixture(params=DEVICE_TYPES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """A resolved device of each type the suite covers."""
    from vtools.runtime.device import resolve_device

    if request.param == "npu":
        load_emulated_npu()
    return resolve_device(request.param)


# The emulated npu posing as an Atlas training chip (Ascend 910A): no bfloat16, and no Inf/NaN mode (its
# arithmetic saturates; overflow shows only in its float-status flag). The overflow checks run on it besides
# every device type, so that each body shows the same outcome on a chip that saturates and on those that don't.
NPU_910A = "npu-910A"
CHIP_DEVICES = [*DEVICE_TYPES, NPU_910A]


def chip_environment(device_type: str) -> dict[str, str]:
    """The environment that makes a script's npu the chip ``device_type`` names (nothing for other types)."""
    return {"VTOOLS_EMU_NPU_CHIP": "910A"} if device_type == NPU_910A else {}


def chip_device_flags(device_type: str) -> list[str]:
    """:func:`device_flags` for an entry of :data:`CHIP_DEVICES` (with :func:`chip_environment`)."""
    return device_flags("npu" if device_type == NPU_910A else device_type)


def scaled_batches(device: torch.device, scales: list[float], seed: int, size: int = 4) -> list[Any]:
    """Batches of 6 random features and 3 classes, one per entry of ``scales``, its inputs multiplied by it
    (1: ordinary data; 1e5: past float16's range): the overflow tests' data."""
    from vtools.data.loaders import Batch

    generator = torch.Generator().manual_seed(seed)
    batches = []
    for index, scale in enumerate(scales):
        images = torch.randn(size, 6, generator=generator) * scale
        targets = torch.randint(0, 3, (size,), generator=generator)
        batches.append(Batch(images.to(device), targets.to(device), torch.arange(index * size, (index + 1) * size)))
    return batches


@pytest.fixture(params=CHIP_DEVICES)
def chip_device(request: pytest.FixtureRequest) -> Iterator[torch.device]:
    """A resolved device of each type the suite covers, then the npu posing as a 910A for the test."""
    from vtools.runtime.device import resolve_device

    if request.param.startswith("npu"):
        load_emulated_npu()
    if request.param != NPU_910A:
        yield resolve_device(request.param)
        return
    from tests.emulated_npu.chips import posing_as

    with posing_as("910A"):
        yield resolve_device("npu")


def run_script(
    args: list[str],
    env: dict[str, str | None] | None = None,
    timeout: float = 600,
    cwd: Path | None = None,
    file_permissions_apply: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``python <args>`` (a script, ``-m module`` or ``-c code``) from the repository root and capture its
    output. The environment is this one with PYTHONPATH set to the repository, then ``env`` on top: a value
    of None removes that variable. With ``file_permissions_apply`` the script meets file modes as a user
    does even where the tests run as root (:func:`as_a_user`). With ``VTOOLS_TESTS_WARM_PYTHON=1`` a script
    or ``-m vtools`` runs in a child of this process's warm interpreter where that cannot change its outcome
    (tests/warm_python.py)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full_env = {key: value for key, value in full_env.items() if value is not None}
    warm = warm_python()
    if warm is not None and not file_permissions_apply:
        warm.follow({**os.environ, "PYTHONPATH": str(REPO)})
        if warm.can_run(args, full_env):
            return warm.run(args, full_env, cwd or REPO, timeout)
    command = [sys.executable, *args]
    if file_permissions_apply:
        command = as_a_user(command)
    return subprocess.run(command, cwd=cwd or REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


_WARM: list[WarmPython] = []
# The warm server's environment: this process's once the suite is configured, before any test runs.
WARM_ENV: dict[str, str] = {}


def warm_python() -> WarmPython | None:
    """This test process's warm interpreter (tests/warm_python.py), started on first use, where
    ``VTOOLS_TESTS_WARM_PYTHON=1`` asks for it; None (a new interpreter per script) otherwise. Opt-in until a
    whole suite passes through it: a full run with it on failed tests that pass alone (docs/testing.md)."""
    if os.environ.get("VTOOLS_TESTS_WARM_PYTHON") != "1":
        return None
    if not _WARM:
        _WARM.append(WarmPython(REPO, dict(WARM_ENV)))
    return _WARM[0]


ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # for every run of a weights comparison: thread counts change float sums


def start_script(args: list[str], env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    """Start ``python <args>`` from the repository root, unbuffered, in a session of its own (a signal to
    its process group reaches its loader workers, as a scheduler's does), its output read as text lines."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **(env or {})}
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "start_new_session": True, **popen}
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=full_env, text=True, **options)


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (from /proc; Linux only, like torchrun's workers here)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def rank_of(pid: int) -> int | None:
    """The torchrun rank (RANK) a process was started with, None for one started without."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [entry.split(b"=", 1)[1] for entry in environ if entry.startswith(b"RANK=")]
    return int(ranks[0]) if ranks else None


def as_a_user(command: list[str]) -> list[str]:
    """``command`` run so that file modes apply to it. Root reads and writes whatever a mode says; without
    the two capabilities that let it (setpriv drops them from the bounding set, so the new process never
    holds them), root is checked as the files' owner like anyone else: a folder made read-only with chmod
    refuses its writes. A user who is not root needs nothing."""
    if os.geteuid() != 0:
        return command
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]


def file_permissions_can_apply() -> bool:
    """Whether :func:`as_a_user` can make this host's file modes apply (not root, or root with setpriv)."""
    return os.geteuid() != 0 or shutil.which("setpriv") is not None


def assert_usage_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit code 2 (unusable input), exactly one line on stderr, no traceback, and the expected words."""
    return assert_one_line_error(proc, 2, *fragments)


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    """Exit ``code``, exactly one line on stderr, no traceback, and the expected words."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# ---------------------------------------------------------------- broken device backends, as installed on a host


def broken_torch_npu_package(root: Path) -> None:
    """An installed torch_npu 2.14.0 whose import fails as it does without CANN (put ``root`` on PYTHONPATH)."""
    package = root / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text(
        "raise ImportError('libascendcl.so: cannot open shared object file: No such file or directory')\n"
    )
    dist_info = root / "torch_npu-2.14.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.14.0\n")


def broken_autoload_backend(root: Path) -> None:
    """A distribution that registers a torch.backends entry point which raises, like torch_npu w/o CANN
    (put ``root`` on PYTHONPATH)."""
    (root / "fake_ascend_backend.py").write_text(
        "def autoload():\n    raise ImportError('libhccl.so: cannot open shared object file')\n"
    )
    dist_info = root / "torch_npu-2.14.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.14.0\n")
    (dist_info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = fake_ascend_backend:autoload\n")


@pytest.fixture(scope="session")
def torch_npu_wheel() -> Path:
    """The real torch_npu 2.14.0 wheel, unpacked, never installed (tests/npu_wheel.py): fetched once per machine
    into a cache folder (the first test process to ask runs ``pip download`` for it; the others wait and read
    it). Skipped only where the package registry cannot be reached, and never under CI, which must reach it."""
    from tests import npu_wheel

    try:
        return npu_wheel.unpacked_wheel()
    except npu_wheel.RegistryUnreachable as err:
        if not os.environ.get("CI"):
            pytest.skip("the real torch_npu wheel is not at hand: the package registry cannot be reached")
        raise AssertionError(f"CI must reach the package registry for the torch_npu wheel: {err}") from err


# ---------------------------------------------------------------- small real-format data and model folders

SYNSETS = ["n01440764", "n01443537", "n01484850"]  # tench, goldfish, great white shark


def write_image_set(root: Path, classes: list[str], per_class: int = 4, seed: int = 0) -> Path:
    """ImageNet-style folders of JPEG and PNG images of varied sizes, with class-dependent colours."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for class_index, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            height, width = int(rng.integers(40, 96)), int(rng.integers(40, 96))
            pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
            pixels[..., class_index % 3] //= 4  # a colour cue per class
            ext = "jpg" if i % 2 == 0 else "png"
            Image.fromarray(pixels).save(folder / f"{name}_{i}.{ext}")
    return root


def write_model_folder(
    folder: Path, num_classes: int, label_names: list[str] | None = None, model_name: str = "test_resnet", seed: int = 0
) -> Path:
    """A random-init timm model saved as a model folder (config.json + model.safetensors)."""
    import timm
    from timm.models import save_for_hf

    torch.manual_seed(seed)
    model = timm.create_model(model_name, num_classes=num_classes, pretrained=False)
    config = {"label_names": label_names} if label_names else None
    save_for_hf(model, str(folder), model_config=config, safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def synset_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_set(tmp_path_factory.mktemp("imagenet_val"), SYNSETS)


@pytest.fixture(scope="session")
def imagenet_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1000-class model folder, like ./model_ckpts/tiny_vit_21m_512 in the Ascend examples."""
    return write_model_folder(tmp_path_factory.mktemp("model_ckpts") / "test_resnet_in1k", 1000)


@pytest.fixture(scope="session")
def custom_classes() -> list[str]:
    return ["cat", "dog", "fox"]


@pytest.fixture(scope="session")
def custom_images(tmp_path_factory: pytest.TempPathFactory, custom_classes: list[str]) -> Path:
    return write_image_set(tmp_path_factory.mktemp("custom"), custom_classes, seed=1)


@pytest.fixture(scope="session")
def custom_model_dir(tmp_path_factory: pytest.TempPathFactory, custom_classes: list[str]) -> Path:
    return write_model_folder(tmp_path_factory.mktemp("custom_model") / "model", 3, custom_classes)


# ---------------------------------------------------------------- training runs on a 4-class subset

CLASSES = ["bag", "sneaker", "t-shirt_top", "trouser"]


@pytest.fixture(scope="session")
def fashion4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four classes of the shipped subset (60 train / 15 val each): small enough for every device."""
    return fashion_subset(tmp_path_factory.mktemp("fashion4"), 60, 15)


def fashion_subset(root: Path, train: int, val: int) -> Path:
    """The first ``train`` / ``val`` images of each of the CLASSES of the shipped subset, in ``root``."""
    for split, count in (("train", train), ("val", val)):
        for name in CLASSES:
            files = sorted((REPO / "data/fashion-mnist-mini" / split / name).glob("*.png"))[:count]
            (root / split / name).mkdir(parents=True)
            for file in files:
                shutil.copy(file, root / split / name / file.name)
    return root


def train_args(data: Path, out: Path, name: str | None, *extra: str) -> list[str]:
    """The quick-start config on ``data`` with a tiny model; ``name`` None leaves the folder to train.py."""
    experiment = ["--experiment", name] if name is not None else ["--experiment", ""]
    return [
        "train.py",
        "-c",
        "configs/fashion_mnist_cpu.yaml",
        "--data-dir",
        str(data),
        "--model",
        "test_resnet",
        "--epochs",
        "3",
        "--batch-size",
        "32",
        "--lr",
        "0.005",
        "--workers",
        "1",
        "--output",
        str(out),
        *experiment,
        *extra,
    ]


def summary(run: Path) -> list[dict[str, str]]:
    with (run / "summary.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def weights(path: Path, key: str = "state_dict") -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)[key]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def free_port() -> int:
    """A TCP port nothing listens on now, for a rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(args: list[str], processes: int = 2) -> list[str]:
    """``python -m torch.distributed.run`` with ``processes`` ranks on this host, then ``args``."""
    return [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(processes),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        *args,
    ]


def acting_dests(parser: argparse.ArgumentParser, not_options: set[str] = frozenset({"help"})) -> set[str]:
    """The dests of ``parser``'s flags that change a run: all but ``not_options`` and the timm flags
    accepted as no-ops or refused. What a completeness test compares with the typed options' fields."""
    from vtools.cli.timm_compat import no_op_flags, refused_flags

    inert = {*refused_flags(parser), *no_op_flags(parser)}
    return {
        action.dest
        for action in parser._actions
        if action.dest not in not_options and max(action.option_strings or [action.dest], key=len) not in inert
    }


@pytest.fixture
def folder_listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders ``os.scandir`` lists in this process from here on (a listing of a split is what the
    folder reader's caches are there to save), with no split listing kept from an earlier test."""
    from vtools.data.readers import split_scan

    seen: list[str] = []
    listing = os.scandir

    def counted(path: Any = ".") -> Any:
        if isinstance(path, (str, bytes, os.PathLike)):
            seen.append(os.fsdecode(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", counted)
    monkeypatch.setattr(split_scan, "_kept", type(split_scan._kept)())
    return seen


def fashion_pairs(root: Path, train: int, val: int, seed: int = 0) -> Path:
    """A multi-label set from the shipped subset's CLASSES: ``train`` / ``val`` images per split, each two
    28x28 images side by side (56 wide, 28 high), labelled with the set of their classes (one when both are
    of one class), as ``<root>/<split>/images/*.png`` and ``<root>/<split>/labels.csv``. The left image's
    class goes round the CLASSES (every class is in a split of 4 or more), the right one's is drawn; both
    images are drawn from their class, all from ``seed``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        files = {name: sorted((REPO / "data/fashion-mnist-mini" / split / name).glob("*.png")) for name in CLASSES}
        (root / split / "images").mkdir(parents=True)
        rows = ["image,labels"]
        for index in range(count):
            left, right = CLASSES[index % len(CLASSES)], CLASSES[int(rng.integers(len(CLASSES)))]
            halves = [
                np.asarray(Image.open(files[name][int(rng.integers(len(files[name])))]).convert("L"))
                for name in (left, right)
            ]
            name = f"images/{index:05d}.png"
            Image.fromarray(np.hstack(halves)).save(root / split / name)
            rows.append(f"{name},{' '.join(sorted({left, right}))}")
        (root / split / "labels.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root

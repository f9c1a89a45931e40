"""Shared fixtures: every device-facing test runs on cpu, the emulated npu and cuda when present.

The emulated npu (tests/emulated_npu) is a PrivateUse1 backend named "npu"
whose memory is host memory; it drives the same code path a real Ascend
device does, which is the point: no test here mocks ``torch.npu`` alone.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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

    A device-facing test runs on every device type unless it says why not, with one of these markers
    (tests/test_source_tree.py enforces it)."""
    config.addinivalue_line("markers", "cpu_only(reason): a device-facing test that runs on cpu only, and why")
    config.addinivalue_line("markers", "npu_only(reason): a device-facing test that runs on npu only, and why")
    load_emulated_npu()


@pytest.fixture(params=DEVICE_TYPES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """A resolved device of each type the suite covers."""
    from vtools.runtime.device import resolve_device

    if request.param == "npu":
        load_emulated_npu()
    return resolve_device(request.param)


def run_script(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 600, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run ``python <args>`` from the repository root and capture its output."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd or REPO, env=full_env, capture_output=True, text=True, timeout=timeout
    )


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
    root = tmp_path_factory.mktemp("fashion4")
    for split, count in (("train", 60), ("val", 15)):
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

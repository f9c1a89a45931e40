"""The host-memory estimate checked before any loader starts (vtools/data/memory_estimate.py,
vtools/models/activation_memory.py): it refuses what cannot fit, in one line naming the size, what it
would need and a batch size that fits, and it lets the shipped runs through. The refusals as a user meets
them are rows of tests/scripts/test_one_line_errors.py (block "host memory")."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch

from tests.conftest import REPO

pytestmark = pytest.mark.cpu_only(reason="host memory and shapes on the meta device: no device work")

DATA = REPO / "data" / "fashion-mnist-mini"
GiB = 1 << 30


def _fashion(split: str):
    from vtools.data.datasets import FileSamples
    from vtools.data.readers.folder import labelled_images

    found = labelled_images(DATA / split)
    return FileSamples(found.entries.paths, found.labels)


def _quick_start_need(input_size: tuple[int, int, int] = (3, 32, 32)):
    """What the quick start (configs/fashion_mnist_cpu.yaml: resnet10t at 32 px, one worker on this
    2-core host) holds: training and validation loaders, activations, gradients and optimizer state."""
    from vtools.data.memory_estimate import LoaderUse, host_memory_need
    from vtools.data.transforms import data_config_for
    from vtools.models.activation_memory import activation_bytes_per_image, training_state_bytes

    model = timm.create_model("resnet10t", num_classes=10)
    config = data_config_for(model, {"input_size": input_size, "crop_pct": 1.0})
    loaders = [
        LoaderUse("training", config, _fashion("train"), training=True),
        LoaderUse("validation", config, _fashion("val")),
    ]
    activations = lambda: activation_bytes_per_image(model, input_size, training=True)  # noqa: E731
    return host_memory_need(loaders, torch.device("cpu"), 1, activations, training_state_bytes(model))


def test_the_quick_start_needs_little_and_is_let_through() -> None:
    from vtools.data.memory_estimate import available_memory, check_fits

    need = _quick_start_need()
    assert 1 << 20 < need.at(64) < GiB // 4  # a few tens of MiB: not absurdly pessimistic
    assert need.part("model activations", 64) > 0 and need.part("gradients and optimizer state", 64) > 0
    check_fits(need, 64, (3, 32, 32), available_memory())  # no refusal


def test_an_input_that_cannot_fit_is_refused_naming_size_and_need() -> None:
    from vtools.data.memory_estimate import check_fits
    from vtools.errors import UsageError

    need = _quick_start_need((3, 100_000, 100_000))
    assert need.at(1) > 100 * GiB  # one image is 30 GB as uint8 before anything else
    with pytest.raises(UsageError) as refused:
        check_fits(need, 64, (3, 100_000, 100_000), 16 * GiB)
    message = str(refused.value)
    assert message.startswith("input size 3x100000x100000 at batch size 64 needs about ")
    assert "TiB of host memory" in message and "but 16.0 GiB is available" in message
    assert "not even one image fits: use a smaller input size" in message


def test_a_refusal_names_the_largest_batch_that_fits() -> None:
    from vtools.data.memory_estimate import MemoryNeed, check_fits
    from vtools.errors import UsageError

    need = MemoryNeed()
    need.add("batches", fixed=GiB, per_image=100 << 20)
    check_fits(need, 10, (3, 224, 224), 2 * GiB + 1)  # 1 GiB + 10 x 100 MiB fits
    with pytest.raises(UsageError, match=r"needs about 4\.1 GiB .* --batch-size 10 would fit"):
        check_fits(need, 32, (3, 224, 224), 2 * GiB + 1)


def test_available_memory_is_the_lower_of_meminfo_and_a_containers_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vtools.data import memory_estimate

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:    8000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    monkeypatch.setattr(memory_estimate, "MEMINFO", meminfo)
    monkeypatch.setattr(memory_estimate, "CGROUP", cgroup)
    assert memory_estimate.available_memory() == 8_000_000 * 1024  # no cgroup files: MemAvailable
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("100\n")
    assert memory_estimate.available_memory() == 8_000_000 * 1024  # no limit
    (cgroup / "memory.max").write_text(f"{GiB}\n")
    assert memory_estimate.available_memory() == GiB - 100
    meminfo.unlink()
    assert memory_estimate.available_memory() == GiB - 100


def test_unknown_memory_skips_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vtools.data import memory_estimate

    monkeypatch.setattr(memory_estimate, "MEMINFO", tmp_path / "none")
    monkeypatch.setattr(memory_estimate, "CGROUP", tmp_path / "none")
    assert memory_estimate.available_memory() is None
    memory_estimate.check_fits(_quick_start_need((3, 100_000, 100_000)), 64, (3, 100_000, 100_000), None)


def test_activations_grow_with_the_pixels_and_training_keeps_more() -> None:
    from vtools.models.activation_memory import activation_bytes_per_image

    model = timm.create_model("test_resnet", num_classes=3)
    small = activation_bytes_per_image(model, (3, 64, 64), training=False)
    large = activation_bytes_per_image(model, (3, 128, 128), training=False)
    trained = activation_bytes_per_image(model, (3, 64, 64), training=True)
    assert small and large and trained
    assert 3.5 < large / small < 4.5  # four times the pixels
    assert trained > 2 * small
    assert all(p.device.type == "cpu" for p in model.parameters())  # the model itself is left as it was


class _ReadsAValue(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float(x.sum())  # a value, which a meta tensor does not have


def test_a_model_the_meta_device_cannot_run_leaves_activations_out() -> None:
    from vtools.models.activation_memory import activation_bytes_per_image

    assert activation_bytes_per_image(_ReadsAValue(), (3, 8, 8), training=False) is None

"""vtools/models/checkpoint_weights.py: which weights a checkpoint gives, and their average, in the arithmetic
of timm's avg_checkpoints.py (ascending metric order, float64 sums, divided, clamped to float32, stored as
float32, integer buffers too). The expected values are worked out by hand from small
checkpoints built here."""

from __future__ import annotations

import errno
import io
from pathlib import Path

import pytest
import torch

from vtools.errors import UsageError
from vtools.models.checkpoint_weights import (
    average_weights,
    check_same_model,
    check_weights_name,
    checkpoint_metric,
    checkpoint_weights,
    read_training_checkpoint,
    sha256_of,
    torch_save,
    without_aux_bn,
    write_weights,
)
from vtools.models.weights import cast_integer_buffers, fit_problems

pytestmark = pytest.mark.cpu_only(reason="reads and writes checkpoint files on the host; runs nothing on a device")


def test_the_metric_is_timms_metric_key_or_its_named_entry_of_metrics() -> None:
    assert checkpoint_metric({"metric": 71.5}) == 71.5
    assert checkpoint_metric({"metrics": {"top1": 70.0, "loss": 1.2}, "metric_name": "loss"}) == 1.2
    assert checkpoint_metric({"best_metric": 80.0}) is None  # the run's best, not this checkpoint's
    assert checkpoint_metric({"metric": torch.tensor([71.5])}) == 71.5


@pytest.mark.parametrize(
    ("metric", "words"), [("abc", "its metric is 'abc'"), (torch.tensor([1.0, 2.0]), "a tensor of 2 values")]
)
def test_a_metric_that_is_not_one_number_is_one_line(metric: object, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        checkpoint_metric({"metric": metric}, "c.pth.tar")


def test_ema_weights_come_first_and_wrapper_prefixes_go(tmp_path: Path) -> None:
    plain, ema = torch.ones(2), torch.full((2,), 3.0)
    checkpoint = {"state_dict": {"module.fc.weight": plain}, "state_dict_ema": {"fc.weight": ema}}
    assert torch.equal(checkpoint_weights(checkpoint, tmp_path, use_ema=True)["fc.weight"], ema)
    assert torch.equal(checkpoint_weights(checkpoint, tmp_path, use_ema=False)["fc.weight"], plain)
    no_ema = {"state_dict": {"_orig_mod.module.fc.weight": plain}}  # compiled around DDP
    assert list(checkpoint_weights(no_ema, tmp_path, use_ema=True)) == ["fc.weight"]
    with pytest.raises(UsageError, match="no state dict of tensors"):
        checkpoint_weights({"epoch": 3}, tmp_path / "c.pth.tar", use_ema=True)


def test_the_average_is_float64_sums_stored_as_float32() -> None:
    values = ([1e8, 1.0], [1.0, 2.0], [-1e8, 4.0])  # float32 sums would lose the 1 next to 1e8 (spacing 8 there)
    counts = (10, 20, 33)
    states = [
        {"w": torch.tensor(w), "count": torch.tensor(n), "big": torch.tensor([big], dtype=torch.float64)}
        for w, n, big in zip(values, counts, (3e38, 3e38, 9e38))
    ]
    averaged = average_weights(states)
    assert averaged["w"].dtype == torch.float32  # as timm's
    assert averaged["count"].dtype == torch.float32  # as timm's too: the loaders cast counts back
    assert averaged["w"].tolist() == [torch.tensor(1 / 3).item(), torch.tensor(7 / 3).item()]
    assert averaged["count"].item() == 21.0
    assert averaged["big"].item() == torch.finfo(torch.float32).max  # 5e38, clamped to float32's range


def test_aux_bn_layers_are_dropped_and_nothing_else() -> None:
    state = {"bn1.weight": torch.ones(1), "bn1.aux_bn.0.weight": torch.ones(1), "fc.bias": torch.ones(1)}
    assert list(without_aux_bn(state)) == ["bn1.weight", "fc.bias"]


@pytest.mark.parametrize("safetensors", [False, True])
def test_weights_written_are_read_back_equal_and_hashed(tmp_path: Path, safetensors: bool) -> None:
    state = {"conv.weight": torch.randn(4, 3, 3, 3).to(memory_format=torch.channels_last), "n": torch.tensor(5)}
    path = tmp_path / ("w.safetensors" if safetensors else "w.pth")
    write_weights(state, path, safetensors)
    if safetensors:
        from safetensors.torch import load_file

        back = load_file(str(path))
    else:
        back = read_training_checkpoint(path)
    assert all(torch.equal(back[key], state[key]) for key in state)
    import hashlib

    assert sha256_of(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert not list(tmp_path.glob(".*"))  # written atomically: no temporary left


def test_checkpoints_of_two_models_are_refused() -> None:
    head = [{"fc.weight": torch.ones(10, 4)}, {"fc.weight": torch.ones(16, 4)}]
    with pytest.raises(UsageError, match=r"a and b hold different models \(fc.weight \(10, 4\) vs \(16, 4\)\)"):
        check_same_model(head, [Path("a"), Path("b")])
    with pytest.raises(UsageError, match="fc.weight is in only one of them"):
        check_same_model([{"fc.weight": torch.ones(1)}, {"head.weight": torch.ones(1)}], [Path("a"), Path("b")])
    check_same_model([{"fc.weight": torch.ones(2)}, {"fc.weight": torch.zeros(2)}], [Path("a"), Path("b")])


def test_a_name_that_says_the_other_format_is_refused() -> None:
    with pytest.raises(UsageError, match="name it avg.safetensors"):
        check_weights_name("--output", Path("avg.pth"), safetensors=True)
    with pytest.raises(UsageError, match="add --safetensors"):
        check_weights_name("--output", Path("avg.safetensors"), safetensors=False)
    check_weights_name("--output", Path("avg.pth.tar"), safetensors=False)


def test_a_legacy_checkpoint_is_read(tmp_path: Path) -> None:
    path = tmp_path / "old.pth.tar"
    torch.save({"state_dict": {"w": torch.ones(2)}, "metric": 3.0}, path, _use_new_zipfile_serialization=False)
    assert checkpoint_metric(read_training_checkpoint(path)) == 3.0


class FullDisk(io.RawIOBase):
    """A stream on a disk with no room left."""

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_under_torch_save_is_the_oserror_it_was() -> None:
    with pytest.raises(OSError) as caught:  # torch alone says "enforce fail at inline_container.cc"
        torch_save({"w": torch.ones(1000)}, FullDisk())
    assert caught.value.errno == errno.ENOSPC


def test_float_counts_are_cast_to_the_models_integer_buffers_and_nothing_else() -> None:
    expected = {"bn.num_batches_tracked": torch.tensor(0), "bn.weight": torch.ones(2)}
    timm_averaged = {"bn.num_batches_tracked": torch.tensor(7.0), "bn.weight": torch.ones(2)}
    cast = cast_integer_buffers(expected, timm_averaged)
    assert cast["bn.num_batches_tracked"].dtype == torch.int64 and cast["bn.num_batches_tracked"].item() == 7
    assert not fit_problems(expected, cast)
    integer_weights = {"bn.num_batches_tracked": torch.tensor(7), "bn.weight": torch.ones(2, dtype=torch.int64)}
    assert fit_problems(expected, cast_integer_buffers(expected, integer_weights))  # still refused

"""Work done once instead of every epoch changes no result: training images decoded once per loader
process, validation batches decoded once, the next epoch started where the host's cores are free, best
written as a second name of the numbered checkpoint, checkpoint copies made inside the kernel."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, assert_same_weights, device_flags, summary, train_args, weights
from vtools.atomic import atomic_copy
from vtools.cli.runner import command_main
from vtools.data import datasets
from vtools.data.datasets import DecodedImages, FileSamples, ImageFiles
from vtools.data.loaders import Batch, DeviceLoader, eval_device_loader
from vtools.data.sampling import SeededSamples
from vtools.data.transforms import eval_transform
from vtools.errors import RunFailed
from vtools.runtime.device import has_streams, kind_of
from vtools.train import assemble

VAL = REPO / "data/fashion-mnist-mini/val"


def _train_transform():
    from vtools.cli.train_flags import build_parser
    from vtools.cli.typed import typed_options
    from vtools.options.train_job import TrainJob
    from vtools.train.recipe import build_train_transform

    args = build_parser().parse_args(["--scale", "0.5", "1.0", "--hflip", "0.5", "--color-jitter", "0.4"])
    return build_train_transform(
        typed_options(TrainJob, args).augment, {"input_size": (3, 24, 24), "mean": (0.5,) * 3, "std": (0.5,) * 3}
    )


def _counting_decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    opened: list[str] = []
    real = datasets.open_image

    def counting_open_image(source, mode, name=None):
        opened.append(str(source))
        return real(source, mode, name)

    monkeypatch.setattr(datasets, "open_image", counting_open_image)
    return opened


@pytest.mark.cpu_only(reason="decoding happens in host processes; the device sees the same batches")
def test_kept_training_images_give_the_same_augmented_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the decoded images kept, a later epoch reads no file and yields exactly the samples (random
    augmentation included) that decoding again would give."""
    paths = sorted(VAL.rglob("*.png"))[:40]
    fresh = SeededSamples(ImageFiles(paths, None, _train_transform(), "RGB"), seed=3)
    kept_images = DecodedImages(FileSamples(paths), _train_transform(), "RGB", keep_bytes=1 << 20)
    kept = SeededSamples(kept_images, seed=3)
    opened = _counting_decodes(monkeypatch)
    for epoch in range(3):
        before = len(opened)
        for index in range(len(paths)):
            ours, reference = kept[(epoch, index)], fresh[(epoch, index)]
            assert torch.equal(ours[0], reference[0]) and ours[1:] == reference[1:], (epoch, index)
        assert len(opened) - before == len(paths) * (2 if epoch == 0 else 1)  # only the reference decodes


@pytest.mark.cpu_only(reason="decoding happens in host processes")
def test_a_training_set_too_large_to_keep_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = sorted(VAL.rglob("*.png"))[:10]
    images = DecodedImages(FileSamples(paths), _train_transform(), "RGB", keep_bytes=5 * 28 * 28 * 3)
    opened = _counting_decodes(monkeypatch)
    for _ in range(2):
        for index in range(len(paths)):
            images[index]
    assert len(opened) == 2 * len(paths)
    assert images._kept == {}  # what had been kept before the set overflowed is let go


def _val_loader(device: torch.device, keep_bytes: int, workers: int = 1) -> DeviceLoader:
    config = {
        "input_size": (3, 28, 28),
        "mean": (0.5,) * 3,
        "std": (0.25,) * 3,
        "interpolation": "bilinear",
        "crop_pct": 1.0,
        "crop_mode": "center",
    }
    dataset = ImageFiles(sorted(VAL.rglob("*.png"))[:70], None, eval_transform(config), "RGB")
    return eval_device_loader(
        dataset, 32, device, workers, config, channels_last=False, on_bad=None, persistent=True, keep_bytes=keep_bytes
    )


def _passes(loader: DeviceLoader, count: int) -> list[list[torch.Tensor]]:
    return [[batch.images.cpu() for batch in loader] for _ in range(count)]


def test_kept_validation_batches_equal_decoded_ones(device: torch.device) -> None:
    """Replayed validation batches are the ones the workers decode, normalized on the device; after the
    first pass the workers are not asked for any."""
    kept, reference = _val_loader(device, keep_bytes=64 << 20), _val_loader(device, keep_bytes=0)
    ours, theirs = _passes(kept, 3), _passes(reference, 3)
    assert kept.loader.kept is not None and len(kept.loader.kept) == 3
    for pass_ours, pass_theirs in zip(ours, theirs):
        assert len(pass_ours) == len(pass_theirs) == 3
        for a, b in zip(pass_ours, pass_theirs):
            assert torch.equal(a, b)
    kept.loader.loader = None  # a later pass that asked the workers for batches would fail here
    assert [torch.equal(a, b) for a, b in zip(_passes(kept, 1)[0], theirs[0])] == [True] * 3


@pytest.mark.cpu_only(reason="which batches are kept is host-side bookkeeping")
def test_a_validation_pass_stopped_early_or_too_large_keeps_nothing() -> None:
    cpu = torch.device("cpu")
    stopped = _val_loader(cpu, keep_bytes=64 << 20, workers=0)
    for _ in zip(range(2), stopped):
        pass
    assert stopped.loader.kept is None
    too_large = _val_loader(cpu, keep_bytes=40 * 28 * 28 * 3, workers=0)
    _passes(too_large, 1)
    assert too_large.loader.kept is None


@pytest.mark.cpu_only(reason="where kept batches live is host memory bookkeeping")
def test_kept_batches_from_workers_are_copied_out_of_shared_memory() -> None:
    """A worker's batch lives in shared memory; the kept one is the main process's own copy, so a long
    run does not hold a shared segment open per batch."""
    loader = _val_loader(torch.device("cpu"), keep_bytes=64 << 20, workers=1)
    yielded = [batch.images for batch in loader.loader]
    assert [kept.images.data_ptr() for kept in loader.loader.kept] != [y.data_ptr() for y in yielded]
    assert all(not kept.images.is_shared() for kept in loader.loader.kept)
    assert all(torch.equal(kept.images, y) for kept, y in zip(loader.loader.kept, yielded))


def test_the_first_batch_needs_one_decoded_batch_without_streams(device: torch.device) -> None:
    """Without a side stream there is nothing to overlap, so a batch is handed out as soon as it is
    prepared; with one, the next batch is prepared while the current one is used."""
    fetched: list[int] = []

    class Counting:
        def __init__(self, batches: list[Batch]) -> None:
            self.batches = batches

        def __iter__(self):
            for batch in self.batches:
                fetched.append(1)
                yield batch

        def __len__(self) -> int:
            return len(self.batches)

    batches = [
        Batch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64), torch.arange(2))
        for _ in range(3)
    ]
    loader = DeviceLoader(Counting(batches), device, (0.5,) * 3, (0.5,) * 3)
    first = next(iter(loader))
    assert first.images.device.type == device.type
    assert len(fetched) == (2 if has_streams(device) else 1)


def test_training_with_kept_data_matches_decoding_every_epoch(
    device: torch.device, fashion4: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole train.py run keeping decoded training images and validation batches gives the numbers
    and weights of a run that decodes everything every epoch; the next epoch starts decoding during
    validation on an accelerator and after it where validation runs on the host's cores."""
    from vtools.train import run as training_run

    events: list[str] = []
    real_start, real_evaluate = training_run.start_epoch, training_run.evaluate
    monkeypatch.setattr(
        training_run,
        "start_epoch",
        lambda loaders, epoch: events.append(f"start {epoch}") or real_start(loaders, epoch),
    )
    monkeypatch.setattr(training_run, "evaluate", lambda *a, **k: events.append(k["desc"]) or real_evaluate(*a, **k))

    def run(name: str) -> int:
        return command_main("train")(
            train_args(fashion4, tmp_path, name, *device_flags(device.type), "--epochs", "3")[1:]
        )

    assert run("kept") == 0
    during = not kind_of(device.type).computes_on_host
    expected = (
        ["start 1", "validate 0", "start 2", "validate 1"]
        if during
        else ["validate 0", "start 1", "validate 1", "start 2"]
    )
    assert events[:4] == expected
    monkeypatch.setattr(assemble, "KEEP_TRAINING_BYTES", 0)
    monkeypatch.setattr(assemble, "KEEP_VALIDATION_BYTES", 0)
    assert run("decoded") == 0
    columns = ("train_loss", "eval_loss", "eval_top1", "eval_top5", "lr")
    assert [[row[c] for c in columns] for row in summary(tmp_path / "kept")] == [
        [row[c] for c in columns] for row in summary(tmp_path / "decoded")
    ]
    assert_same_weights(weights(tmp_path / "kept" / "last.pth.tar"), weights(tmp_path / "decoded" / "last.pth.tar"))


# ---------------------------------------------------------------- checkpoint files


@pytest.mark.cpu_only(reason="file layout on disk is host-side; the checkpoint holds cpu copies")
def test_best_is_a_second_name_of_the_numbered_checkpoint(tmp_path: Path) -> None:
    from vtools.train.checkpoint import BEST, LAST, CheckpointManager

    manager = CheckpointManager(tmp_path, keep=2)
    for epoch, metric in enumerate([10.0, 30.0, 20.0]):
        manager.save({"epoch": epoch, "weights": torch.full((3,), float(epoch))}, epoch, metric)
        manager.wait()
    assert os.path.samefile(tmp_path / BEST, tmp_path / "checkpoint-1.pth.tar")
    assert not os.path.samefile(tmp_path / BEST, tmp_path / LAST)
    for _ in range(2):  # checkpoint-1 pruned: best keeps its data
        epoch += 1
        manager.save({"epoch": epoch, "weights": torch.zeros(3)}, epoch, 0.0)
        manager.wait()
    assert not (tmp_path / "checkpoint-1.pth.tar").exists()
    assert torch.load(tmp_path / BEST, weights_only=True)["epoch"] == 1
    unnumbered = CheckpointManager(tmp_path / "no-history", keep=0)
    unnumbered.save({"epoch": 0}, 0, 1.0)
    unnumbered.wait()
    assert not os.path.samefile(tmp_path / "no-history" / BEST, tmp_path / "no-history" / LAST)


@pytest.mark.cpu_only(reason="file layout on disk is host-side")
def test_best_is_a_copy_where_the_filesystem_has_no_hard_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vtools.train.checkpoint import BEST, CheckpointManager

    def no_links(*args: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    manager = CheckpointManager(tmp_path, keep=2)
    manager.save({"epoch": 0, "weights": torch.ones(3)}, 0, 1.0)
    manager.wait()
    assert (tmp_path / BEST).read_bytes() == (tmp_path / "checkpoint-0.pth.tar").read_bytes()
    assert not os.path.samefile(tmp_path / BEST, tmp_path / "checkpoint-0.pth.tar")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _big_file(tmp_path: Path) -> Path:
    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(3 << 20))
    return source


def test_copies_are_whole_when_the_kernel_copies_in_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _big_file(tmp_path)
    real = os.copy_file_range
    monkeypatch.setattr(os, "copy_file_range", lambda src, dst, count: real(src, dst, min(count, 100_003)))
    target = atomic_copy(source, tmp_path / "copy.bin")
    assert target.read_bytes() == source.read_bytes()
    assert not os.path.samefile(source, target)


@pytest.mark.parametrize("missing", ["EXDEV", "absent"])
def test_copies_fall_back_to_a_buffered_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    """Across filesystems (EXDEV) or where the OS has no copy_file_range, the copy goes through Python."""
    source = _big_file(tmp_path)
    if missing == "absent":
        monkeypatch.delattr(os, "copy_file_range")
    else:

        def cross_device(*args: object) -> int:
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(os, "copy_file_range", cross_device)
    assert atomic_copy(source, tmp_path / "copy.bin").read_bytes() == source.read_bytes()


def test_a_full_disk_during_a_kernel_copy_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _big_file(tmp_path)
    target = tmp_path / "copy.bin"
    target.write_bytes(b"the previous checkpoint")

    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "copy_file_range", full)
    with pytest.raises(RunFailed, match="the previous version is intact"):
        atomic_copy(source, target)
    assert target.read_bytes() == b"the previous checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.bin", "source.bin"]

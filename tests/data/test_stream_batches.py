"""Batches from shards streamed over HTTP (vtools/data/stream_batches.py): one epoch trains the local shards'
sample multiset, with loader workers or without; a resumed epoch trains exactly the batches the whole epoch
had left; validation reads every sample once; a bad image keeps its batch whole; a server that goes away
mid-epoch stops the pass with one line. The server is a real HTTP server process on localhost."""

from __future__ import annotations

import io
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.data.readers.shard_server import serve
from vtools.data.readers.registry import SourceRequest, open_source
from vtools.data.readers.wds_stream import StreamedShards, StreamLost
from vtools.data.stream_batches import stream_loader
from vtools.data.transforms import eval_transform
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="batches are made on the host; the device copy is DeviceLoader's")

CONFIG = {
    "input_size": (3, 16, 16),
    "interpolation": "bilinear",
    "mean": (0.5, 0.5, 0.5),
    "std": (0.5, 0.5, 0.5),
    "crop_pct": 1.0,
    "crop_mode": "center",
}
CPU = torch.device("cpu")


def loader(url: str, split: str, batch_size: int, workers: int, training: bool = True, **kw: object):
    source = open_source(SourceRequest("wds/shards", url, split))
    return stream_loader(
        source.samples, eval_transform(CONFIG), "RGB", batch_size, CPU, workers, 0, 0, 1, training, **kw
    )


def local_samples(shards: Path, split: str) -> Counter:
    samples = open_source(SourceRequest("wds/shards", str(shards), split)).samples
    return Counter((index, samples.locate(index).label) for index in range(len(samples)))


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_trains_the_local_shards_samples_once_each(server: str, shards: Path, workers: int) -> None:
    batches = loader(server, "train", 5, workers, shuffle_size=4)
    orders = []
    for epoch in (0, 1):
        batches.sampler.set_epoch(epoch)
        seen = list(batches)
        assert len(seen) == len(batches) == 6 and all(len(batch.targets) == 5 for batch in seen)
        pairs = [(i, t) for batch in seen for i, t in zip(batch.indices.tolist(), batch.targets.tolist())]
        assert Counter(pairs) == local_samples(shards, "train")
        orders.append([index for index, _ in pairs])
    assert orders[0] != orders[1]  # shuffled anew each epoch


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_epoch_trains_exactly_the_batches_left(server: str, workers: int) -> None:
    batches = loader(server, "train", 4, workers, shuffle_size=4)  # 30 samples: 7 batches, 2 left out
    batches.sampler.set_epoch(3)
    whole = list(batches)
    assert len(whole) == 7
    for step in (1, 4, 6):
        batches.sampler.set_epoch(3, skip_samples=step * 4)
        assert len(batches) == 7 - step
        rest = list(batches)
        assert [b.indices.tolist() for b in rest] == [b.indices.tolist() for b in whole[step:]]
        assert all(torch.equal(a.images, b.images) for a, b in zip(rest, whole[step:]))


def test_validation_reads_every_sample_once_in_order(server: str, shards: Path) -> None:
    batches = loader(server, "validation", 4, 2, training=False)
    seen = list(batches)
    assert len(seen) == len(batches) == 3  # each worker's last batch is short
    pairs = [(i, t) for batch in seen for i, t in zip(batch.indices.tolist(), batch.targets.tolist())]
    assert Counter(pairs) == local_samples(shards, "validation")


def test_validation_of_a_counted_split_reads_the_count_it_was_given(shards: Path, tmp_path: Path) -> None:
    """A split without split info takes its length from ``|num_samples``, shared evenly over its shards:
    validation reads each shard up to its share, so it evaluates what the run's start line says (it read the
    whole shards: 24 for '|10')."""
    import shutil

    for tar in shards.glob("shards-validation-*.tar"):  # served without the _info.json that would count them
        shutil.copy(tar, tmp_path / tar.name)
    with serve(tmp_path) as bare:
        counted = f"{bare}/shards-validation-000000.tar|5"  # the shard holds 7
        seen = list(loader("/nowhere", counted, 4, 2, training=False))
        both = list(loader("/nowhere", f"{bare}/shards-validation-{{000000..000001}}.tar|4", 4, 2, training=False))
    pairs = [(i, t) for batch in seen for i, t in zip(batch.indices.tolist(), batch.targets.tolist())]
    assert len(pairs) == 5 and len(set(pairs)) == 5
    assert sum(len(batch.targets) for batch in both) == 4  # 2 of each shard
    assert set(pairs) <= set(local_samples(shards, "validation"))


def test_a_bad_image_keeps_its_batch_whole(tmp_path: Path, shards: Path) -> None:
    shard = tmp_path / "bad.tar"
    good = (shards / "shards-train-000000.tar").read_bytes()
    with tarfile.open(fileobj=io.BytesIO(good)) as source, tarfile.open(shard, "w") as tar:
        for member in source.getmembers():
            data = source.extractfile(member).read()
            if member.name.startswith("000000002."):  # the third sample's image becomes unreadable
                data = b"not an image" if not member.name.endswith(".cls") else data
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    store = StreamedShards([f"pipe:cat {shard}"], [7])
    batches = stream_loader(store, eval_transform(CONFIG), "RGB", 7, CPU, 0, 0, 0, 1, True, 1, replace_bad=True)
    (batch,) = list(batches)
    assert len(batch.targets) == 7 and len(batch.bad) == 1 and batch.bad[0].replaced
    assert "000000002" in batch.bad[0].path
    plain = stream_loader(store, eval_transform(CONFIG), "RGB", 7, CPU, 0, 0, 0, 1, True, 1)
    (kept,) = list(plain)
    assert len(kept.targets) == 6 and not kept.bad[0].replaced  # the policy's handler stops or skips it


@pytest.mark.parametrize("workers", [0, 2])
def test_a_server_that_goes_away_mid_epoch_stops_the_pass_in_one_line(shards: Path, workers: int) -> None:
    with serve(shards, die_after=2) as url:
        batches = loader(url, "train", 3, workers, shuffle_size=1)
        batches.sampler.set_epoch(0)
        trained = []
        with pytest.raises(StreamLost) as lost:
            for batch in batches:
                trained.append(batch)
    message = str(lost.value)
    assert message.startswith(f"shard {url}/shards-train-") and "\n" not in message
    assert "curl exited with status" in message
    assert len(trained) < len(batches)


def test_a_rank_needs_a_shard_and_a_batch(server: str) -> None:
    source = open_source(SourceRequest("wds/shards", server, "validation"))
    with pytest.raises(UsageError, match="2 shard.*fewer than the 3 processes"):
        stream_loader(source.samples, eval_transform(CONFIG), "RGB", 2, CPU, 0, 0, 0, 3, True)
    with pytest.raises(UsageError, match="--batch-size 64 is larger than the 9 samples"):
        stream_loader(source.samples, eval_transform(CONFIG), "RGB", 64, CPU, 0, 0, 0, 1, True)

"""Shards streamed from a server (vtools/data/readers/wds_stream.py): the split from the server's split info or
a ``|num_samples`` pattern, webdataset's ``pipe:`` form, the per-epoch plan over ranks and workers, and a shard
the server stops sending as one line. A real HTTP server (tests/data/readers/shard_server.py) serves shards
that ``python -m vtools shards`` wrote."""

from __future__ import annotations

import io
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from tests.data.readers.shard_server import serve
from vtools.data.readers.registry import SourceRequest, open_source
from vtools.data.readers.wds_stream import (
    StreamLost,
    canonical_batches,
    open_stream_split,
    plan_epoch,
    shard_samples,
    worker_skips,
)
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="reads shards on the host; no device involved")

TRAIN = "shards-train-{000000..000004}.tar"


def test_the_split_comes_from_the_servers_split_info(server: str, shards: Path) -> None:
    source = open_source(SourceRequest("wds/shards", server, "train"))
    local = open_source(SourceRequest("wds/shards", str(shards), "train"))
    assert source.samples.urls == [f"{server}/{Path(p).name}" for p in local.samples.shards]
    assert source.samples.counts == local.samples.counts == [7, 7, 7, 7, 2]
    assert source.classes == local.classes == ["a", "b", "c"]
    assert "5 shards streamed, 30 samples" in source.description
    pattern = open_stream_split(server, TRAIN.replace("000004", "000001"))  # a brace pattern: its shards' lengths
    assert pattern.counts == [7, 7] and pattern.exact_counts


def test_the_pipe_form_and_a_sample_count_suffix(shards: Path, tmp_path: Path) -> None:
    command = f"pipe:cat {shards}/{TRAIN}"
    with_info = open_stream_split(str(shards), command)  # the folder holds _info.json: exact lengths
    assert with_info.counts == [7, 7, 7, 7, 2] and with_info.urls[0] == f"pipe:cat {shards}/shards-train-000000.tar"
    counted = open_stream_split(str(tmp_path), command + "|30")  # no split info: |30 shared out evenly
    assert counted.counts == [6, 6, 6, 6, 6] and not counted.exact_counts
    with pytest.raises(UsageError, match=r"\|<num_samples>"):
        open_stream_split(str(tmp_path), command)
    with pytest.raises(UsageError, match="a pipe: command names shards"):
        open_stream_split(command, "train")


def test_a_server_without_the_split_is_one_line(server: str) -> None:
    with pytest.raises(UsageError, match="cannot be listed.*names train, validation"):
        open_stream_split(server, "test")
    with pytest.raises(UsageError, match="cannot reach the shard server"):
        open_stream_split("http://127.0.0.1:9", "train")  # nothing listens on the discard port


def test_validate_py_cannot_read_a_stream_by_index(server: str) -> None:
    source = open_source(SourceRequest("wds/shards", server, "validation"))
    with pytest.raises(UsageError, match="only train.py does"):
        source.images(lambda image: image, "RGB")


def test_a_shard_streams_the_samples_the_local_reader_indexes(server: str, shards: Path) -> None:
    local = open_source(SourceRequest("wds/shards", str(shards), "train")).samples
    streamed = list(shard_samples(f"{server}/shards-train-000001.tar", 7, ("jpg", "png"), "cls", 7))
    assert [index for index, _ in streamed] == list(range(7, 14))
    for index, sample in streamed:
        indexed = local.locate(index)
        assert (sample.label, sample.image) == (indexed.label, indexed.image)
        assert sample.name.endswith(indexed.name.rsplit(":", 1)[1])


@pytest.mark.parametrize("world_size, workers", [(1, 1), (1, 3), (2, 2), (3, 1)])
def test_each_epoch_deals_every_shard_once_and_whole_batches_to_every_rank(world_size: int, workers: int) -> None:
    counts = [7, 7, 7, 7, 2, 5]
    per_rank = (sum(counts) // (world_size * 4)) * 4
    orders = []
    for epoch in (0, 1):
        plans = [plan_epoch(counts, 0, epoch, rank, world_size, workers, per_rank) for rank in range(world_size)]
        dealt = [shard for plan in plans for worker in plan.shards for shard in worker]
        assert sorted(dealt) == list(range(len(counts)))
        assert all(sum(plan.quotas) == per_rank for plan in plans)
        orders.append(dealt)
    assert orders[0] != orders[1]  # a new seeded order each epoch
    validation = plan_epoch(counts, 0, 5, 0, 1, 2, None)
    assert validation.shards == [[0, 2, 4], [1, 3, 5]] and validation.quotas == [16, 19]


def test_a_resume_position_names_each_workers_trained_samples() -> None:
    quotas = [9, 5]  # batches of 4: worker 0 has 2 whole and 1 left, worker 1 has 1 whole and 1 left
    assert canonical_batches(quotas, 4) == [(0, 0), (1, 0), (0, 1)]
    assert worker_skips(quotas, 4, 0) == [0, 0]
    assert worker_skips(quotas, 4, 8) == [4, 4]
    assert worker_skips(quotas, 4, 12) == [8, 4]  # every whole batch
    assert worker_skips(quotas, 4, 14) == [9, 5]  # and the joined partial ones


def test_a_server_that_goes_away_is_one_line_naming_the_shard(shards: Path) -> None:
    with serve(shards, die_after=1) as url:
        assert len(list(shard_samples(f"{url}/shards-train-000000.tar", 0, ("jpg", "png"), "cls", 7))) == 7
        with pytest.raises(StreamLost) as cut:
            list(shard_samples(f"{url}/shards-train-000001.tar", 7, ("jpg", "png"), "cls", 7))
        with pytest.raises(StreamLost) as refused:
            list(shard_samples(f"{url}/shards-train-000002.tar", 14, ("jpg", "png"), "cls", 7))
    for lost, cause in ((cut, "curl exited with status 18"), (refused, "curl exited with status 7")):
        message = str(lost.value)
        assert "\n" not in message and cause in message, message
    assert str(cut.value).startswith(f"shard {url}/shards-train-000001.tar: ")
    assert "connection refused" in str(refused.value)


def test_a_missing_or_truncated_shard_is_one_line(server: str, shards: Path, tmp_path: Path) -> None:
    with pytest.raises(StreamLost, match=r"status 22: the server answered with an HTTP error"):
        list(shard_samples(f"{server}/no-such-shard.tar", 0, ("jpg",), "cls", None))
    data = (shards / "shards-train-000000.tar").read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(StreamLost, match=r"shard pipe:cat .*cut.tar: .*after \d+ samples"):
        list(shard_samples(f"pipe:cat {cut}", 0, ("jpg", "png"), "cls", 7))
    whole = tmp_path / "short.tar"
    shutil.copy(shards / "shards-train-000004.tar", whole)  # 2 samples where the split info says 7
    with pytest.raises(StreamLost, match="ended after 2 of its 7 samples"):
        list(shard_samples(f"pipe:cat {whole}", 0, ("jpg", "png"), "cls", 7))


def test_samples_without_an_image_or_label_are_bad_samples(tmp_path: Path) -> None:
    shard = tmp_path / "odd.tar"
    with tarfile.open(shard, "w") as tar:
        for name, data in (("a.cls", b"1"), ("b.jpg", b"not an image"), ("c.jpg", b"x"), ("c.cls", b"2")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    found = dict(shard_samples(f"pipe:cat {shard}", 0, ("jpg",), "cls", None))
    kinds = Counter(type(sample).__name__ for sample in found.values())
    assert kinds == {"BadSample": 2, "RawSample": 1}
    assert "no image" in found[0].reason and "no label" in found[1].reason and found[2].label == 2


def test_a_streamed_label_beyond_the_classes_is_a_bad_sample_named_as_by_index(tmp_path: Path) -> None:
    """A .cls of 12 in a 3-class split: a bad sample with the reason shards read by index give, not a loss
    that fails later on an index out of range."""
    shard = tmp_path / "odd-train-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for key, label in (("a", b"1"), ("b", b"12"), ("c", b"-1")):
            for extension, data in (("png", _PNG), ("cls", label)):
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    samples = [s for _, s in shard_samples(f"pipe:cat {shard}", 0, ("png",), "cls", 3, (3, "the class list"))]
    assert [getattr(s, "label", None) for s in samples] == [1, None, None]
    expected = "labels are class indices 0..2 for the 3 classes of the class list; fix the sample's label"
    assert [s.reason for s in samples[1:]] == [f"label 12 (.cls) is out of range: {expected} or the class list"] + [
        f"label -1 (.cls) is out of range: {expected} or the class list"
    ]


def _png() -> bytes:
    from PIL import Image

    data = io.BytesIO()
    Image.new("RGB", (4, 4)).save(data, "PNG")
    return data.getvalue()


_PNG = _png()

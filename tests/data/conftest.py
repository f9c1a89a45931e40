"""Fixtures shared by the data tests: shards written by `vtools shards`, and a real HTTP server serving them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_script, write_image_set
from tests.data.readers.shard_server import serve


@pytest.fixture(scope="session")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`vtools shards` output for the streaming tests: 30 training images in shards of 7 (the last holds 2)
    and 9 validation images, with _info.json."""
    root = tmp_path_factory.mktemp("stream")
    write_image_set(root / "images" / "train", ["a", "b", "c"], per_class=10)
    write_image_set(root / "images" / "val", ["a", "b", "c"], per_class=3, seed=1)
    made = run_script(["-m", "vtools", "shards", str(root / "images"), str(root / "shards"), "--shard-size", "7"])
    assert made.returncode == 0, made.stderr
    return root / "shards"


@pytest.fixture(scope="session")
def server(shards: Path) -> Iterator[str]:
    """The URL of a real HTTP server (tests/data/readers/shard_server.py) serving :func:`shards`."""
    with serve(shards) as url:
        yield url

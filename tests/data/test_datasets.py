"""Every sample store answers labels, paths and names through the SampleStore protocol (vtools/data/datasets.py,
vtools/data/readers/): the defaults live in one place, and a Source asks its store instead of probing it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from torch.utils.data import Dataset

from tests.conftest import REPO
from vtools.data.datasets import FileSamples, SampleStore
from vtools.data.readers.hfds import TableSamples
from vtools.data.readers.registry import Source, SourceRequest
from vtools.data.readers.torchvision import TorchvisionImages, TorchvisionSamples
from vtools.data.readers.wds import ShardSamples
from vtools.options.shared import SourceFlags

pytestmark = pytest.mark.cpu_only(reason="host-side stores; nothing runs on a device")


class _Digits(Dataset):
    """A torchvision-like set: decoded items, a ``labels`` array of its own (as SVHN and STL10 have)."""

    labels = [0, 1, 2]

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int) -> tuple:
        raise NotImplementedError


def test_every_store_is_a_sample_store_with_the_defaults() -> None:
    stores = [
        FileSamples(["a.png", "b.png"], [0, 1]),
        ShardSamples(["s.tar"], [2]),
        TableSamples([{}, {}], "image", "label", "validation"),
        TorchvisionSamples(_Digits(), "torch/digits"),
    ]
    for store in stores:
        assert SampleStore in type(store).__mro__  # named as the base: the defaults come from it
    files, shards, table, torchvision = stores
    assert (files.labels.tolist(), list(files.paths), files.own_names) == ([0, 1], ["a.png", "b.png"], True)
    assert (shards.labels, shards.paths, shards.own_names) == (None, (), True)
    assert (table.labels, table.paths, table.own_names) == (None, (), True)
    assert (torchvision.labels, torchvision.paths, torchvision.own_names) == (None, (), False)  # not the set's own
    assert torchvision.name(2) == "torch/digits[2]" and table.name(1) == "validation[1]"


def test_a_source_names_samples_only_when_its_store_has_names() -> None:
    files = Source(FileSamples(["x/a.png"], [0]), ["a"], "x")
    assert files.sample_names() is not None and files.sample_names()(0) == "x/a.png"
    digits = Source(TorchvisionSamples(_Digits(), "torch/digits"), ["0", "1", "2"], "digits")
    assert digits.sample_names() is None  # a report or ReaL labels must not take a position for a file name
    assert isinstance(digits.images(lambda image: image, "RGB"), TorchvisionImages)


def test_the_highest_label_comes_from_stored_labels_else_the_class_names() -> None:
    folders = Source(FileSamples(["a", "b", "c"], [0, 4, 2]), ["a", "b"], "folders")
    assert folders.highest_label() == 4  # labels known up front win over the class names
    shards = Source(ShardSamples(["s.tar"], [5]), ["a", "b", "c"], "shards")
    assert shards.highest_label() == 2
    assert shards.highest_label([]) == -1  # the caller's class names (train.py: none known)
    assert Source(ShardSamples(["s.tar"], [5]), None, "shards").highest_label() == -1


def test_a_request_is_built_from_the_shared_data_flags() -> None:
    flags = SourceFlags(dataset="wds/x", dataset_download=True, input_key="jpg", target_key="cls")
    request = SourceRequest.for_split(flags, "/data", "train", {"a": 0})
    assert request == SourceRequest("wds/x", "/data", "train", True, "jpg", "cls", {"a": 0})


def test_no_code_probes_a_store_for_its_answers() -> None:
    """``getattr(source.samples, ...)`` hides a missing answer; the protocol gives every store one."""
    probes = []
    for path in sorted((REPO / "vtools").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr") and node.args:
                target = ast.unparse(node.args[0])
                if target == "samples" or target.endswith(".samples"):
                    probes.append(f"{Path(path).relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert not probes, "\n".join(probes)

"""Every shipped config is valid for train.py: known keys, right types, a model timm knows."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm

from tests.conftest import REPO

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 4


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_is_valid(path: Path) -> None:
    from vtools.cli.config import read_yaml, yaml_defaults
    from vtools.commands import train

    parser = train.build_parser()
    values = yaml_defaults(parser, read_yaml(path), str(path))
    assert timm.is_model(values["model"]), values["model"]
    assert values["epochs"] > 0 and values["batch_size"] > 0
    parser.set_defaults(**values)
    args = parser.parse_args([])
    assert args.model == values["model"]
    text = path.read_text()
    assert text.startswith("#"), "each config starts with a comment naming its source"

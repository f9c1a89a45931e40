"""The one registry of commands (vtools/cli/registry.py): ``python3 -m vtools`` lists and dispatches what it
holds, aliases resolve, and each command's parser is the one the command parses with."""

from __future__ import annotations

import pytest

from vtools.cli import registry

pytestmark = pytest.mark.cpu_only(reason="reads the registry; runs nothing on a device")


def test_the_usage_lists_every_registered_command_in_order() -> None:
    from vtools.__main__ import _usage

    lines = _usage().splitlines()
    listed = [line.split()[0] for line in lines[2:] if line.startswith("  ")]
    assert listed == [known.name for known in registry.COMMANDS]
    assert all(known.summary in _usage() for known in registry.COMMANDS)


def test_aliases_and_unknown_names() -> None:
    assert registry.command("inference") is registry.command("infer")
    with pytest.raises(KeyError):
        registry.command("trian")


def test_a_command_parsed_first_has_torch_free_flags_and_a_run() -> None:
    import importlib

    for known in registry.COMMANDS:
        code = importlib.import_module(known.module)
        if known.flags:
            assert hasattr(importlib.import_module(known.flags), "parse") and hasattr(code, "run"), known.name
        else:
            assert hasattr(code, "main") and hasattr(code, "build_parser"), known.name


def test_the_dispatcher_names_the_closest_command() -> None:
    from vtools.__main__ import _main
    from vtools.errors import UsageError

    with pytest.raises(UsageError, match="did you mean train"):
        _main(["trian"])

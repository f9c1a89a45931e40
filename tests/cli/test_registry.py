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


def test_every_command_has_one_protocol_parse_then_run() -> None:
    """Each command's flags module gives build_parser() and parse(argv); its command module run(options), and
    no main(argv) of its own that would parse a second way."""
    import importlib

    for known in registry.COMMANDS:
        flags, code = importlib.import_module(known.flags), importlib.import_module(known.module)
        assert callable(flags.build_parser) and callable(flags.parse), known.name
        assert callable(code.run) and not hasattr(code, "main"), known.name


@pytest.mark.slow
def test_every_commands_flags_load_without_torch() -> None:
    """The runner parses every command before torch is imported: no flags module may pull it in."""
    from tests.conftest import run_script

    modules = [known.flags for known in registry.COMMANDS]
    code = f"import importlib, sys\nfor m in {modules!r}:\n    importlib.import_module(m).build_parser()\n"
    code += "print(sorted(n for n in ('torch', 'timm', 'torchvision', 'numpy') if n in sys.modules))\n"
    proc = run_script(["-c", code])
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_the_dispatcher_names_the_closest_command() -> None:
    from vtools.__main__ import _main
    from vtools.errors import UsageError

    with pytest.raises(UsageError, match="did you mean train"):
        _main(["trian"])

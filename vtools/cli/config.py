"""YAML run files merged with command-line flags: defaults < YAML < flags, every key checked.

A YAML key is an option's name with dashes or underscores (``batch-size`` or
``batch_size``). A key no option has, or a value of the wrong type, stops the
run with one line naming the key (and the closest real key). timm's train.py
silently ignores such keys, so a typo there trains the wrong recipe. Every
option of timm's train.py is an option here, so the ``args.yaml`` timm writes
(all its keys, nulls and empty strings included) is read as it is.

The run's own ``config.yaml`` is written with timm's key spelling (option
dests, underscores), so timm's ``train.py -c`` reads every value of it too.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

import yaml

from vtools.errors import UsageError


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option by dest, the positional data folder (timm's args.yaml has a ``data`` key) included."""
    return {action.dest: action for action in parser._actions if action.dest not in ("help", argparse.SUPPRESS)}


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with one-line errors for missing or malformed files."""
    file = Path(path)
    if file.is_dir():
        raise UsageError(f"config {path} is a folder, not a YAML file")
    if not file.is_file():
        raise UsageError(f"config {path} does not exist")
    try:
        data = yaml.load(file.read_text(encoding="utf-8"), Loader=_StrictLoader) or {}
    except UnicodeDecodeError as err:
        raise UsageError(f"config {path} is not UTF-8 text (byte {err.start})") from err
    except UsageError as err:  # a duplicate key
        raise UsageError(f"config {path}: {err}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"config {path} is not valid YAML{where}: {getattr(err, 'problem', err)}") from err
    if not isinstance(data, dict):
        raise UsageError(f"config {path} must be a mapping of option: value")
    return data


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise UsageError(f"key '{key}' is given twice (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _coerce(key: str, value: Any, action: argparse.Action, source: str) -> Any:
    """Check (and convert) a YAML value the way argparse would check a flag's value."""

    def wrong(expected: str) -> UsageError:
        return UsageError(f"config {source}: key '{key}' expects {expected}, got {value!r}")

    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if isinstance(action, argparse.BooleanOptionalAction):
        if value is not None and not isinstance(value, bool):
            raise wrong("true, false or null")
        return value
    if value is None:
        if action.default is not None:  # null cannot stand for a value the option always has
            raise UsageError(f"config {source}: key '{key}' expects {_expected(action)}, got null")
        return None
    if isinstance(action.default, dict):  # --model-kwargs key=value pairs: a mapping in YAML
        if not isinstance(value, dict):
            raise wrong("a mapping")
        return value
    many = action.nargs in ("*", "+") or isinstance(action.nargs, int)
    if many:
        items = value if isinstance(value, list) else None
        if items is None or (isinstance(action.nargs, int) and len(items) != action.nargs):
            count = f"{action.nargs} values" if isinstance(action.nargs, int) else "a list"
            raise wrong(count)
        return [_coerce_scalar(item, action, wrong) for item in items]
    if isinstance(value, (list, dict)):
        raise wrong("a single value")
    return _coerce_scalar(value, action, wrong)


def _coerce_scalar(value: Any, action: argparse.Action, wrong: Any) -> Any:
    kind = action.type
    if kind is float and isinstance(value, str):
        value = _yaml11_number(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("an integer" if kind is int else "a number")
        if kind is int and float(value) != int(value):
            raise wrong("an integer")
        value = kind(value)
    elif kind is None or kind is str:
        if isinstance(value, bool):
            raise wrong("a string")
        value = str(value) if isinstance(value, (int, float)) and kind is str else value
    elif callable(kind):  # a checking type such as the interpolation names: what it refuses on the command line
        try:
            value = kind(str(value))
        except (argparse.ArgumentTypeError, ValueError, TypeError) as err:
            raise wrong(f"a valid value ({err})") from err
    if action.choices is not None and value not in action.choices:
        raise wrong(f"one of {', '.join(map(str, action.choices))}")
    return value


def _yaml11_number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _expected(action: argparse.Action) -> str:
    if action.nargs in ("*", "+") or isinstance(action.nargs, int):
        return "a list"
    return {int: "an integer", float: "a number"}.get(action.type, "a value")


def yaml_defaults(parser: argparse.ArgumentParser, data: dict[str, Any], source: str) -> dict[str, Any]:
    """Validate YAML keys/values against the parser's options; return them as parser defaults."""
    options = _options(parser)
    merged: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in options or key == "config":
            close = difflib.get_close_matches(key, list(options), n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(f"config {source}: unknown key '{raw_key}'{hint}")
        if key in merged:
            first = next(str(k) for k in data if str(k).replace("-", "_") == key)
            raise UsageError(f"config {source}: '{first}' and '{raw_key}' are the same option, given twice")
        merged[key] = _coerce(str(raw_key), value, options[key], source)
    return merged


def parse_with_config(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse flags over a ``-c/--config`` YAML file over the parser's defaults."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("-c", "--config", default="")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        parser.set_defaults(**yaml_defaults(parser, read_yaml(known.config), known.config))
    return parser.parse_args(argv)


def dump_config(
    args: argparse.Namespace, path: str | Path, exclude: tuple[str, ...] = ("config", "resume", "data")
) -> str:
    """The resolved options as YAML: ``train.py -c`` on it repeats the run."""
    data = {key: value for key, value in sorted(vars(args).items()) if key not in exclude}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)

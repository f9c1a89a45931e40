"""YAML run files merged with command-line flags: defaults < YAML < flags, every key checked.

A YAML key is an option's name with dashes or underscores (``batch-size`` or
``batch_size``). A key no option has, or a value of the wrong type, stops the
run with one line naming the key (and the closest real key). timm's train.py
silently ignores such keys, so a typo there trains the wrong recipe. Every
option of timm's train.py is an option here, so the ``args.yaml`` timm writes
(all its keys, nulls and empty strings included) is read as it is.

The Python API (vtools/api.py) resolves its keyword options here too, over the
same file: :func:`resolve_options` checks each keyword as a YAML value is checked.

The run's own ``config.yaml`` is written with timm's key spelling (option
dests, underscores), so timm's ``train.py -c`` reads every value of it too.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from vtools.cli.declared import add_declared
from vtools.cli.parser import closest_name
from vtools.errors import UsageError
from vtools.options.shared import RunFileFlags


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
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"config {path} is not UTF-8 text (byte {err.start})") from err
    try:
        loader = _StrictLoader(text)
        try:
            data = loader.get_single_data() or {}
        finally:
            loader.dispose()
    except UsageError as err:  # a duplicate key
        raise UsageError(f"config {path}: {err}") from err
    except yaml.reader.ReaderError as err:  # a control character: the reader marks no line, only a position
        line = text.count("\n", 0, err.position) + 1
        problem = f"{err.reason} (U+{err.character:04X})"
        raise UsageError(f"config {path} is not valid YAML at line {line}: {problem}") from err
    except yaml.MarkedYAMLError as err:  # the scanner's, parser's and constructor's errors, each with its mark
        raise UsageError(f"config {path} is not valid YAML at {_error_line(err)}") from err
    if not isinstance(data, dict):
        raise UsageError(f"config {path} must be a mapping of option: value")
    return YamlValues(data, loader.texts)


def _error_line(err: yaml.MarkedYAMLError) -> str:
    """Where a syntax error is, as the editor numbers lines (PyYAML's marks count from 0). An unfinished
    key, quoted text or bracket is only noticed at the next token, often a line or more later: the line
    the unfinished part starts on is the one to fix, and the later one is named after it."""
    noticed = err.problem_mark.line + 1
    context = err.context or ""
    if err.context_mark is None or not context.startswith(("while scanning", "while parsing a flow")):
        return f"line {noticed}: {err.problem}"
    started = err.context_mark.line + 1
    later = f", noticed at line {noticed}" if noticed != started else ""
    return f"line {started}: {err.problem} ({context}{later})"


class YamlValues(dict):
    """A run file's option: value mapping, with the text each top-level scalar (or list of scalars) was
    written as: a string option takes that text, not what YAML made of it (``experiment: 1.10`` is 1.1
    to YAML, ``0123`` is 83)."""

    def __init__(self, values: dict[Any, Any], texts: dict[Any, Any]) -> None:
        super().__init__(values)
        self.texts = texts


_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"
_NOT_A_NAME = {list: "a list", dict: "a mapping", set: "a set"}  # YAML keys no option can have (`? !!set {a}`)


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice (plain YAML keeps the last one silently) and a key that
    is a list or mapping; it reads no dates (``experiment: 2024-05-01`` is a name) and keeps the text of the
    top-level values (:class:`YamlValues`)."""

    # without the timestamp resolver a date stays the string it was written as
    yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != _TIMESTAMP]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.texts: dict[Any, Any] = {}
        self._root: yaml.Node | None = None

    def construct_document(self, node: yaml.Node) -> Any:
        self._root = node
        return super().construct_document(node)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, LookupError, TypeError, AttributeError) as err:
            # an explicit tag on text it does not fit (`!!float fast`, `!!int ''`, `!!bool maybe`): PyYAML's
            # converters fail with plain Python errors, which get the node's line here
            kind = str(node.tag).rsplit(":", 1)[-1]
            problem = f"{node.value!r} is not a valid !!{kind}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from err

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):  # `!!map [a]`: PyYAML's own refusal, with its line
            return super().construct_mapping(node, deep=deep)
        seen: set[Any] = set()
        explicit = [key for key, _ in node.value if key.tag != _MERGE]
        self.flatten_mapping(node)  # a merge key (`<<: *base`) puts the base's pairs first; later keys win
        for key_node in explicit:
            key = self.construct_object(key_node, deep=deep)
            what = next((name for kind, name in _NOT_A_NAME.items() if isinstance(key, kind)), None)
            if what:
                raise UsageError(f"line {key_node.start_mark.line + 1}: a key must be an option name, not {what}")
            if key in seen:
                raise UsageError(f"key '{key}' is given twice (line {key_node.start_mark.line + 1})")
            seen.add(key)
        if node is self._root:
            for key_node, value_node in node.value:  # merged pairs too, each key's last value
                self.texts[self.construct_object(key_node, deep=deep)] = _scalar_text(value_node)
        return super().construct_mapping(node, deep=deep)


def _scalar_text(node: yaml.Node) -> str | list[str | None] | None:
    """The text a scalar was written as (a list of them for a list of scalars); None for anything else."""
    if isinstance(node, yaml.ScalarNode):
        return node.value
    if isinstance(node, yaml.SequenceNode):
        return [item.value if isinstance(item, yaml.ScalarNode) else None for item in node.value]
    return None


def _coerce(label: str, value: Any, action: argparse.Action, text: Any = None, null: str = "null") -> Any:
    """Check (and convert) a value the way argparse would check a flag's value; ``label`` names it in the
    error (``config FILE: key 'lr'``), ``text``: how a YAML value was written (a list of texts for a list),
    which a string option takes; ``null``: how the value None was written."""

    def wrong(expected: str) -> UsageError:
        return UsageError(f"{label} expects {expected}, got {value!r}")

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
            raise UsageError(f"{label} expects {_expected(action)}, got {null}")
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
        texts = text if isinstance(text, list) and len(text) == len(items) else [None] * len(items)
        return [_coerce_scalar(item, action, wrong, item_text) for item, item_text in zip(items, texts)]
    if isinstance(value, (list, dict)):
        raise wrong("a single value")
    return _coerce_scalar(value, action, wrong, text if isinstance(text, str) else None)


def _coerce_scalar(value: Any, action: argparse.Action, wrong: Any, text: str | None = None) -> Any:
    kind = action.type
    if kind is float and isinstance(value, str):
        value = _yaml11_number(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("an integer" if kind is int else "a number")
        if kind is int and not (math.isfinite(value) and float(value) == int(value)):
            raise wrong("an integer")
        value = kind(value)
    elif kind is None or kind is str:
        if isinstance(value, bool):
            raise wrong("a string")
        if isinstance(value, (int, float)):  # a name or path written like a number: the text as written
            value = text if text is not None else str(value)
    elif callable(kind):  # a checking type such as the interpolation names: what it refuses on the command line
        try:
            value = kind(text if text is not None else str(value))
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
            close = closest_name(key, [name for name in options if name != "config"])
            hint = f" (did you mean '{close}'?)" if close else ""
            raise UsageError(f"config {source}: unknown key '{raw_key}'{hint}")
        if key in merged:
            first = next(str(k) for k in data if str(k).replace("-", "_") == key)
            raise UsageError(f"config {source}: '{first}' and '{raw_key}' are the same option, given twice")
        text = getattr(data, "texts", {}).get(raw_key)
        merged[key] = _coerce(f"config {source}: key '{raw_key}'", value, options[key], text)
    return _one_data_folder(merged) if "data" in options else merged


def _one_data_folder(values: dict[str, Any]) -> dict[str, Any]:
    """timm's train.py reads ``data_dir``, and the positional ``data`` only without it. A file's folder (its
    data_dir, else its data) becomes the positional's default, so that the command line's DIR or --data-dir
    overrides the file, and --data-dir wins over DIR there too (vtools.cli.train_flags.check_train_args)."""
    folder = values.get("data_dir") or values.get("data")
    if folder:
        values.update(data=folder, data_dir=None)
    return values


def keyword_values(parser: argparse.ArgumentParser, values: Mapping[str, Any], caller: str) -> dict[str, Any]:
    """Python keyword options (``batch_size=64``), checked and converted as the YAML file's values are; a
    name no option has stops with the closest real one. A path may be a ``Path`` and a list a tuple."""
    options = _options(parser)
    names = [name for name in options if name != "config"]
    checked: dict[str, Any] = {}
    for key, value in values.items():
        if key not in names:
            close = closest_name(key, names)
            raise UsageError(f"{caller}: unknown option '{key}'" + (f" (did you mean '{close}'?)" if close else ""))
        checked[key] = _coerce(f"{caller}: option '{key}'", _plain(value), options[key], null="None")
    return checked


def _plain(value: Any) -> Any:
    """A keyword value as YAML would give it: paths as text, tuples as lists."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def resolve_options(
    parser: argparse.ArgumentParser, config: str | Path | None, values: Mapping[str, Any], caller: str
) -> argparse.Namespace:
    """The Python API's parse: the parser's defaults < the YAML file ``config`` < keyword ``values``, each
    checked as on the command line (refused timm flags included); no argv strings are made."""
    if config is not None and not isinstance(config, (str, os.PathLike)):
        name = caller.removesuffix("()")
        raise UsageError(
            f"{caller}: the first argument is the path of a YAML run file (or None), not a {type(config).__name__}; "
            f"give options as keywords: {name}(epochs=1, ...) or {name}(**options)"
        )
    given: dict[str, Any] = {}
    if config:
        given |= yaml_defaults(parser, read_yaml(config), str(config))
        if "config" in _options(parser):
            given["config"] = str(config)  # as -c FILE leaves it
    given |= keyword_values(parser, values, caller)
    parser.set_defaults(**given)
    for action in parser._actions:  # argparse counts only strings as given: a required value set here is
        if action.dest in given or action.nargs == argparse.REMAINDER:  # given (and an empty remainder is)
            action.required = False
    return parser.parse_args([])


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    """``-c/--config``: the YAML run file that :func:`parse_with_config` reads first."""
    add_declared(parser, RunFileFlags)


def parse_with_config(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse flags over a ``-c/--config`` YAML file over the parser's defaults."""
    pre = argparse.ArgumentParser(add_help=False)
    add_config_flag(pre)
    known, _ = pre.parse_known_args(argv)
    if known.config:
        parser.set_defaults(**yaml_defaults(parser, read_yaml(known.config), known.config))
    return parser.parse_args(argv)


def dump_config(options: Mapping[str, Any], exclude: tuple[str, ...] = ("config", "resume", "data")) -> str:
    """The resolved options (by flag name) as YAML: ``train.py -c`` on it repeats the run."""
    data = {key: value for key, value in sorted(options.items()) if key not in exclude}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)

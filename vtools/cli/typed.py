"""The command edge: a parse's argparse Namespace turned once into the frozen, typed options a command runs with.

The Namespace stays inside vtools/cli/ (argparse fills it; the YAML file and the cross-option checks act on
it), and nothing below the command line takes one: the runner and the Python API hand each command its
options as :func:`command_options` makes them, train.py a :class:`~vtools.options.train_job.TrainJob`, every
other command a frozen dataclass generated from its flags' declarations (one typed field per flag). Library
functions then take the concern they read (``RuntimeOptions`` beside ``setup_runtime``, ...), filled here
by field name with :func:`typed_options`. A field the options lack is a programming error, not a user's.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import typing
from typing import Any, TypeVar

from vtools.cli import registry
from vtools.options.declare import ANNOTATION, DECLARATION, ParsedOptions

T = TypeVar("T")


def command_options(name: str, parsed: argparse.Namespace) -> Any:
    """Command ``name``'s parse as the typed options its ``run`` takes: what its flags module's
    ``typed(parsed)`` makes where it has one (train.py's job), else :func:`options_type`'s dataclass."""
    flags = importlib.import_module(registry.command(name).flags)
    typed = getattr(flags, "typed", None)
    return typed(parsed) if typed is not None else generated_options(name, parsed)


def generated_options(name: str, parsed: argparse.Namespace, **extra: Any) -> ParsedOptions:
    """``parsed`` as command ``name``'s generated options; a flag another parse of the command leaves out
    (parity's --train reads a few of its flags) keeps its default. ``extra``: fields beyond the flags."""
    cls = options_type(name, tuple(extra))
    given = {
        field.name: getattr(parsed, field.name) for field in dataclasses.fields(cls) if hasattr(parsed, field.name)
    }
    return cls(**given, **extra)


@functools.cache
def options_type(name: str, extra: tuple[str, ...] = ()) -> type[ParsedOptions]:
    """The frozen dataclass of command ``name``'s options: a field per declared flag, typed by its
    declaration, defaulting to the command's default (made once per process, from the command's parser).
    ``extra`` names fields a command's parse adds beyond its flags (any type, no default)."""
    parser = registry.build_parser(name)
    fields: list[tuple[str, Any, Any]] = [
        (
            action.dest,
            getattr(action, ANNOTATION),
            dataclasses.field(default_factory=functools.partial(_copy, action.default)),
        )
        for action in parser._actions
        if hasattr(action, DECLARATION)
    ]
    fields += [(field_name, Any, dataclasses.field()) for field_name in extra]
    title = "".join(part.title() for part in name.replace("-", "_").split("_"))
    cls = dataclasses.make_dataclass(f"{title}Options", fields, bases=(ParsedOptions,), frozen=True, kw_only=True)
    cls.__module__ = __name__
    return cls


def _copy(value: Any) -> Any:
    """A default's own copy (a list default is not shared between parses)."""
    return type(value)(value) if isinstance(value, (list, dict)) else value


def typed_options(cls: type[T], args: Any, **overrides: Any) -> T:
    """``cls`` (a dataclass) filled from ``args`` (a parse, or a command's typed options) by field name; a
    field whose type is itself a dataclass is filled the same way from the same values, so a job's concerns
    nest. ``overrides`` replace values the command resolved after parsing (a batch size fitted to the set)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        if field.name in overrides:
            values[field.name] = overrides[field.name]
        elif dataclasses.is_dataclass(hints[field.name]):
            values[field.name] = typed_options(hints[field.name], args)
        elif hasattr(args, field.name):
            values[field.name] = getattr(args, field.name)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise AttributeError(f"{cls.__name__}.{field.name}: the command's options have no {field.name}")
    return cls(**values)

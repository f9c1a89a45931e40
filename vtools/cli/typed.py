"""The command edge: an argparse Namespace turned once into the frozen option dataclasses the library takes.

The Namespace stays the file format (timm's ``args.yaml`` must round-trip, defaults < YAML < flags), but no
library function receives it: each declares the dataclass of the options it reads (``RuntimeOptions``
beside ``setup_runtime``, the training job's concerns in ``vtools/options/train_job.py``), and a command builds
those here by field name. A field the Namespace lacks is a programming error, not a user's.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def typed_options(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """``cls`` (a dataclass) filled from ``args`` by field name; a field whose type is itself a dataclass
    is filled the same way from the same Namespace, so a job's concerns nest. ``overrides`` replace values
    the command resolved after parsing (a batch size fitted to the set, say)."""
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


def option_names(cls: type) -> set[str]:
    """Every option name ``cls`` reads, its nested concerns' included: what a test compares with a parser."""
    hints = typing.get_type_hints(cls)
    names: set[str] = set()
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[field.name]):
            names |= option_names(hints[field.name])
        else:
            names.add(field.name)
    return names

"""train.py's own flags generated from their declarations (vtools/options/train_job.py), and their checks.

A field declared with :func:`vtools.options.declare.option` becomes one ``add_argument`` call here: its
annotation gives the value type (``bool``: a switch; ``list[float]``: numbers; ``X | None``: an X or
nothing), its declaration the flags, default, help and what argparse needs beyond that. The checks of
declared ranges run for the command line, the YAML file and the Python API alike (``refusals``).
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any

from vtools.cli.options import may_change_on_resume
from vtools.cli.parser import KeyValuePairs
from vtools.errors import UsageError
from vtools.options.declare import declared_fields, default_of, refusals
from vtools.options.values import KEY_VALUE_PAIRS


def add_declared(group: argparse._ActionsContainer, concern: type) -> None:
    """Add every declared field of the dataclass ``concern`` to ``group``, in declaration order."""
    group.register("action", KEY_VALUE_PAIRS, KeyValuePairs)
    hints = typing.get_type_hints(concern)
    for field, declared in declared_fields(concern):
        keywords = {**_value_keywords(hints[field.name]), **declared.argparse}
        action = group.add_argument(
            *declared.flags, dest=field.name, default=default_of(field), help=declared.help, **keywords
        )
        if declared.resume:
            may_change_on_resume(action)


def _value_keywords(annotation: Any) -> dict[str, Any]:
    """What argparse needs to read a value of ``annotation``: a switch for ``bool``, the element type for
    lists (their ``nargs`` is declared), the type for numbers; text needs nothing."""
    kinds = [kind for kind in typing.get_args(annotation) if kind is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(kinds) == 1:
        annotation = kinds[0]  # X | None
    if annotation is bool:
        return {"action": "store_true"}
    if typing.get_origin(annotation) is list:
        (annotation,) = typing.get_args(annotation)
    return {"type": annotation} if annotation in (int, float) else {}


def check_declared(args: argparse.Namespace, *concerns: type) -> None:
    """Refuse the first value of a declared field of ``concerns`` outside its allowed values."""
    for concern in concerns:
        found = refusals(concern, lambda name: getattr(args, name))
        if found:
            raise UsageError(found[0])

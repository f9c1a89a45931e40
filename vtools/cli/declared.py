"""Every command's flags generated from their declarations (vtools/options/), and their checks.

A field declared with :func:`vtools.options.declare.option` (or ``refused``/``no_op`` for timm's flags that
cannot act here) becomes one ``add_argument`` call here, the only one in vtools: its annotation gives the
value type (``bool``: a switch; ``list[float]``: numbers; ``X | None``: an X or nothing), its declaration
the flags, default, help and what argparse needs beyond that. Each generated flag keeps its declaration,
so the parser itself refuses a value outside the declared range (vtools/cli/parser.py) for the command
line, the YAML file and the Python API alike, in every command that has the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from vtools.cli.parser import KeyValuePairs
from vtools.cli.timm_compat import mark_no_op, mark_refused
from vtools.options.declare import ANNOTATION, DECLARATION, Declaration, declared_fields, default_of
from vtools.options.values import KEY_VALUE_PAIRS

_MAY_CHANGE_ON_RESUME = "vtools_may_change_on_resume"


def may_change_on_resume(action: argparse.Action) -> argparse.Action:
    """Mark a flag a resumed run may give another value than the run it continues: where things go, how
    fast they run, how much is logged (vtools/train/resume.py compares every other option with the
    checkpoint's). A declared flag is marked from its declaration (``resume=True``)."""
    setattr(action, _MAY_CHANGE_ON_RESUME, True)
    return action


def resume_changeable(parser: argparse.ArgumentParser) -> frozenset[str]:
    """The dests of ``parser``'s flags marked :func:`may_change_on_resume`."""
    return frozenset(action.dest for action in parser._actions if getattr(action, _MAY_CHANGE_ON_RESUME, False))


def add_declared(
    group: argparse._ActionsContainer,
    concern: type,
    only: Iterable[str] | None = None,
    changes: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Add the declared fields of the dataclass ``concern`` to ``group``, in declaration order: all of them,
    or those named in ``only`` (in ``only``'s order). ``changes`` gives a command's own default, help,
    metavar or reason for a field (``{"batch_size": {"default": 256}}``); its flags, type and allowed values
    stay the declaration's, so a range holds in every command that has the flag."""
    group.register("action", KEY_VALUE_PAIRS, KeyValuePairs)
    hints = typing.get_type_hints(concern)
    declared = {field.name: (field, found) for field, found in declared_fields(concern)}
    for name in declared if only is None else only:
        field, found = declared[name]
        change = dict((changes or {}).get(name, {}))
        unknown = set(change) - CHANGEABLE
        if unknown:
            raise TypeError(f"{concern.__name__}.{name}: a command may change {sorted(CHANGEABLE)}, not {unknown}")
        found = _changed(found, change.pop("help", None), change.pop("reason", None), change.pop("no_op", None))
        default = change.pop("default", default_of(field))
        action = _add_one(group, name, found, default, {**_value_keywords(hints[name]), **found.argparse, **change})
        setattr(action, ANNOTATION, hints[name])  # the typed options' field (vtools/cli/typed.py)


def _changed(declared: Declaration, help_text: str | None, reason: str | None, no_op: str | None) -> Declaration:
    """``declared`` with a command's own help, its own reason for a refused or no-op flag, or a working
    flag made a no-op in this command (``no_op``: why every value gives the same results here)."""
    if reason is not None and declared.refused is None and declared.no_op is None:
        raise TypeError(f"{declared.flags[0]} works here: it has a help text, not a reason")
    return dataclasses.replace(
        declared,
        help=help_text if help_text is not None else declared.help,
        refused=(reason or declared.refused) if declared.refused is not None else None,
        no_op=no_op or ((reason or declared.no_op) if declared.no_op is not None else None),
    )


# what a command may give a shared declaration of its own: presentation and default, never its range
CHANGEABLE = frozenset({"default", "help", "metavar", "reason", "no_op"})


def _add_one(
    group: argparse._ActionsContainer, name: str, declared: Declaration, default: Any, keywords: dict[str, Any]
) -> argparse.Action:
    positional = not declared.flags[0].startswith("-")
    where = {} if positional else {"dest": name}
    action = group.add_argument(*declared.flags, default=default, help=declared.help, **where, **keywords)
    if declared.refused is not None:
        mark_refused(action, declared.refused)
    elif declared.no_op is not None:
        mark_no_op(action, declared.no_op)
    setattr(action, DECLARATION, declared)
    if declared.resume:
        may_change_on_resume(action)
    return action


def _value_keywords(annotation: Any) -> dict[str, Any]:
    """What argparse needs to read a value of ``annotation``: a switch for ``bool``, the choices of a
    ``Literal``, the element type for lists (their ``nargs`` is declared), the type for numbers; text needs
    nothing."""
    kinds = [kind for kind in typing.get_args(annotation) if kind is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(kinds) == 1:
        annotation = kinds[0]  # X | None
    if typing.get_origin(annotation) is typing.Literal:
        return {"choices": typing.get_args(annotation)}
    if annotation is bool:
        return {"action": "store_true"}
    if typing.get_origin(annotation) is list:
        (annotation,) = typing.get_args(annotation)
    return {"type": annotation} if annotation in (int, float) else {}

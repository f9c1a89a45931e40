"""An option declared once: a dataclass field that carries its flags, default, help, allowed values and
whether a resumed run may change it.

The typed options the library takes (vtools/options/train_job.py) are where an option is declared; the
command line's parser (vtools/cli/declared.py) and the checks that the scripts and the Python API share read
these fields, so a flag's spelling, default, range and resume rule cannot drift between copies. As
transformers' ``HfArgumentParser`` does, the argparse details ride in the field's metadata; unlike it, the
flags keep timm's exact spellings (aliases, ``nargs``, ``--no-*`` names), which are written out here.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DECLARATION = "vtools_option"  # the metadata key of a declared field
ANNOTATION = "vtools_annotation"  # where a generated flag keeps its field's type


@dataclass(frozen=True)
class Allowed:
    """The values a run can use, beyond what the flag's type lets through; ``refusal`` words the one-line
    error as ``--flag must be ..., got VALUE``."""

    test: Callable[[Any], bool]
    says: str  # what follows the flag: "must be 0 or more"
    hint: Callable[[Any], str] | None = None  # words for a likely slip, after the value ("a percentage?")

    def refusal(self, flag: str, value: Any) -> str | None:
        """The error for ``value`` given to ``flag``, or None when it is allowed (None values always are)."""
        if value is None or self.test(value):
            return None
        shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
        return f"{flag} {self.says}, got {shown}{self.hint(value) if self.hint else ''}"


POSITIVE = Allowed(lambda v: v > 0, "must be a positive integer")
ABOVE_ZERO = Allowed(lambda v: v > 0, "must be greater than 0")
NOT_NEGATIVE = Allowed(lambda v: v >= 0, "must be 0 or more")
FRACTION = Allowed(lambda v: 0 <= v <= 1, "must be from 0 to 1")
AUG_REPEATS = Allowed(lambda v: v == 0 or v >= 1, "must be 0 (off) or at least 1")
DROP_RATE = Allowed(lambda v: 0 <= v < 1, "must be from 0 up to (not including) 1")
# Adam-style betas (two, or three for Adan): each a moving average's decay, which torch checks in [0, 1)
BETAS = Allowed(lambda v: all(0 <= beta < 1 for beta in v), "takes values from 0 up to (not including) 1")
# timm parses one or more numbers for a range; its transforms need exactly two, low then high
LOW_HIGH = Allowed(lambda v: len(v) == 2 and v[0] <= v[1], "takes two values, low and high")
AT_LEAST_ONE = Allowed(lambda v: v >= 1, "must be 1 or more")


def between(low: float, high: float, unit: str = "") -> Allowed:
    """Values from ``low`` to ``high``, both included."""
    return Allowed(lambda v: low <= v <= high, f"must be from {low:g} to {high:g}{unit}")


@dataclass(frozen=True)
class Declaration:
    """How a field is given on the command line: what the generated parser and checks read."""

    flags: tuple[str, ...]  # a name without dashes: a positional argument
    help: str
    resume: bool  # a resumed run may give it another value than the run it continues
    allowed: Allowed | None
    argparse: dict[str, Any]  # what argparse needs beyond the field's type and default: nargs, choices, metavar...
    refused: str | None = None  # a timm flag only its default may take here: why, and what to use instead
    no_op: str | None = None  # a timm flag every value of which gives the same results here: why


def option(
    *flags: str,
    default: Any,
    help: str,  # noqa: A002 - argparse's own keyword
    resume: bool = False,
    allowed: Allowed | None = None,
    **argparse_keywords: Any,
) -> Any:
    """A dataclass field declared as the command-line option ``flags``. The field's annotation gives the
    value type (``bool`` is a switch, ``list[float]`` several numbers); ``argparse_keywords`` add what the
    annotation cannot say (``nargs``, ``choices``, ``metavar``, a parsing ``type`` or ``action``)."""
    return _declared_field(default, Declaration(flags, help, resume, allowed, argparse_keywords))


def refused(*flags: str, default: Any, reason: str, resume: bool = False, **argparse_keywords: Any) -> Any:
    """A field declared as a timm flag that only ``default`` (timm's) may take here; ``reason`` says why
    and what to use instead. Hidden from ``--help``, listed in the README's compatibility table."""
    return _declared_field(default, Declaration(flags, "", resume, None, argparse_keywords, refused=reason))


def no_op(*flags: str, default: Any, reason: str, resume: bool = False, **argparse_keywords: Any) -> Any:
    """A field declared as a timm flag that changes nothing here (``reason`` says why): any value runs."""
    return _declared_field(default, Declaration(flags, "", resume, None, argparse_keywords, no_op=reason))


def _declared_field(default: Any, declared: Declaration) -> Any:
    metadata = {DECLARATION: declared}
    if isinstance(default, (list, dict)):  # a fresh copy per instance, as argparse gives each parse
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declaration(field: dataclasses.Field) -> Declaration | None:
    """``field``'s declaration, or None for a field another module's flag fills (a shared flag)."""
    return field.metadata.get(DECLARATION)


def default_of(field: dataclasses.Field) -> Any:
    """The declared default of ``field``, a fresh copy for lists and dicts."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def declared_fields(concern: type) -> list[tuple[dataclasses.Field, Declaration]]:
    """The fields of the dataclass ``concern`` declared here, in declaration order."""
    return [(field, found) for field in dataclasses.fields(concern) if (found := declaration(field)) is not None]


@dataclass(frozen=True, kw_only=True)
class ParsedOptions:
    """A command's options once parsed: one typed field per flag, frozen. The command line's edge makes a
    subclass per command from its flags' declarations (vtools/cli/typed.py), so the library reads declared,
    typed values that nothing below the command line can change, never a parser's namespace."""

    def values(self) -> dict[str, Any]:
        """Every option by name, as config files and trackers show them."""
        return flat_values(self)


def flat_values(options: Any) -> dict[str, Any]:
    """Every leaf field of the dataclass ``options`` by name, the fields of nested concerns included (a
    training job's ``optim.lr`` as ``lr``): the flags' names, as timm's args.yaml keys them."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        if dataclasses.is_dataclass(value):
            values |= flat_values(value)
        else:
            values[field.name] = value
    return values


def option_names(cls: type) -> set[str]:
    """Every option name the dataclass ``cls`` holds, its nested concerns' included."""
    hints = typing.get_type_hints(cls)
    names: set[str] = set()
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[field.name]):
            names |= option_names(hints[field.name])
        else:
            names.add(field.name)
    return names

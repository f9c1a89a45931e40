"""vtools/evaluation/validation.py: validate.py's options as the library takes them."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import acting_dests
from vtools.cli.validate_flags import build_parser
from vtools.evaluation.assembly import EvalOptions
from vtools.evaluation.model_flags import ReadyOptions
from vtools.evaluation.validation import ValidationOptions
from vtools.options.declare import option_names
from vtools.runtime.options import RuntimeOptions

pytestmark = pytest.mark.cpu_only(reason="compares dataclasses with the parser; runs nothing on a device")

# validate.py's flags its command reads itself and hands to the library as other arguments, or not at all
EDGE_ONLY = {
    "checkpoint": "expanded (a folder, a glob) into model/checkpoint pairs, each passed to validate_model",
    "gp": "merged into model_kwargs as timm passes it (resolved_model_flags)",
    "use_train_size": "resolved into EvalOptions.use_test_size",
    "report": "one class report folder per pair, passed to validate_model",
    "results_file": "the command writes the rows",
    "results_format": "the command writes the rows",
    "retry": "the command retries a pair with smaller batches (dataclasses.replace of batch_size)",
    "no_cpu_fallback": "the command's FallbackWatch",
    "profile": "the command wraps the loader in its step profiler",
    "log_mlflow": "the command's tracker scope sends each results row (vtools/observe/run_trackers.py)",
    "mlflow_experiment": "the command's tracker scope sends each results row (vtools/observe/run_trackers.py)",
}
RESOLVED = {"use_test_size"}  # fields the command resolves from other flags: no flag of that name


def missing_and_extra(fields: set[str]) -> tuple[set[str], set[str]]:
    """Flags neither a field nor read at the edge; fields no flag (or resolved value) fills."""
    dests = acting_dests(build_parser())
    return dests - fields - set(EDGE_ONLY), fields - dests - RESOLVED


def library_fields() -> set[str]:
    """What validate.py's library calls read: the validation's options and the runtime's."""
    return option_names(ValidationOptions) | option_names(RuntimeOptions)


def test_every_validate_flag_is_a_field_or_read_at_the_edge() -> None:
    missing, extra = missing_and_extra(library_fields())
    assert not missing, f"validate.py flags no option holds and the command does not read: {sorted(missing)}"
    assert not extra, f"ValidationOptions fields that are no validate.py flag: {sorted(extra)}"
    assert not set(EDGE_ONLY) & library_fields(), "a flag is either the library's or the edge's"


def test_a_missing_field_is_caught() -> None:
    assert missing_and_extra(library_fields() - {"real_labels"}) == ({"real_labels"}, set())
    assert missing_and_extra(library_fields() | {"planted"}) == (set(), {"planted"})


@pytest.mark.parametrize("options", [ValidationOptions, EvalOptions, ReadyOptions])
def test_the_options_are_frozen_and_declare_no_defaults(options: type) -> None:
    """Defaults live in the flag definitions, once."""
    assert options.__dataclass_params__.frozen
    assert [f.name for f in dataclasses.fields(options) if f.default is not dataclasses.MISSING] == []

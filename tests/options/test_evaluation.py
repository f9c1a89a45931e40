"""validate.py's and inference.py's own options (vtools/options/evaluation.py): their ranges, refused and
no-op flags, and inference.py's results flags, which mean other things than validate.py's (timm's)."""

from __future__ import annotations

import pytest

from vtools.cli import registry
from vtools.cli.timm_compat import no_op_flags, refused_flags
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="parses command lines; runs nothing on a device")


@pytest.mark.parametrize(
    "command, argv, words",
    [
        ("validate", ["--report-worst", "-1"], "--report-worst must be 0 (every mistake) or more, got -1"),
        ("validate", ["--calibration-bins", "0"], "--calibration-bins must be 1 or more, got 0"),
        ("validate", ["--crop-border-pixels", "-2"], "--crop-border-pixels must be 0 or more, got -2"),
        ("infer", ["--topk", "-1"], "--topk must be 0 (every class) or positive, got -1"),
    ],
)
def test_an_unusable_value_stops_in_one_line(command: str, argv: list[str], words: str) -> None:
    with pytest.raises(UsageError) as refused:
        registry.build_parser(command).parse_args(argv)
    assert str(refused.value) == words


def test_the_refused_and_no_op_flags_carry_their_reasons() -> None:
    validate = registry.build_parser("validate")
    assert "TensorFlow" in refused_flags(validate)["--tf-preprocessing"]
    assert "knows its size" in no_op_flags(validate)["--num-samples"]
    with pytest.raises(UsageError, match="^--tf-preprocessing: TensorFlow"):
        validate.parse_args(["--tf-preprocessing"])
    infer = registry.build_parser("infer")
    assert "train input size" in no_op_flags(infer)["--use-train-size"]  # a working flag in validate.py
    assert "--use-train-size" not in no_op_flags(validate)


def test_inference_writes_several_formats_validate_one() -> None:
    infer = registry.build_parser("infer").parse_args(["--results-format", "csv", "jsonl"])
    assert infer.results_format == ["csv", "jsonl"] and infer.results_file is None
    validate = registry.build_parser("validate").parse_args([])
    assert (validate.results_format, validate.results_file) == ("csv", "")
    with pytest.raises(UsageError):
        registry.build_parser("validate").parse_args(["--results-format", "jsonl"])

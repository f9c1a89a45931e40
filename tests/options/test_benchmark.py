"""vtools benchmark's own options (vtools/options/benchmark.py): timm's benchmark.py values, their ranges,
and the choices the measuring code acts on."""

from __future__ import annotations

import pytest

from vtools.cli import registry
from vtools.errors import UsageError
from vtools.options.benchmark import BENCH_MODES, PRECISIONS

pytestmark = pytest.mark.cpu_only(reason="parses command lines; runs nothing on a device")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--num-warm-iter", "-1"], "--num-warm-iter must be 0 or more, got -1"),
        (["--num-bench-iter", "0"], "--num-bench-iter must be 1 or more, got 0"),
    ],
)
def test_a_step_count_no_measurement_can_use_stops_in_one_line(argv: list[str], words: str) -> None:
    with pytest.raises(UsageError) as refused:
        registry.build_parser("benchmark").parse_args(argv)
    assert str(refused.value) == words


def test_no_untimed_step_is_allowed() -> None:
    assert registry.build_parser("benchmark").parse_args(["--num-warm-iter", "0"]).num_warm_iter == 0


def test_every_precision_and_mode_is_one_the_measuring_code_knows() -> None:
    import torch

    from vtools.evaluation import speed

    weights = {name: speed.Precision.named(name).weights for name in PRECISIONS}
    assert weights["bfloat16"] == torch.bfloat16 and weights["amp"] == torch.float32
    assert set(speed.RUNNERS) == set(BENCH_MODES)

"""``vtools benchmark``'s own options, declared once (timm's benchmark.py names, defaults and meanings); the
model, input, training-step and device flags it shares with train.py and the evaluation scripts are theirs
(vtools/options/shared.py, vtools/options/train_job.py), ranges included."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vtools.options.declare import AT_LEAST_ONE, NOT_NEGATIVE, option

BENCH_MODES = ("inference", "train", "both", "profile", "profile_deepspeed", "profile_fvcore")
# timm's --precision values (resolve_precision); --amp picks amp or amp_bfloat16 from --amp-dtype
PRECISIONS = ("amp", "amp_bfloat16", "float16", "bfloat16", "float32")


@dataclass(frozen=True, kw_only=True)
class BenchmarkFlags:
    """What is measured, how long, and in which precision."""

    title: ClassVar[str] = "what is measured"

    model_list: str = option(
        "--model-list", default="", metavar="FILE|WILDCARD", help="models: a file of names, or resnet*"
    )
    bench: str = option("--bench", default="both", choices=BENCH_MODES, help="(default: both)")
    detail: bool = option("--detail", default=False, help="train: forward, backward and optimizer times apart")
    no_retry: bool = option("--no-retry", default=False, help="out of memory: no retry at a smaller batch")
    num_warm_iter: int = option(
        "--num-warm-iter", default=10, allowed=NOT_NEGATIVE, metavar="N", help="untimed steps first (default: 10)"
    )
    num_bench_iter: int = option(
        "--num-bench-iter", default=40, allowed=AT_LEAST_ONE, metavar="N", help="timed steps (default: 40)"
    )
    precision: str = option("--precision", default="float32", choices=PRECISIONS, help="(default: float32; --amp wins)")

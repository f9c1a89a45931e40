"""``vtools benchmark``'s flags, read before torch is imported: timm's benchmark.py options, generated from
the declarations they share with train.py and the evaluation scripts (ranges included) and their own
(vtools/options/benchmark.py)."""

from __future__ import annotations

import argparse
from typing import Any

from vtools.cli.declared import add_declared
from vtools.cli.parser import OneLineParser, check_values
from vtools.options.benchmark import BenchmarkFlags
from vtools.options.shared import DeviceFlags, EvalModelFlags, LoadingFlags, ModelFlags, PreprocessFlags, ResultFlags
from vtools.options.train_job import AugmentOptions, ModelOptions, OptimOptions

DESCRIPTION = """A model's images per second, step time and peak memory, on any device (timm's benchmark.py).

timm's flags, defaults and meanings: --bench inference, train, both (default) or profile (GMACs with
deepspeed or fvcore), synthetic batches at the model's input size, --num-warm-iter steps left out of
the timing, then --num-bench-iter timed; an out-of-memory error retries at a smaller batch (unless
--no-retry). Every step is timed to its end on the device (timm waits only on CUDA). One model, a
--model wildcard (resnet*), or --model-list: a file of names or a wildcard; a model that fails is a row
with its error. Rows go to --results-file (csv or json) and, after ``--result``, to stdout as JSON.

Examples:
  vtools benchmark --model resnet50 --device npu --amp
  vtools benchmark --model-list 'resnet1*' --bench inference --results-file speeds.csv
"""
REMOVED_REASON = "removed from PyTorch (TorchScript and functorch's AOT fusion); use --torchcompile"

# group title -> (concern, its fields here) in --help's order
GROUPS: dict[str, tuple[tuple[type, tuple[str, ...]], ...]] = {
    BenchmarkFlags.title: (
        (BenchmarkFlags, ("model_list", "bench", "detail", "no_retry")),
        (ResultFlags, ("results_file", "results_format")),
        (BenchmarkFlags, ("num_warm_iter", "num_bench_iter")),
    ),
    "model and input": (
        (ModelFlags, ("model",)),
        (LoadingFlags, ("batch_size",)),
        (PreprocessFlags, ("img_size", "input_size")),
        (EvalModelFlags, ("use_train_size",)),
        (ModelFlags, ("num_classes", "gp", "channels_last")),
        (ModelOptions, ("grad_checkpointing",)),
        (BenchmarkFlags, ("precision",)),
        (ModelFlags, ("fast_norm",)),
        (EvalModelFlags, ("reparam",)),
        (ModelFlags, ("model_kwargs", "torchcompile_mode", "torchcompile")),
    ),
    "training step": (
        (OptimOptions, ("opt", "opt_eps", "opt_betas", "momentum", "weight_decay", "clip_grad", "clip_mode")),
        (AugmentOptions, ("smoothing",)),
        (ModelOptions, ("drop", "drop_path", "drop_block")),
    ),
    DeviceFlags.title: ((DeviceFlags, ("device", "device_modules", "amp", "amp_dtype")),),
    "timm compatibility": ((ModelFlags, ("torchscript", "fuser")), (EvalModelFlags, ("aot_autograd",))),
}
# timm's benchmark.py defaults and short helps where they are not the shared declarations'
CHANGES: dict[str, dict[str, Any]] = {
    "results_file": {"help": "also write the rows here"},
    "model": {"default": "resnet50", "help": "timm name, wildcard or all"},
    "batch_size": {"default": 256, "help": "(default: 256)"},
    "img_size": {"help": "(default: the model's)"},
    "input_size": {"help": "e.g. 3 224 224"},
    "use_train_size": {"help": "the model's train size, not its test size"},
    "num_classes": {"help": "(default: the model's)"},
    "gp": {"help": "global pool type (default: the model's)"},
    "channels_last": {"default": False, "help": "channels-last memory layout"},
    "grad_checkpointing": {"help": "train: recompute activations"},
    "fast_norm": {"help": "timm's fast normalization layers"},
    "reparam": {"help": "reparameterize the model (RepVGG, MobileOne...)"},
    "model_kwargs": {"help": "for timm"},
    "torchcompile_mode": {"help": "torch.compile mode"},
    "torchcompile": {"help": "compile"},
    "opt": {"help": "timm optimizer (default: sgd)"},
    "opt_eps": {"help": "(default: the optimizer's)"},
    "opt_betas": {"help": "(default: its own)"},
    "momentum": {"help": "(default: 0.9)"},
    "weight_decay": {"default": 0.0001, "help": "(default: 0.0001)"},
    "clip_grad": {"help": "gradient clipping threshold"},
    "clip_mode": {"help": "(default: norm)"},
    "smoothing": {"help": "label smoothing (default: 0.1)"},
    "torchscript": {"reason": REMOVED_REASON},
    "aot_autograd": {"reason": REMOVED_REASON},
    "fuser": {"reason": "TorchScript's fusers went with TorchScript; use --torchcompile"},
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vtools benchmark", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for title, parts in GROUPS.items():
        group = parser.add_argument_group(title)
        for concern, names in parts:
            add_declared(group, concern, only=names, changes={name: CHANGES[name] for name in names if name in CHANGES})
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """benchmark's options, with every check that reads only them done (each flag's range as it is read)."""
    return check(build_parser().parse_args(argv))


def check(args: argparse.Namespace) -> argparse.Namespace:
    """The rules several of benchmark's options make together (the input's channels, --amp with a dtype)."""
    check_values(args)
    return args

"""The flags validate.py and inference.py share beyond every script's groups (vtools/cli/options.py).

timm's two evaluation scripts give some of these a different default or meaning (``--results-file`` is a
path in validate.py, a name inside ``--results-dir`` in inference.py): each flag is still added once, with
the script's own spec taken from a table.
"""

from __future__ import annotations

import argparse
from typing import Any

from vtools.cli.timm_compat import add_refused, mark_no_op
from vtools.derived_options import model_in_chans, timm_model_kwargs
from vtools.errors import UsageError
from vtools.results import RESULT_FORMATS

NUM_GPU_REASON = (
    "wraps the model in DataParallel over several GPUs, which is not supported here: one process runs "
    "on one device; choose it with --device (e.g. cuda:1, npu:1)"
)
AOT_AUTOGRAD_REASON = (
    "functorch's memory_efficient_fusion (AOT Autograd) is deprecated in torch 2.x and not supported here; "
    "use --torchcompile"
)
INFER_TRAIN_SIZE_REASON = (
    "timm's inference.py always resolves the model's train input size (never its test size), and so does "
    "inference.py here"
)

SPLIT_HELP = {
    "validate": "split to validate: folder, split name or shard pattern (default: validation)",
    "inference": "with --dataset: the split to classify (default: validation)",
}

# script -> (--results-file's spec, --results-format's spec)
RESULTS_SPECS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "validate": (
        {"default": "", "metavar": "PATH", "help": "write one row per model here"},
        {"default": "csv", "choices": ("csv", "json"), "help": "(default: csv)"},
    ),
    "inference": (
        {
            "default": None,
            "metavar": "NAME",
            "help": "results file name (default: <model>-topk<K>); one file per --results-format",
        },
        {
            "nargs": "+",
            "default": ["csv"],
            "choices": RESULT_FORMATS,
            "help": "one or more of csv, json, jsonl (default: csv)",
        },
    ),
}


def add_threshold(group: argparse._ArgumentGroup, what: str) -> argparse.Action:
    """--threshold, the probability from which a multi-label model's class counts as predicted; ``what``
    says what it decides in this script."""
    return group.add_argument(
        "--threshold",
        type=float,
        default=0.5,
        metavar="P",
        help=f"multi-label models: a class counts as predicted when its probability is at least P ({what}) "
        "(default: 0.5)",
    )


def check_threshold(args: argparse.Namespace) -> None:
    """--threshold is a probability."""
    if not 0 <= args.threshold <= 1:
        raise UsageError(f"--threshold must be from 0 to 1, got {args.threshold}")


def add_split(group: argparse._ArgumentGroup, script: str) -> None:
    group.add_argument("--split", default="validation", help=SPLIT_HELP[script])


def add_results_file_and_format(group: argparse._ArgumentGroup, script: str) -> None:
    file_spec, format_spec = RESULTS_SPECS[script]
    group.add_argument("--results-file", **file_spec)
    group.add_argument("--results-format", **format_spec)


def add_eval_model_args(parser: argparse.ArgumentParser, script: str) -> None:
    """--use-train-size, --reparam (validate), --test-pool, --num-gpu, --aot-autograd (``script``: validate or
    inference). vtools/evaluation/model_flags.py acts on them."""
    group = parser.add_argument_group("timm's evaluation model flags")
    use_train_size = group.add_argument(
        "--use-train-size",
        action="store_true",
        default=False,
        help="use the model's train input size and crop even when its pretrained config has a test size "
        "(default: the test size, as timm's validate.py)",
    )
    if script == "inference":
        mark_no_op(use_train_size, INFER_TRAIN_SIZE_REASON)
    else:
        group.add_argument(
            "--reparam",
            action="store_true",
            default=False,
            help="fuse re-parameterizable branches (RepVGG, MobileOne, FastViT...) before validating",
        )
    group.add_argument(
        "--test-pool",
        action="store_true",
        default=False,
        help="test-time pooling when the input is larger than the model's pretrained size (crop 1.0 then)",
    )
    add_refused(group, "--num-gpu", type=int, default=1, reason=NUM_GPU_REASON)
    add_refused(group, "--aot-autograd", action="store_true", default=False, reason=AOT_AUTOGRAD_REASON)


def resolved_model_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The evaluation model options the scripts resolve from several flags, as timm's scripts do: the
    input channels (--in-chans, else --input-size's) and create_model's kwargs (--model-kwargs with --gp).
    A command passes them as overrides when it builds ``vtools.evaluation.assembly.EvalOptions``."""
    return {"in_chans": model_in_chans(args), "model_kwargs": timm_model_kwargs(args)}

"""The flag groups validate.py and inference.py share beyond every script's (vtools/cli/options.py),
generated from their declarations (vtools/options/shared.py) with each script's own help."""

from __future__ import annotations

import argparse
from typing import Any

from vtools.cli.declared import add_declared
from vtools.derived_options import model_in_chans, timm_model_kwargs
from vtools.options.shared import EvalModelFlags, ResultFlags, SourceFlags

INFER_TRAIN_SIZE_REASON = (
    "timm's inference.py always resolves the model's train input size (never its test size), and so does "
    "inference.py here"
)
THRESHOLD_HELP = (
    "multi-label models: a class counts as predicted when its probability is at least P ({what}) (default: 0.5)"
)
SPLIT_HELP = {
    "validate": "split to validate: folder, split name or shard pattern (default: validation)",
    "inference": "with --dataset: the split to classify (default: validation)",
}


def add_threshold(group: argparse._ArgumentGroup, what: str) -> None:
    """--threshold, the probability from which a multi-label model's class counts as predicted; ``what``
    says what it decides in this script."""
    changes = {"threshold": {"help": THRESHOLD_HELP.format(what=what)}}
    add_declared(group, ResultFlags, only=("threshold",), changes=changes)


def add_split(group: argparse._ArgumentGroup, script: str) -> None:
    add_declared(group, SourceFlags, only=("split",), changes={"split": {"help": SPLIT_HELP[script]}})


def add_eval_model_args(parser: argparse.ArgumentParser, script: str) -> None:
    """--use-train-size, --reparam (validate), --test-pool, --num-gpu, --aot-autograd (``script``: validate or
    inference). vtools/evaluation/model_flags.py acts on them."""
    group = parser.add_argument_group(EvalModelFlags.title)
    if script == "inference":
        names = ("use_train_size", "test_pool", "num_gpu", "aot_autograd")
        changes = {"use_train_size": {"no_op": INFER_TRAIN_SIZE_REASON}}
    else:
        names, changes = ("use_train_size", "reparam", "test_pool", "num_gpu", "aot_autograd"), {}
    add_declared(group, EvalModelFlags, only=names, changes=changes)


def resolved_model_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The evaluation model options the scripts resolve from several flags, as timm's scripts do: the
    input channels (--in-chans, else --input-size's) and create_model's kwargs (--model-kwargs with --gp).
    A command passes them as overrides when it builds ``vtools.evaluation.assembly.EvalOptions``."""
    return {"in_chans": model_in_chans(args), "model_kwargs": timm_model_kwargs(args)}

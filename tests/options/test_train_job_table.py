"""Every train.py option that works as in timm reaches what it controls: one table over timm's list.

For the options that shape the recipe, a row gives two values (timm's default, or the first, and another)
and the test builds the run's objects from each through train.py's own parser, the typed job and the
builders train.py calls (model, data config, training transform, optimizer, schedule, mixup, loss, random
erasing, EMA, sampler); what they hold must differ. A value dropped on its way (a keyword left out, a field
not copied, a default hard-coded) builds the same objects twice, and its row fails. The options whose effect
is the run itself (its files, devices, trackers, resume) are listed with why, and each must be exercised
by a test elsewhere. An option of timm's train.py that is neither a row, listed, nor a no-op or refused
flag fails the table test, so a new flag cannot join without one.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import REPO
from tests.timm_reference import timm_options

pytestmark = pytest.mark.cpu_only(reason="builds the run's objects on the host; the device paths: tests/scripts/")

BASE = ["/data", "--model", "test_resnet", "--img-size", "32"]
CLASSES = 10

# dest: (flags of the first value, flags of the other): the built objects must differ between the two
RECIPE_ROWS: dict[str, tuple[list[str], list[str]]] = {
    # the model
    "model": ([], ["--model", "test_vit"]),
    "num_classes": ([], ["--num-classes", "7"]),
    "gp": ([], ["--gp", "max"]),
    "in_chans": ([], ["--in-chans", "1"]),
    "model_kwargs": ([], ["--model-kwargs", "zero_init_last=False"]),
    "head_init_scale": ([], ["--head-init-scale", "0.5"]),
    "head_init_bias": ([], ["--head-init-bias", "-2"]),
    "drop": ([], ["--drop", "0.2"]),
    "drop_connect": ([], ["--drop-connect", "0.2"]),
    "drop_path": ([], ["--drop-path", "0.2"]),
    "drop_block": ([], ["--drop-block", "0.2"]),
    # ResNet takes no BatchNorm arguments (in timm's train.py neither): EfficientNet's builder does
    "bn_momentum": (["--model", "test_efficientnet"], ["--model", "test_efficientnet", "--bn-momentum", "0.5"]),
    "bn_eps": (["--model", "test_efficientnet"], ["--model", "test_efficientnet", "--bn-eps", "0.01"]),
    "grad_checkpointing": ([], ["--grad-checkpointing"]),
    # what the model is fed
    "img_size": ([], ["--img-size", "48"]),
    "input_size": ([], ["--input-size", "3", "40", "40"]),
    "crop_pct": ([], ["--crop-pct", "0.5"]),
    "mean": ([], ["--mean", "0.1", "0.2", "0.3"]),
    "std": ([], ["--std", "0.1", "0.2", "0.3"]),
    "interpolation": ([], ["--interpolation", "nearest"]),
    "no_aug": ([], ["--no-aug"]),
    "train_crop_mode": ([], ["--train-crop-mode", "rkrr"]),
    "scale": ([], ["--scale", "0.5", "1.0"]),
    "ratio": ([], ["--ratio", "0.5", "2.0"]),
    "hflip": ([], ["--hflip", "0.1"]),
    "vflip": ([], ["--vflip", "0.3"]),
    "color_jitter": ([], ["--color-jitter", "0.1"]),
    "color_jitter_prob": ([], ["--color-jitter-prob", "0.5"]),
    "grayscale_prob": ([], ["--grayscale-prob", "0.5"]),
    "gaussian_blur_prob": ([], ["--gaussian-blur-prob", "0.5"]),
    "aa": ([], ["--aa", "rand-m9-mstd0.5"]),
    "train_interpolation": ([], ["--train-interpolation", "bicubic"]),
    "reprob": ([], ["--reprob", "0.25"]),
    "remode": (["--reprob", "0.25"], ["--reprob", "0.25", "--remode", "const"]),
    "recount": (["--reprob", "0.25"], ["--reprob", "0.25", "--recount", "2"]),
    # the optimizer and its learning rate
    "opt": ([], ["--opt", "adamw"]),
    "opt_eps": (["--opt", "adamw"], ["--opt", "adamw", "--opt-eps", "1e-6"]),
    "opt_betas": (["--opt", "adamw"], ["--opt", "adamw", "--opt-betas", "0.8", "0.9"]),
    "momentum": ([], ["--momentum", "0.5"]),
    "weight_decay": ([], ["--weight-decay", "0.05"]),
    "layer_decay": ([], ["--layer-decay", "0.5"]),
    "layer_decay_min_scale": (["--layer-decay", "0.5"], ["--layer-decay", "0.5", "--layer-decay-min-scale", "0.3"]),
    "layer_decay_no_opt_scale": (
        ["--layer-decay", "0.1"],
        ["--layer-decay", "0.1", "--layer-decay-no-opt-scale", "0.05"],
    ),
    "opt_kwargs": (["--opt", "adamw"], ["--opt", "adamw", "--opt-kwargs", "amsgrad=True"]),
    "clip_mode": ([], ["--clip-mode", "agc"]),
    "lr": ([], ["--lr", "0.5"]),
    "lr_base": ([], ["--lr-base", "0.2"]),
    "lr_base_size": ([], ["--lr-base-size", "512"]),
    "lr_base_scale": ([], ["--lr-base-scale", "sqrt"]),
    "batch_size": ([], ["--batch-size", "64"]),
    "grad_accum_steps": ([], ["--grad-accum-steps", "2"]),
    # the schedule
    "sched": ([], ["--sched", "step"]),
    "sched_on_updates": ([], ["--sched-on-updates"]),
    "warmup_lr": ([], ["--warmup-lr", "0.01"]),
    "min_lr": ([], ["--min-lr", "0.001"]),
    "epochs": ([], ["--epochs", "100"]),
    "decay_milestones": (["--sched", "multistep"], ["--sched", "multistep", "--decay-milestones", "10", "20"]),
    "decay_epochs": (["--sched", "step"], ["--sched", "step", "--decay-epochs", "10"]),
    "decay_rate": (["--sched", "step"], ["--sched", "step", "--decay-rate", "0.5"]),
    "warmup_epochs": ([], ["--warmup-epochs", "10"]),
    "warmup_prefix": ([], ["--warmup-prefix"]),
    "cooldown_epochs": ([], ["--cooldown-epochs", "10"]),
    "patience_epochs": (["--sched", "plateau"], ["--sched", "plateau", "--patience-epochs", "2"]),
    "lr_noise": ([], ["--lr-noise", "0.1", "0.9"]),
    "lr_noise_pct": (["--lr-noise", "0.1", "0.9"], ["--lr-noise", "0.1", "0.9", "--lr-noise-pct", "0.2"]),
    "lr_noise_std": (["--lr-noise", "0.1", "0.9"], ["--lr-noise", "0.1", "0.9", "--lr-noise-std", "0.2"]),
    "lr_cycle_mul": (["--lr-cycle-limit", "2"], ["--lr-cycle-limit", "2", "--lr-cycle-mul", "0.5"]),
    "lr_cycle_decay": (["--lr-cycle-limit", "2"], ["--lr-cycle-limit", "2", "--lr-cycle-decay", "0.1"]),
    "lr_cycle_limit": ([], ["--lr-cycle-limit", "2"]),
    "lr_k_decay": ([], ["--lr-k-decay", "0.5"]),
    "seed": (["--lr-noise", "0.1", "0.9"], ["--lr-noise", "0.1", "0.9", "--seed", "7"]),
    # mixup and the loss
    "mixup": ([], ["--mixup", "0.2"]),
    "cutmix": ([], ["--cutmix", "1.0"]),
    "cutmix_minmax": (["--cutmix", "1.0"], ["--cutmix", "1.0", "--cutmix-minmax", "0.2", "0.8"]),
    "mixup_prob": (["--mixup", "0.2"], ["--mixup", "0.2", "--mixup-prob", "0.5"]),
    "mixup_switch_prob": (
        ["--mixup", "0.2", "--cutmix", "1"],
        ["--mixup", "0.2", "--cutmix", "1", "--mixup-switch-prob", "0.1"],
    ),
    "mixup_mode": (["--mixup", "0.2"], ["--mixup", "0.2", "--mixup-mode", "elem"]),
    "smoothing": ([], ["--smoothing", "0.3"]),
    "bce_loss": ([], ["--bce-loss"]),
    "bce_sum": (["--bce-loss"], ["--bce-loss", "--bce-sum"]),
    "bce_target_thresh": (["--bce-loss"], ["--bce-loss", "--bce-target-thresh", "0.2"]),
    "bce_pos_weight": (["--bce-loss"], ["--bce-loss", "--bce-pos-weight", "2"]),
    # weight averaging and the order of samples
    "model_ema": ([], ["--model-ema"]),
    "model_ema_decay": (["--model-ema"], ["--model-ema", "--model-ema-decay", "0.9"]),
    "model_ema_warmup": (["--model-ema"], ["--model-ema", "--model-ema-warmup"]),
    "model_ema_force_cpu": (["--model-ema"], ["--model-ema", "--model-ema-force-cpu"]),
    "aug_repeats": ([], ["--aug-repeats", "3"]),
}

# dest: why its effect is the run itself, not an object built from the options; a test elsewhere names its flag
RUN_OPTIONS: dict[str, str] = {
    **dict.fromkeys(
        ("data", "data_dir", "dataset", "train_split", "val_split", "dataset_download", "class_map"),
        "where the images come from: the sources' tests read real folders, shards and datasets",
    ),
    **dict.fromkeys(
        ("input_img_mode", "input_key", "target_key"), "how samples are decoded: the readers' tests decode them"
    ),
    **dict.fromkeys(
        ("pretrained", "pretrained_path", "initial_checkpoint"), "weights loaded from files: the weights' tests"
    ),
    **dict.fromkeys(
        ("resume", "no_resume_opt", "start_epoch", "checkpoint_hist", "recovery_interval", "output", "experiment"),
        "the run folder and its checkpoints: the resume and run-safety tests train and resume",
    ),
    **dict.fromkeys(
        ("eval_metric", "val_interval", "log_interval", "mixup_off_epoch", "validation_batch_size"),
        "when the loop validates, logs, stops mixing or how it batches validation: the loop's and run's tests",
    ),
    **dict.fromkeys(
        ("clip_grad", "synchronize_step"),
        "read by the optimizer step itself: tests/train/test_loop.py runs it against timm's clipping",
    ),
    **dict.fromkeys(
        ("device", "device_modules", "amp", "amp_dtype", "model_dtype", "channels_last", "fast_norm"),
        "the device and its precision: the runtime's and the scripts' device tests",
    ),
    **dict.fromkeys(("torchcompile", "torchcompile_mode"), "compilation: a compiled run is trained in the scripts"),
    **dict.fromkeys(("sync_bn", "dist_bn", "workers"), "processes and loaders: the distributed and loader tests"),
    **dict.fromkeys(
        ("log_wandb", "wandb_project", "wandb_tags", "wandb_resume_id"), "a tracker: the W&B tests talk to W&B"
    ),
    **dict.fromkeys(
        ("kd_model_name", "distill_loss_weight", "task_loss_weight", "kd_temperature"),
        "a teacher model: tests/cli/test_train_flags.py compares the loss with timm's distillation task",
    ),
    "no_ddp_bb": "DDP's buffer broadcast: test_no_ddp_bb_reaches_ddp below wraps a model as train.py does",
    **dict.fromkeys(("train_split", "val_split"), "which folders: test_the_splits_name_the_folders_read below"),
}
# options with one value only, as in timm: nothing to tell apart
ONE_VALUE = {"kd_loss_type": "kl is the only distillation loss timm's train.py offers (choices: kl)"}


@functools.cache
def built(flags: tuple[str, ...]) -> dict[str, Any]:
    """What train.py builds for the command line ``BASE + flags``, reduced to comparable values."""
    from vtools.cli.train_flags import parse

    return built_from(parse([*BASE, *flags]))


def built_from(args: Any) -> dict[str, Any]:
    """What train.py builds from parsed and checked options, reduced to comparable values."""
    from timm.data import resolve_data_config

    from vtools.cli.typed import typed_options
    from vtools.derived_options import mixup_requested, preprocess_overrides
    from vtools.options.train_job import TrainJob
    from vtools.runtime.distributed import DistInfo
    from vtools.train import recipe
    from vtools.train.assemble import build_model, train_sampler

    job = args if isinstance(args, TrainJob) else typed_options(TrainJob, args)  # the API gives the job
    torch.manual_seed(0)
    model = build_model(job.model, job.model.num_classes or CLASSES, torch.device("cpu"))
    found: dict[str, Any] = {
        "model": repr(model),
        "weights": [round(float(t.double().sum()), 6) for t in model.state_dict().values() if t.is_floating_point()],
        "drop_rate": getattr(model, "drop_rate", None),  # ResNet applies it in forward_head: no module holds it
    }
    found["checkpointing"] = [getattr(m, "grad_checkpointing", None) for m in model.modules()]
    data_config = resolve_data_config(preprocess_overrides(job.model), model=model)
    found["data_config"] = repr(data_config)
    found["train_transform"] = repr(recipe.build_train_transform(job.augment, data_config))
    found["erasing"] = (
        repr(vars(erasing)) if (erasing := recipe.build_random_erasing(job.augment, torch.device("cpu"))) else None
    )
    lr = recipe.scaled_lr(job.optim, job.data.batch_size * job.optim.grad_accum_steps)
    optimizer = recipe.build_optimizer(model, job.optim, lr)
    found["optimizer"] = repr(
        [(type(optimizer).__name__, {k: v for k, v in g.items() if k != "params"}) for g in optimizer.param_groups]
    )
    found["clipped"] = len(recipe.clip_parameters(model, job.optim.clip_mode))
    scheduler, epochs = recipe.build_scheduler(optimizer, job.optim, 10, job.run.eval_metric, job.run.seed)
    lrs = []
    for epoch in (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 150, 250, 299, 320):
        scheduler.step_update(epoch * 10)
        lrs.append(recipe.mean_lr(optimizer))
        scheduler.step(epoch, 1.0)
        lrs.append(recipe.mean_lr(optimizer))
    found["schedule"] = (epochs, [round(value, 12) for value in lrs])
    mixup = recipe.build_mixup(job.augment, CLASSES)
    found["mixup"] = repr(sorted(vars(mixup).items())) if mixup is not None else None
    loss_fn = recipe.build_train_loss(job.augment, mixup_requested(job.augment))
    torch.manual_seed(1)
    logits, targets = torch.randn(8, CLASSES), torch.randint(0, CLASSES, (8,))
    if mixup_requested(job.augment):
        targets = torch.nn.functional.one_hot(targets, CLASSES).float() * 0.9 + 0.01
    found["loss"] = round(float(loss_fn(logits, targets)), 8)
    ema = recipe.build_ema(model, job.optim)
    found["ema"] = None if ema is None else repr({k: v for k, v in vars(ema).items() if not k.startswith("_")})
    found["order"] = list(train_sampler(64, job.run.seed, job.augment.aug_repeats, DistInfo()))[:32]
    return found


@pytest.mark.parametrize("dest", sorted(RECIPE_ROWS))
def test_each_value_reaches_what_it_controls(dest: str) -> None:
    first, other = RECIPE_ROWS[dest]
    a, b = built(tuple(first)), built(tuple(other))
    assert [key for key in a if a[key] != b[key]], f"{dest}: {first} and {other} build the same objects"


# rows also given as YAML keys (a -c file) and as Python API keywords (vtools.fit's), the values those take
SAMPLE = {
    "momentum": 0.5,
    "hflip": 0.1,
    "opt_kwargs": {"amsgrad": True},
    "sched": "step",
    "mixup": 0.2,
    "drop_path": 0.2,
    "warmup_epochs": 10,
}


@pytest.mark.parametrize("dest", sorted(SAMPLE))
def test_a_sample_of_rows_through_yaml_and_the_api(dest: str, tmp_path: Path) -> None:
    """The same value from a -c file's key and from an API keyword builds what its flags build."""
    import yaml

    from vtools.api import train_options
    from vtools.cli.train_flags import parse

    flags = RECIPE_ROWS[dest][1]
    base = {"model": "test_resnet", "img_size": 32, "data_dir": "/data"}
    if dest == "opt_kwargs":
        flags = ["--opt", "adamw", *flags[2:]]
        base["opt"] = "adamw"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**base, dest.replace("_", "-"): SAMPLE[dest]}))
    from_flags = built(tuple(flags))
    assert built_from(parse(["-c", str(config)])) == from_flags
    assert built_from(train_options(None, {**base, dest: SAMPLE[dest]})) == from_flags
    assert from_flags != built(tuple(RECIPE_ROWS[dest][0]) if dest != "opt_kwargs" else ("--opt", "adamw"))


def inert_dests() -> set[str]:
    from vtools.cli.timm_compat import no_op_flags, refused_flags
    from vtools.cli.train_flags import build_parser

    parser = build_parser()
    inert = {*refused_flags(parser), *no_op_flags(parser)}
    return {action.dest for action in parser._actions if any(flag in inert for flag in action.option_strings)}


def test_every_working_timm_option_has_a_row_or_a_reason() -> None:
    working = {option["dest"] for option in timm_options("train.py")} - inert_dests()
    listed = [set(RECIPE_ROWS), set(RUN_OPTIONS), set(ONE_VALUE)]
    assert sum(map(len, listed)) == len(set.union(*listed)), "an option is in two lists"
    assert sorted(working - set.union(*listed)) == [], "working options with no row"
    assert sorted(set.union(*listed) - working) == [], "rows for no working timm option"
    said = re.search(r"train\.py: 173/173 \((\d+)\s+work as in timm", (REPO / "README.md").read_text())
    assert said and int(said.group(1)) == len(working) + 1  # and -c/--config, which the config parser reads


def test_each_listed_run_option_is_exercised_by_a_test() -> None:
    """A listed option's flag appears in some other test file (as --flag or a keyword/key)."""
    from vtools.cli.train_flags import build_parser

    parser = build_parser()
    texts = [
        path.read_text(encoding="utf-8")
        for path in sorted((REPO / "tests").rglob("test_*.py"))
        if path.name != Path(__file__).name
    ]
    own = Path(__file__).read_text(encoding="utf-8")
    texts.append(own[own.index("def test_the_splits_name_the_folders_read") :])  # this file's tests, not its tables
    missing = []
    for dest in RUN_OPTIONS:
        action = next(a for a in parser._actions if a.dest == dest)
        names = [*action.option_strings, dest] if action.option_strings else [dest]
        pattern = re.compile("|".join(re.escape(name) + r"\b" for name in names))
        if not any(pattern.search(text) for text in texts):
            missing.append(dest)
    assert missing == []


def test_the_splits_name_the_folders_read(tmp_path: Path) -> None:
    """--train-split and --val-split: the sources train.py opens read the folders they name."""
    from vtools.cli.train_flags import parse
    from vtools.cli.typed import typed_options
    from vtools.options.train_job import DataOptions
    from vtools.train.assemble import build_datasets

    for split, count in (("fit", 3), ("check", 2), ("train", 1), ("validation", 1)):
        for index in range(count):
            folder = tmp_path / split / f"class{index % 2}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{index}.png").write_bytes(b"")
    args = parse([str(tmp_path), "--train-split", "fit", "--val-split", "check"])
    train, val, _ = build_datasets(typed_options(DataOptions, args))
    assert (len(train), len(val)) == (3, 2)
    train, val, _ = build_datasets(typed_options(DataOptions, parse([str(tmp_path)])))
    assert (len(train), len(val)) == (1, 1)


def test_no_ddp_bb_reaches_ddp(tmp_path: Path) -> None:
    """--no-ddp-bb: the DistributedDataParallel wrapper train.py makes does not broadcast buffers."""
    import torch.distributed as dist

    from vtools.cli.train_flags import parse
    from vtools.cli.typed import typed_options
    from vtools.options.train_job import TrainJob
    from vtools.runtime.distributed import DistInfo
    from vtools.train.assemble import wrap_for_speed
    from vtools.train.loop import TrainComponents

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        seen = []
        for flags in ([], ["--no-ddp-bb"]):
            job = typed_options(TrainJob, parse([*BASE, *flags]))
            model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
            parts = TrainComponents(
                model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.MSELoss(), None, torch.device("cpu")
            )
            wrap_for_speed(parts, job.model, job.distributed, torch.device("cpu"), DistInfo(rank=0, world_size=2))
            seen.append(parts.model.broadcast_buffers)
        assert seen == [True, False]
    finally:
        dist.destroy_process_group()

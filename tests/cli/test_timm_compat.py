"""A timm user's command line and args.yaml run unchanged: checked against timm's full option list.

The reference is tests/data/timm_options.json, read out of timm's own scripts
(tools/extract_timm_options.py): every option of timm's train.py, validate.py
and inference.py must parse here under timm's name, with timm's default (or a
listed, reasoned departure), timm's nargs and timm's value type. Options that
cannot mean anything here are listed refusals: at timm's default they pass,
any other value stops in one line that says why.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import REPO, device_flags, run_script, weights
from tests.timm_reference import SCRIPTS, long_flag, timm_args_yaml, timm_options, timm_reads_config, timm_spec
from vtools.cli.config import dump_config, parse_with_config
from vtools.cli.runner import command_main
from vtools.cli.timm_compat import DEFAULT_DEPARTURES, no_op_flags, refused_flags
from vtools.errors import UsageError


def our_parser(script: str) -> argparse.ArgumentParser:
    from vtools.cli.train_flags import build_parser
    from vtools.commands import infer, validate

    return {"train.py": build_parser, "validate.py": validate.build_parser, "inference.py": infer.build_parser}[
        script
    ]()


def our_action(parser: argparse.ArgumentParser, option: dict) -> argparse.Action | None:
    flag = long_flag(option)
    if flag is None:
        return next((a for a in parser._actions if not a.option_strings and a.dest == option["dest"]), None)
    return parser._option_string_actions.get(flag)


# flags whose type takes every value timm's does, as timm reads it, and more
WIDENED_TYPES = {"--recovery-interval": "a number of updates as timm's, or a time of training (30m)"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_timm_option_parses_with_timms_name_default_and_shape(script: str) -> None:
    parser = our_parser(script)
    missing, wrong_default, wrong_dest, wrong_shape = [], [], [], []
    for option in timm_options(script):
        action = our_action(parser, option)
        flag = long_flag(option) or option["dest"]
        if action is None:
            missing.append(flag)
            continue
        if action.dest != option["dest"]:
            wrong_dest.append(f"{flag}: {action.dest} (timm: {option['dest']})")
        if action.default != option["default"] and flag not in DEFAULT_DEPARTURES:
            wrong_default.append(f"{flag}: {action.default!r} (timm: {option['default']!r})")
        timm_nargs, nargs = option.get("nargs"), None if action.nargs == 0 else action.nargs  # 0: a switch
        if timm_nargs != nargs and not (timm_nargs == "+" and nargs == "*"):
            wrong_shape.append(f"{flag}: nargs {action.nargs!r} (timm: {timm_nargs!r})")
        timm_type = {"int": int, "float": float}.get(option.get("type"))
        widened = flag in WIDENED_TYPES and all(action.type(str(n)) == n for n in (0, 1, 500))
        if timm_type is not None and action.type is not timm_type and not widened:
            wrong_shape.append(f"{flag}: type {action.type} (timm: {option['type']})")
    assert not missing, f"{script}: timm options refused as unknown: {missing}"
    assert not wrong_dest, f"{script}: {wrong_dest}"
    assert not wrong_default, f"{script}: defaults that differ from timm's without a listed reason: {wrong_default}"
    assert not wrong_shape, f"{script}: {wrong_shape}"


def test_every_listed_default_departure_is_real() -> None:
    """A departure listed without a flag that departs would hide a later, silent one under its name."""
    departing = set()
    for script in SCRIPTS:
        parser = our_parser(script)
        for option in timm_options(script):
            action = our_action(parser, option)
            if action is not None and action.default != option["default"]:
                departing.add(long_flag(option))
    assert departing == set(DEFAULT_DEPARTURES)


def _non_default_argv(action: argparse.Action) -> list[str]:
    """A command line giving ``action`` a value other than its default."""
    flag = max(action.option_strings, key=len)
    if action.nargs == 0:
        return [flag]
    if action.choices:
        return [flag, next(str(c) for c in action.choices if c != action.default)]
    value = {int: "7", float: "0.5"}.get(action.type, "x")
    return [flag, value, value] if action.nargs in ("+", "*") else [flag, value]


@pytest.mark.parametrize("script", SCRIPTS)
def test_refused_flags_pass_at_timms_default_and_stop_in_one_line_otherwise(script: str) -> None:
    parser = our_parser(script)
    refused = refused_flags(parser)
    assert refused, "every script has timm flags that mean nothing here"
    timm_defaults = {long_flag(option): option["default"] for name in SCRIPTS for option in timm_options(name)}
    for flag, reason in refused.items():
        action = parser._option_string_actions[flag]
        assert flag in timm_defaults, f"{flag} is refused but is no timm option: remove it instead"
        assert action.default == timm_defaults[flag]
        with pytest.raises(UsageError) as caught:
            our_parser(script).parse_args(_non_default_argv(action))
        message = str(caught.value)
        given = " ".join(_non_default_argv(action)[1:]) if action.nargs != 0 else ""  # a switch shows no value
        assert message == f"{flag} {given}".strip() + f": {reason}"  # the value as given, then why


@pytest.mark.parametrize("script", SCRIPTS)
def test_refused_and_no_op_flags_are_hidden_from_help_and_each_says_why(script: str) -> None:
    parser = our_parser(script)
    shown = parser.format_help()
    for flag, reason in {**refused_flags(parser), **no_op_flags(parser)}.items():
        assert isinstance(reason, str) and len(reason) > 10, flag
        assert not re.search(rf"{re.escape(flag)}\b", shown), f"{flag} is in --help"


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_op_flags_are_read_nowhere(script: str) -> None:
    """A no-op flag is accepted for timm's sake: no vtools code may act on it (or it is no no-op)."""
    parser = our_parser(script)
    others = {
        "train.py": ("commands/validate.py", "commands/infer.py"),
        "validate.py": ("commands/train.py", "commands/infer.py", "train/"),
        "inference.py": ("commands/train.py", "commands/validate.py", "train/"),
    }
    sources = "\n".join(
        path.read_text(encoding="utf-8")
        for path in (REPO / "vtools").rglob("*.py")
        if not path.relative_to(REPO / "vtools").as_posix().startswith(("bench/", *others[script]))
    )
    for flag in no_op_flags(parser):
        dest = parser._option_string_actions[flag].dest
        assert not re.search(rf"\bargs\.{dest}\b|getattr\(args, \"{dest}\"", sources), f"{flag} is read: {dest}"
        parser.parse_args(_non_default_argv(parser._option_string_actions[flag]))  # accepted at any value


def test_the_readme_names_every_refused_flag_and_the_counts() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    families = re.findall(r"`(--[a-z-]+-)\*`", readme)  # `--naflex-*` names every --naflex-... flag
    for script in SCRIPTS:
        for flag in refused_flags(our_parser(script)):
            named = f"`{flag}`" in readme or any(flag.startswith(prefix) for prefix in families)
            assert named, f"README's compatibility table does not name {flag}"
    for script in SCRIPTS:
        parser = our_parser(script)
        timm_flags = {long_flag(option) for option in timm_options(script)}
        total = len(timm_flags) + (script == "train.py")  # and train.py's -c/--config
        no_ops = len(timm_flags & set(no_op_flags(parser)))
        refused = len(timm_flags & set(refused_flags(parser)))
        working = "work as in timm" if script == "train.py" else "work"
        counts = f"{script}: {total}/{total} ({total - no_ops - refused} {working}, {no_ops} "
        assert counts in readme.replace("\n", " "), f"README's counts for {script} are stale: {counts}..."


# a realistic recipe as a timm user writes it: DeiT-style training with distillation flags left at default
RECIPE = (
    "--model deit_tiny_patch16_224 --opt adamw --lr 5e-4 --weight-decay 0.05 --sched cosine --epochs 300 "
    "--warmup-epochs 5 --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --mixup 0.8 --cutmix 1.0 --smoothing 0.1 "
    "--aug-repeats 3 --drop-path 0.1 --model-ema --model-ema-decay 0.99996 --clip-grad 1.0 --clip-mode agc "
    "--interpolation bicubic --scale 0.08 1.0 --opt-kwargs foreach=true --layer-decay 0.75 "
    "--color-jitter-prob 0.8 --grayscale-prob 0.1 --train-crop-mode rrc --bce-loss --bce-sum"
).split()


def test_timms_own_args_yaml_is_read_to_the_same_options(tmp_path: Path) -> None:
    """The args.yaml timm's train.py writes for a recipe (all its keys, nulls and empty strings) gives every
    option the value timm's run had; --device is given again, as it is on a machine without CUDA."""
    args_yaml = tmp_path / "args.yaml"
    args_yaml.write_text(timm_args_yaml("train.py", RECIPE), encoding="utf-8")
    timm_values = yaml.safe_load(args_yaml.read_text(encoding="utf-8"))
    assert len(timm_values) == len(timm_options("train.py")) == 172
    ours = vars(parse_with_config(our_parser("train.py"), ["-c", str(args_yaml), "--device", "cpu"]))
    differing = {key: (value, ours[key]) for key, value in timm_values.items() if ours[key] != value}
    assert differing == {"device": ("cuda", "cpu")}


def test_a_typo_in_a_config_still_stops(tmp_path: Path) -> None:
    """Taking timm's whole key set must not turn into ignoring unknown keys."""
    config = tmp_path / "args.yaml"
    config.write_text(timm_args_yaml("train.py", []) + "aug_repeat: 3\n", encoding="utf-8")
    with pytest.raises(UsageError, match="unknown key 'aug_repeat' \\(did you mean 'aug_repeats'\\?\\)"):
        parse_with_config(our_parser("train.py"), ["-c", str(config)])


def test_our_config_yaml_gives_timm_every_value(tmp_path: Path) -> None:
    """timm's ``train.py -c config.yaml`` on the file a vtools run writes: every timm option comes back with
    the run's value (a hyphenated file would lose batch-size, layer-decay and every multi-word key)."""
    ours = parse_with_config(our_parser("train.py"), [*RECIPE, "--data-dir", "/data/x", "--batch-size", "48"])
    text = dump_config(vars(ours))
    read_by_timm = vars(timm_reads_config("train.py", text))
    lost = {
        option["dest"]: (getattr(ours, option["dest"]), read_by_timm[option["dest"]])
        for option in timm_options("train.py")
        if option["dest"] not in ("data", "resume", "config")
        and read_by_timm[option["dest"]] != getattr(ours, option["dest"])
    }
    assert not lost
    assert read_by_timm["batch_size"] == 48 and read_by_timm["layer_decay"] == 0.75


def test_the_option_list_names_its_timm_source() -> None:
    spec = timm_spec()
    assert re.fullmatch(r"[0-9a-f]{40}", spec["timm_commit"]) and spec["timm_version"]
    assert {script: len(options) for script, options in spec["scripts"].items()} == {
        "train.py": 173,
        "validate.py": 57,
        "inference.py": 49,
        "benchmark.py": 40,
    }


@pytest.mark.cpu_only(reason="reading a config is host-side; the flags' device paths: tests/cli/test_train_flags.py")
def test_a_run_from_timms_args_yaml_trains_and_saves_the_same_options(fashion4: Path, tmp_path: Path) -> None:
    recipe = (
        "--model test_resnet --img-size 32 --epochs 1 -b 16 --opt adamw --lr 1e-3 --aug-repeats 3 --mixup 0.2 "
        "--clip-grad 1 --clip-mode agc --model-ema --workers 1 --warmup-epochs 0 --dist-bn reduce"
    ).split()
    args_yaml = tmp_path / "args.yaml"
    args_yaml.write_text(timm_args_yaml("train.py", recipe), encoding="utf-8")
    given = ["--device", "cpu", "--data-dir", str(fashion4), "--output", str(tmp_path), "--experiment", "run"]
    proc = run_script(["train.py", "-c", str(args_yaml), *given])
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text(encoding="utf-8"))
    timm_values = yaml.safe_load(args_yaml.read_text(encoding="utf-8"))
    overridden = {"device", "data", "data_dir", "output", "experiment", "resume"}
    assert {k: v for k, v in timm_values.items() if k not in overridden} == {
        k: saved[k] for k in timm_values if k not in overridden
    }


# ---------------------------------------------------------------- issue 33: a careful user's probes


def _yaml_value(action: argparse.Action) -> object:
    """The value of :func:`_non_default_argv` as a YAML file gives it."""
    if action.nargs == 0:
        return not action.default
    if action.choices:
        return next(c for c in action.choices if c != action.default)
    value = {int: 7, float: 0.5}.get(action.type, "x")
    return [value, value] if action.nargs in ("+", "*") else value


def test_refused_flags_stop_when_a_yaml_file_gives_them(tmp_path: Path) -> None:
    """A config's values become the parser's defaults: the refusal compares with timm's default, kept when the
    flag was declared, so ``aug-splits: 2`` in a file stops as ``--aug-splits 2`` does, and so does the
    flag given again on the command line over the file."""
    parser = our_parser("train.py")
    config = tmp_path / "run.yaml"
    for flag in refused_flags(parser):
        action = parser._option_string_actions[flag]
        config.write_text(yaml.safe_dump({action.dest: _yaml_value(action)}), encoding="utf-8")
        for again in ([], _non_default_argv(action)):
            with pytest.raises(UsageError) as caught:
                parse_with_config(our_parser("train.py"), ["-c", str(config), *again])
            assert str(caught.value).startswith(flag), (flag, again)
    config.write_text(timm_args_yaml("train.py", RECIPE), encoding="utf-8")  # every key at timm's default: runs
    parse_with_config(our_parser("train.py"), ["-c", str(config)])


@pytest.mark.parametrize(
    "given, meant",
    [
        ("--lerning-rate", "--lr"),
        ("--learning_rate", "--lr"),
        ("--learningrate", "--lr"),
        ("--min-learning-rate", "--min-lr"),
        ("--warmup-learning-rate", "--warmup-lr"),
        ("--optimiser", "--opt"),
        ("--lr-scheduler", "--sched"),
        ("--label-smoothing", "--smoothing"),
        ("--gradient-accumulation-steps", "--grad-accum-steps"),
        ("--grad-clip", "--clip-grad"),
        ("--data-path", "--data-dir"),
        ("--image-size", "--img-size"),
        ("--warm-up-epochs", "--warmup-epochs"),
        ("--dropout", "--drop"),
        ("--num-epochs", "--epochs"),
        ("--weight_decay", "--weight-decay"),
        ("--decay-rte", "--decay-rate"),
    ],
)
def test_a_misspelt_flag_is_matched_to_timms_name_for_it(given: str, meant: str) -> None:
    """Spelled-out words other tools use are read as timm's short names (learning-rate is lr) before the
    closest spelling is looked for: --lerning-rate was told --decay-rate."""
    with pytest.raises(UsageError) as caught:
        our_parser("train.py").parse_args([given, "1"])
    assert str(caught.value).endswith(f"(did you mean {meant}?)")


@pytest.mark.parametrize("script", ["validate.py", "inference.py"])
def test_input_size_channels_build_the_model_as_in_timm(
    script: str, device: torch.device, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    """timm's scripts build the model with --input-size's channel count when --in-chans is not given: a
    3-channel model folder with --input-size 1 32 32 gives what --in-chans 1 gives (it ended in a
    convolution's channel error)."""

    flags = [str(custom_images), "--model", str(custom_model_dir), *device_flags(device.type), "--workers", "0"]
    main, more = (
        (command_main("validate"), [])
        if script == "validate.py"
        else (command_main("infer"), ["--include-index", "--topk", "3"])
    )
    results = {}
    for name, extra in (("implied", []), ("explicit", ["--in-chans", "1"])):
        out = tmp_path / f"{name}.json"
        given = ["--input-size", "1", "32", "32", *extra, "--results-file", str(out), "--results-format", "json"]
        assert main([*flags, *given, *more]) == 0
        rows = json.loads(out.read_text(encoding="utf-8"))
        results[name] = [{k: v for k, v in row.items() if k != "img_per_sec"} for row in rows]  # a timing
    assert results["implied"] == results["explicit"]


@pytest.mark.cpu_only(reason="model construction from the flags; device training: tests/scripts/test_train.py")
def test_training_at_input_size_channels_builds_that_model(fashion4: Path, tmp_path: Path) -> None:

    flags = ["--data-dir", str(fashion4), "--model", "test_resnet", "--input-size", "1", "28", "28", "--epochs", "1"]
    given = ["--device", "cpu", "--workers", "0", "--batch-size", "32", "--output", str(tmp_path), "--experiment", "g"]
    assert command_main("train")([*flags, *given]) == 0
    config = json.loads((tmp_path / "g" / "model" / "config.json").read_text(encoding="utf-8"))
    assert config["pretrained_cfg"]["input_size"] == [1, 28, 28]
    assert weights(tmp_path / "g" / "last.pth.tar")["conv1.0.weight"].shape[1] == 1

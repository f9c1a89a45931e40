"""vtools/cli/config.py in process: a YAML run file read strictly (a key given twice is refused with its
line), a file's data folder made the positional's default as timm's train.py reads it, and the Python API's
order (defaults < the file < keywords). The scripts' own reading of the shipped configs:
tests/scripts/test_configs.py; bad files end to end: tests/scripts/test_bad_input.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from vtools.cli import train_flags
from vtools.cli.config import (
    add_config_flag,
    dump_config,
    keyword_values,
    parse_with_config,
    read_yaml,
    resolve_options,
    yaml_defaults,
)
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="reads options; runs nothing on a device")


def test_a_key_given_twice_is_refused_with_its_line(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model: resnet18\nlr: 0.1\nepochs: 3\nlr: 0.2\n")
    with pytest.raises(UsageError) as refused:
        read_yaml(config)
    assert str(refused.value).endswith("key 'lr' is given twice (line 4)")
    config.write_text("model: resnet18\nlr: 0.1\n")
    assert read_yaml(config) == {"model": "resnet18", "lr": 0.1}


@pytest.mark.parametrize(
    ("keys", "data"),
    [({"data_dir": "/sets/a"}, "/sets/a"), ({"data": "/sets/b"}, "/sets/b"), ({"data_dir": "/a", "data": "/b"}, "/a")],
)
def test_a_files_data_folder_becomes_the_positionals_default(keys: dict, data: str) -> None:
    """timm reads data_dir, and the positional only without it: the file's folder goes to the positional,
    so DIR or --data-dir on the command line still overrides it."""
    values = yaml_defaults(train_flags.build_parser(), keys, "run.yaml")
    assert (values["data"], values["data_dir"]) == (data, None)


def test_keywords_override_the_file_which_overrides_the_defaults(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model: resnet18\nlr: 0.3\nopt: adamw\nepochs: 7\n")
    args = resolve_options(train_flags.build_parser(), config, {"epochs": 2}, "fit()")
    assert (args.model, args.lr, args.opt, args.epochs) == ("resnet18", 0.3, "adamw", 2)
    assert args.config == str(config) and args.momentum == 0.9  # -c FILE as the command line leaves it; a default
    plain = resolve_options(train_flags.build_parser(), None, {"model": "resnet18"}, "fit()")
    assert (plain.lr, plain.opt, plain.config) == (train_flags.build_parser().get_default("lr"), "sgd", "")


def _parser() -> argparse.ArgumentParser:
    """One option of each kind a script's parser has."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--experiment", default="")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--pin-mem", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--mean", type=float, nargs=3, default=None)
    parser.add_argument("--decay-milestones", type=int, nargs="+", default=[90, 180])
    parser.add_argument("--tags", nargs="*", default=None)
    parser.add_argument("--model-kwargs", default={})
    parser.add_argument("--interpolation", type=_checked_name, default="")
    parser.add_argument("--sched", choices=["cosine", "step"], default="cosine")
    return parser


def _checked_name(text: str) -> str:
    if text not in ("", "bilinear", "bicubic"):
        raise argparse.ArgumentTypeError(f"'{text}' is not an interpolation")
    return text


def _yaml(tmp_path: Path, text: str) -> dict:
    config = tmp_path / "run.yaml"
    config.write_text(text)
    return yaml_defaults(_parser(), read_yaml(config), "run.yaml")


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("lr: 1e-3\nepochs: 5.0\n", {"lr": 0.001, "epochs": 5}),  # YAML 1.1 reads 1e-3 as text
        ("experiment: 1.10\n", {"experiment": "1.10"}),  # a name as written, not the number YAML makes
        ("experiment: 2024-05-01\n", {"experiment": "2024-05-01"}),  # no dates
        ("amp: true\npin-mem: null\n", {"amp": True, "pin_mem": None}),
        ("mean: [0.5, 0.5, 1]\ndecay_milestones: [30]\n", {"mean": [0.5, 0.5, 1.0], "decay_milestones": [30]}),
        (
            "model_kwargs: {drop_rate: 0.1}\ninterpolation: bicubic\n",
            {"model_kwargs": {"drop_rate": 0.1}, "interpolation": "bicubic"},
        ),
        ("lr: null\nsched: step\n", {"lr": None, "sched": "step"}),
        ("tags: [a, 2]\n", {"tags": ["a", "2"]}),  # nargs="*": a list, possibly empty
        ("tags: []\n", {"tags": []}),
    ],
)
def test_values_are_converted_as_their_flags_convert_them(tmp_path: Path, text: str, values: dict) -> None:
    read = _yaml(tmp_path, text)
    assert read == values and all(type(read[key]) is type(value) for key, value in values.items())


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("lr: fast\n", "key 'lr' expects a number, got 'fast'"),
        ("epochs: 2.5\n", "key 'epochs' expects an integer, got 2.5"),
        ("epochs: true\n", "key 'epochs' expects an integer, got True"),
        ("epochs: null\n", "key 'epochs' expects an integer, got null"),
        ("decay_milestones: null\n", "key 'decay_milestones' expects a list, got null"),
        ("experiment: null\n", "key 'experiment' expects a value, got null"),
        ("experiment: yes\n", "key 'experiment' expects a string, got True"),
        ("experiment: [a, b]\n", "key 'experiment' expects a single value, got ['a', 'b']"),
        ("amp: 1\n", "key 'amp' expects true or false, got 1"),
        ("pin_mem: maybe\n", "key 'pin_mem' expects true, false or null, got 'maybe'"),
        ("mean: [0.5, 0.5]\n", "key 'mean' expects 3 values, got [0.5, 0.5]"),
        ("decay_milestones: 30\n", "key 'decay_milestones' expects a list, got 30"),
        ("model_kwargs: drop\n", "key 'model_kwargs' expects a mapping, got 'drop'"),
        (
            "interpolation: nearest\n",
            "key 'interpolation' expects a valid value ('nearest' is not an interpolation), got 'nearest'",
        ),
        ("sched: plateau\n", "key 'sched' expects one of cosine, step, got 'plateau'"),
        ("lrr: 0.1\n", "unknown key 'lrr' (did you mean 'lr'?)"),
        ("config: other.yaml\n", "unknown key 'config'"),
        ("pin-mem: true\npin_mem: false\n", "'pin-mem' and 'pin_mem' are the same option, given twice"),
    ],
)
def test_a_wrong_value_is_refused_naming_the_key_and_what_it_takes(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(UsageError) as refused:
        _yaml(tmp_path, text)
    assert str(refused.value).startswith(f"config run.yaml: {error}")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (  # the file's one line: the end of the file, where PyYAML notices it, is a line below
            "lr: [0.1\n",
            "is not valid YAML at line 1: expected ',' or ']', but got '<stream end>' (while parsing a flow "
            "sequence, noticed at line 2)",
        ),
        (
            "epochs: 1\nlr:0.1\nopt: sgd\n",
            "is not valid YAML at line 2: could not find expected ':' (while scanning a simple key, noticed at line 3)",
        ),
        (
            'epochs: 1\nmodel: "abc\nlr: 0.1\n',
            "is not valid YAML at line 2: found unexpected end of stream (while scanning a quoted scalar, noticed "
            "at line 4)",
        ),
        ("epochs: 1\nlr: 0.1\n  opt: sgd\n", "is not valid YAML at line 3: mapping values are not allowed here"),
        ("- lr\n- 0.1\n", "must be a mapping of option: value"),
        ("[lr]: 0.1\n", ": line 1: a key must be an option name, not a list"),
        ("{lr: 1}: 0.1\n", ": line 1: a key must be an option name, not a mapping"),
        ("lr: 0.1\n? !!set {a: null}\n: 1\n", ": line 2: a key must be an option name, not a set"),
        ("epochs: 3\nlr: !!float fast\n", "is not valid YAML at line 2: 'fast' is not a valid !!float"),
        ("epochs: !!int ''\n", "is not valid YAML at line 1: '' is not a valid !!int"),
        ("mean: !!map [0.5]\n", "is not valid YAML at line 1: expected a mapping node, but found sequence"),
        ("amp: !!bool maybe\n", "is not valid YAML at line 1: 'maybe' is not a valid !!bool"),
        ("experiment: !!timestamp now\n", "is not valid YAML at line 1: 'now' is not a valid !!timestamp"),
    ],
)
def test_a_file_that_is_not_a_mapping_of_options_is_one_line(tmp_path: Path, text: str, error: str) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(text)
    with pytest.raises(UsageError) as refused:
        read_yaml(config)
    assert str(refused.value) == f"config {config} {error}".replace(" :", ":")


def test_a_control_character_is_one_line_naming_its_line(tmp_path: Path) -> None:
    """YAML's reader refuses control characters with a position, no line mark, and a two-line message."""
    config = tmp_path / "run.yaml"
    config.write_text("\nlr: 0.1\nepochs: 3\x07\n")
    with pytest.raises(UsageError) as refused:
        read_yaml(config)
    assert str(refused.value) == (
        f"config {config} is not valid YAML at line 3: special characters are not allowed (U+0007)"
    )


def test_a_missing_folder_or_binary_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "binary.yaml").write_bytes(b"lr: 0.1\n\xff\n")
    for path, error in [
        (tmp_path, "is a folder, not a YAML file"),
        (tmp_path / "none.yaml", "does not exist"),
        (tmp_path / "binary.yaml", "is not UTF-8 text (byte 8)"),
    ]:
        with pytest.raises(UsageError) as refused:
            read_yaml(path)
        assert str(refused.value) == f"config {path} {error}"
    (tmp_path / "empty.yaml").write_text("")
    assert read_yaml(tmp_path / "empty.yaml") == {}


def test_keywords_are_checked_as_the_files_values_are() -> None:
    assert keyword_values(_parser(), {"lr": 1, "mean": (1, 2, 3)}, "fit()") == {"lr": 1.0, "mean": [1.0, 2.0, 3.0]}
    with pytest.raises(UsageError) as refused:
        keyword_values(_parser(), {"epoch": 3}, "fit()")
    assert str(refused.value) == "fit(): unknown option 'epoch' (did you mean 'epochs'?)"
    with pytest.raises(UsageError) as refused:
        keyword_values(_parser(), {"epochs": None}, "fit()")
    assert str(refused.value) == "fit(): option 'epochs' expects an integer, got None"
    # no YAML text to take: a number for a name becomes its text, a checking type sees the value itself
    named = keyword_values(_parser(), {"experiment": 2024, "interpolation": "bicubic"}, "fit()")
    assert named == {"experiment": "2024", "interpolation": "bicubic"}


def test_the_config_option_is_not_a_key_nor_a_keyword(tmp_path: Path) -> None:
    """A file or keyword naming another config file would look like a chain of files that nothing follows."""
    with pytest.raises(UsageError) as refused:
        yaml_defaults(_parser_with_config(), {"config": "other.yaml"}, "run.yaml")
    assert str(refused.value).startswith("config run.yaml: unknown key 'config'")
    with pytest.raises(UsageError) as refused:
        keyword_values(_parser_with_config(), {"config": "other.yaml"}, "fit()")
    assert str(refused.value).startswith("fit(): unknown option 'config'")


def test_the_config_flags_help_says_what_the_file_holds() -> None:
    assert "-c FILE, --config FILE\n" in _parser_with_config().format_help()
    assert "YAML file of options (keys = flag names)" in " ".join(_parser_with_config().format_help().split())


def test_the_config_flag_and_a_dumped_config_run_again(tmp_path: Path) -> None:
    parser = _parser()
    add_config_flag(parser)
    config = tmp_path / "run.yaml"
    config.write_text("lr: 0.5\nepochs: 4\n")
    args = parse_with_config(parser, ["-c", str(config), "--epochs", "6"])
    assert (args.lr, args.epochs, args.config) == (0.5, 6, str(config))
    dumped = tmp_path / "again.yaml"
    dumped.write_text(dump_config(vars(args)))
    assert "config" not in read_yaml(dumped)
    again = parse_with_config(_parser_with_config(), ["--config", str(dumped)])
    assert {key: value for key, value in vars(again).items() if key != "config"} == {
        key: value for key, value in vars(args).items() if key != "config"
    }


def _parser_with_config() -> argparse.ArgumentParser:
    parser = _parser()
    add_config_flag(parser)
    return parser


def test_a_merge_key_is_read_as_yaml_defines_it(tmp_path: Path) -> None:
    """PyYAML's safe loader merges ``<<: *base`` (its keys first, the mapping's own keys win); the strict
    loader reads it too, and a key given twice in one mapping is still refused."""
    config = tmp_path / "run.yaml"
    config.write_text("model-kwargs: &base {drop_rate: 0.1, zero_init_last: false}\nopt-kwargs:\n  <<: *base\n")
    assert read_yaml(config)["opt-kwargs"] == {"drop_rate": 0.1, "zero_init_last": False}
    config.write_text("<<: {epochs: 3, lr: 0.5}\nlr: 0.1\n")
    read = read_yaml(config)
    assert read == {"epochs": 3, "lr": 0.1} and read.texts == {"epochs": "3", "lr": "0.1"}
    assert yaml_defaults(_parser(), read, "run.yaml") == {"epochs": 3, "lr": 0.1}
    config.write_text("<<: {epochs: 3}\nlr: 0.1\nlr: 0.2\n")
    with pytest.raises(UsageError, match=r"key 'lr' is given twice \(line 3\)"):
        read_yaml(config)

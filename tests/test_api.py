"""vtools/api.py: keyword options resolve as the command line's flags do (defaults < YAML < keywords, the same
checks), and fit / validate / predict give what train.py / validate.py / inference.py give."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import EMULATED_NPU_MODULE, REPO, device_flags, run_script, write_model_folder
from tests.scripts.test_one_line_errors import DEVICE, ROWS, Row, _Placeholders
from vtools.api import infer_options, train_options, validate_options
from vtools.cli import infer_flags, train_flags, validate_flags
from vtools.cli.config import parse_with_config
from vtools.cli.typed import command_options
from vtools.errors import UsageError

QUICK_START = REPO / "configs" / "fashion_mnist_cpu.yaml"
SHIPPED_VAL = REPO / "data" / "fashion-mnist-mini" / "val"
TIMED = ("img_per_sec", "epoch_seconds", "data_wait")  # a measurement of this run's speed, not its result


# ---------------------------------------------------------------- options: the command line's parse, from Python


@pytest.mark.cpu_only(reason="parses options; runs nothing on a device")
def test_keywords_over_the_yaml_file_over_defaults_as_flags_are() -> None:
    ours = train_options(QUICK_START, {"lr": 0.01, "epochs": 2, "scale": (0.5, 1.0), "output": Path("out")})
    theirs = train_flags.parse(
        ["-c", str(QUICK_START), "--lr", "0.01", "--epochs", "2", "--scale", "0.5", "1.0", "--output", "out"]
    )
    assert ours == train_flags.typed(theirs)  # the job the command line gives train.py
    assert (ours.optim.lr, ours.optim.opt, ours.optim.momentum) == (0.01, "adamw", 0.9)  # keyword, file, default


@pytest.mark.cpu_only(reason="parses options; runs nothing on a device")
def test_validate_and_predict_options_are_their_scripts() -> None:
    model = "runs/fashion-mnist-cpu/model"
    assert validate_options(None, {"data": SHIPPED_VAL, "model": model, "batch_size": 16}) == command_options(
        "validate", validate_flags.parse([str(SHIPPED_VAL), "--model", model, "--batch-size", "16"])
    )
    assert infer_options(None, {"data_dir": str(SHIPPED_VAL), "model": model, "topk": 3}) == command_options(
        "infer", infer_flags.parse(["--data-dir", str(SHIPPED_VAL), "--model", model, "--topk", "3"])
    )


@pytest.mark.cpu_only(reason="parses options; runs nothing on a device")
@pytest.mark.parametrize(
    "options, words",
    [
        ({"btach_size": 8}, "fit(): unknown option 'btach_size' (did you mean 'batch_size'?)"),
        ({"learning_rate": 0.1}, "did you mean 'lr'?"),
        ({"batch_size": "64"}, "fit(): option 'batch_size' expects an integer, got '64'"),
        ({"epochs": None}, "option 'epochs' expects an integer, got None"),
        ({"opt_kwargs": ["eps=1"]}, "option 'opt_kwargs' expects a mapping"),
        ({"clip_mode": "sum"}, "expects one of norm, value, agc"),
        ({"epochs": 0}, "--epochs must be a positive integer, got 0"),  # the command's own checks
        ({"epoch_repeats": 2.0}, "--epoch-repeats 2.0:"),  # a timm flag only its default may take
    ],
)
def test_a_wrong_keyword_is_the_usage_error_of_its_flag(options: dict, words: str) -> None:
    with pytest.raises(UsageError) as caught:
        train_options(None, {"data_dir": "data", **options})
    assert words in str(caught.value)


SCRIPT_FLAGS = {"train.py": train_flags, "validate.py": validate_flags, "inference.py": infer_flags}
API_OPTIONS = {"train.py": train_options, "validate.py": validate_options, "inference.py": infer_options}


def _refused_while_parsing(flags, argv: list[str]) -> str | None:  # noqa: ANN001 (a flags module)
    """The one line a script's parse stops ``argv`` with; None where it parses (a later refusal: the API runs
    the same command body) or argparse itself refuses the grammar (keywords have none)."""
    try:
        flags.parse(argv)
    except UsageError as err:
        return str(err)
    except SystemExit:
        return None
    return None


def _as_keywords(flags, argv: list[str]) -> tuple[str | None, dict]:  # noqa: ANN001 (a flags module)
    """``argv`` as the API's (config, keywords): the -c file, and every option the flags set."""
    parser = flags.build_parser()
    config = parse_with_config(parser, argv).config if "-c" in argv or "--config" in argv else None
    given = vars(parse_with_config(flags.build_parser(), argv))
    base = vars(parse_with_config(flags.build_parser(), ["-c", config] if config else []))
    return config, {key: value for key, value in given.items() if key != "config" and value != base[key]}


@pytest.mark.cpu_only(reason="parses options; runs nothing on a device")
@pytest.mark.parametrize("row", [row for row in ROWS if row.args[0] in SCRIPT_FLAGS], ids=lambda row: row.id)
def test_every_refusal_of_a_scripts_options_is_the_apis(row: Row, request: pytest.FixtureRequest, tmp_path) -> None:
    """The one-line-error table's rows for the three scripts: where the script's parse refuses the options,
    the API given the same options as keywords refuses them in the same words."""
    values = _Placeholders(request, tmp_path)
    for relative, content in row.files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(values.fill(content))
    argv = [values.fill(arg) for arg in row.args[1:] if arg != DEVICE]
    flags = SCRIPT_FLAGS[row.args[0]]
    said = _refused_while_parsing(flags, argv)
    if said is None:
        return  # refused after parsing, by the code fit/validate/predict share, or by argparse's grammar
    try:
        config, keywords = _as_keywords(flags, argv)
    except UsageError as err:  # the -c file itself is refused: the API reads the same file
        config, keywords = None, {}
        assert str(err) == said
        return
    with pytest.raises(UsageError) as refused:
        API_OPTIONS[row.args[0]](config, keywords)
    assert str(refused.value) == said


@pytest.mark.cpu_only(reason="parses options; runs nothing on a device")
@pytest.mark.parametrize(
    ("call", "options", "words"),
    [
        (validate_options, {"data": SHIPPED_VAL, "model": "m", "threshold": 1.5}, "--threshold must be from 0 to 1"),
        (infer_options, {"data": SHIPPED_VAL, "model": "m", "threshold": -0.1}, "--threshold must be from 0 to 1"),
        (train_options, {"data_dir": "d", "mlflow_artifacts": True}, "--mlflow-artifacts"),
    ],
)
def test_the_two_drifts_the_probe_found_are_refused(call, options: dict, words: str) -> None:  # noqa: ANN001
    with pytest.raises(UsageError, match=words.replace("-", "\\-")):
        call(None, options)


@pytest.mark.cpu_only(reason="parses options; runs nothing on a device")
def test_the_yaml_file_is_checked_as_train_py_checks_it(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        train_options(tmp_path / "missing.yaml", {})
    (tmp_path / "typo.yaml").write_text("data-dir: data\nbatch-sise: 8\n")
    with pytest.raises(UsageError, match="unknown key 'batch-sise' \\(did you mean 'batch_size'\\?\\)"):
        train_options(tmp_path / "typo.yaml", {})
    with pytest.raises(UsageError, match="give the images to classify"):
        infer_options(None, {"model": "resnet18"})


@pytest.mark.cpu_only(reason="imports modules; runs nothing on a device")
def test_import_vtools_stays_light_until_the_api_is_used() -> None:
    probe = (
        "import sys, vtools\n"
        "light = 'torch' not in sys.modules\n"
        "assert 'fit' in dir(vtools) and vtools.fit.__module__ == 'vtools.api'\n"
        "print(light, 'vtools.commands.train' in sys.modules)\n"
    )
    proc = run_script(["-c", probe])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"]


# ---------------------------------------------------------------- the same runs as the scripts


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _untimed(rows: list[dict]) -> list[dict]:
    return [{key: value for key, value in row.items() if key not in TIMED} for row in rows]


@pytest.mark.slow
@pytest.mark.cpu_only(reason="the quick start is a cpu run; npu training: tests/scripts/test_train.py")
def test_fit_writes_what_train_py_writes(tmp_path: Path) -> None:
    import vtools

    outcome = vtools.fit(QUICK_START, device="cpu", output=tmp_path / "api")  # the whole quick start
    proc = run_script(["train.py", "-c", str(QUICK_START), "--device", "cpu", "--output", str(tmp_path / "script")])
    assert proc.returncode == 0, proc.stderr
    ours, theirs = tmp_path / "api" / "fashion-mnist-cpu", tmp_path / "script" / "fashion-mnist-cpu"
    assert (outcome.code, outcome.folder, outcome.model_dir) == (0, ours, ours / "model")
    assert outcome.summary == _rows(ours / "summary.csv")
    assert len(outcome.summary) == 20
    assert _untimed(outcome.summary) == _untimed(_rows(theirs / "summary.csv"))
    weights = "model/model.safetensors"
    assert (ours / weights).read_bytes() == (theirs / weights).read_bytes()
    # a sweep calls fit again in the same process: nothing the first run left behind changes the second
    again = vtools.fit(QUICK_START, device="cpu", output=tmp_path / "api", experiment="again")
    assert (again.folder / weights).read_bytes() == (ours / weights).read_bytes()


@pytest.mark.cpu_only(reason="checks the first argument before any device work")
def test_options_given_as_the_first_argument_are_one_line() -> None:
    import vtools

    with pytest.raises(
        UsageError,
        match=r"^fit\(\): the first argument is the path of a YAML run file \(or None\), not "
        r"a dict; give options as keywords: fit\(epochs=1, ...\) or fit\(\*\*options\)$",
    ):
        vtools.fit({"epochs": 1})


@pytest.mark.slow
@pytest.mark.cpu_only(reason="the thread, not the device, is the point; npu training: tests/scripts/test_train.py")
def test_fit_from_a_thread_trains_without_stop_handlers_and_says_so(
    fashion4: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A notebook or a service calls fit() off the main thread, where Python refuses signal handlers."""
    import threading

    import vtools

    ended: dict[str, object] = {}

    def train() -> None:
        try:
            ended["outcome"] = vtools.fit(
                QUICK_START, device="cpu", data_dir=fashion4, model="test_resnet", epochs=1, output=tmp_path
            )
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread to fail there
            ended["error"] = err

    thread = threading.Thread(target=train)
    thread.start()
    thread.join()
    assert "error" not in ended, ended.get("error")
    outcome = ended["outcome"]
    assert outcome.code == 0 and len(outcome.summary) == 1
    assert "stop signals: not handled (Python lets only the main thread install handlers)" in capfd.readouterr().err


@pytest.fixture(scope="module")
def shipped_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init model folder for the shipped set's ten classes."""
    classes = sorted(path.name for path in SHIPPED_VAL.iterdir())
    return write_model_folder(tmp_path_factory.mktemp("api_model") / "model", len(classes), classes)


def _device_options(device: torch.device) -> dict:
    """The keywords that select ``device`` as tests.conftest.device_flags selects it on a command line."""
    return {"device": device.type, **({"device_modules": [EMULATED_NPU_MODULE]} if device.type == "npu" else {})}


def _run_on_shipped_val(script: str, model: Path, results: Path, device: torch.device) -> subprocess.CompletedProcess:
    """``script`` on the shipped validation images with ``model`` at 32 px, its rows in ``results``."""
    flags = [str(SHIPPED_VAL), "--model", str(model), "--img-size", "32", "--results-file", str(results)]
    return run_script([script, *flags, *device_flags(device.type)])


@pytest.mark.slow
def test_validate_equals_validate_py(device: torch.device, shipped_model: Path, tmp_path: Path) -> None:
    import vtools

    rows = vtools.validate(
        data=SHIPPED_VAL, model=shipped_model, img_size=32, results_file=tmp_path / "api.csv", **_device_options(device)
    )
    proc = _run_on_shipped_val("validate.py", shipped_model, tmp_path / "script.csv", device)
    assert proc.returncode == 0, proc.stderr
    ours, theirs = _rows(tmp_path / "api.csv"), _rows(tmp_path / "script.csv")
    assert _untimed(ours) == _untimed(theirs)
    assert [(str(row["top1"]), row["samples"]) for row in rows] == [(row["top1"], 300) for row in theirs]


@pytest.mark.slow
def test_predict_equals_inference_py(
    device: torch.device, shipped_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import vtools

    rows = vtools.predict(
        data=SHIPPED_VAL, model=shipped_model, img_size=32, results_file=tmp_path / "api.csv", **_device_options(device)
    )
    proc = _run_on_shipped_val("inference.py", shipped_model, tmp_path / "script.csv", device)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "api.csv").read_text() == (tmp_path / "script.csv").read_text()
    assert len(rows) == 300
    last = capsys.readouterr().out.splitlines()[-1]  # the rows hold no device: the last line names it
    assert last == proc.stdout.splitlines()[-1] == f"300 images classified on {device}"


# every command's options from keywords: one out-of-range keyword each, refused with its command line's words
EVERY_COMMAND = [
    ("train", {"data_dir": "d", "drop": 1.5}, "--drop must be from 0 up to (not including) 1, got 1.5"),
    ("validate", {"data": "d", "model": "m", "img_size": 0}, "--img-size must be a positive integer, got 0"),
    ("infer", {"data": "d", "model": "m", "topk": -1}, "--topk must be 0 (every class) or positive, got -1"),
    ("env", {"threads": 1}, "command_options('env'): unknown option 'threads'"),
    ("export", {"model_name": "m", "data": "d", "atol": -1}, "--atol must be 0 or more, got -1.0"),
    ("shards", {"source": "a", "out": "b", "shard_size": 0}, "--shard-size must be a positive integer, got 0"),
    ("plot", {"output": "x.png"}, "the following arguments are required: RUN"),
    ("compare", {"reports": ["a", "b"], "top": -1}, "--top must be 0 or more, got -1"),
    ("parity", {"model_name": "m", "steps": 0}, "--steps must be 1 or more, got 0"),
    ("avg-checkpoints", {"n": 0}, "-n must be 1 or more, got 0"),
    ("clean-checkpoint", {"output": "x", "no_hash": "yes"}, None),
    ("benchmark", {"drop": 1.5}, "--drop must be from 0 up to (not including) 1, got 1.5"),
    ("bulk", {"script": "validate.py", "delay": -1}, "--delay must be a number of seconds, 0 or more, got -1.0"),
]


@pytest.mark.cpu_only(reason="parses options; runs nothing on a device")
@pytest.mark.parametrize(("command", "keywords", "words"), EVERY_COMMAND, ids=[row[0] for row in EVERY_COMMAND])
def test_every_commands_options_come_from_keywords_through_its_declarations(
    command: str, keywords: dict, words: str | None
) -> None:
    """vtools.command_options(COMMAND, ...) is the command line's parse for keywords (as HfArgumentParser's
    parse_dict): the same ranges and checks, for every registered command."""
    import vtools

    with pytest.raises(UsageError) as refused:
        vtools.command_options(command, **keywords)
    if words is None:  # a value of the wrong type: refused as the YAML file's would be
        assert str(refused.value).startswith(f"command_options('{command}'): option")
    else:
        assert str(refused.value) == words


@pytest.mark.cpu_only(reason="parses options; runs nothing on a device")
def test_every_command_is_in_the_table_and_its_defaults_are_its_parsers() -> None:
    import vtools
    from vtools.cli import registry

    assert [row[0] for row in EVERY_COMMAND] == [known.name for known in registry.COMMANDS]
    for command in ("env", "benchmark", "avg-checkpoints", "clean-checkpoint"):
        assert vars(vtools.command_options(command)) == vars(registry.build_parser(command).parse_args([]))
    assert vtools.command_options("benchmark", batch_size=8, model="resnet18").batch_size == 8


@pytest.mark.cpu_only(reason="parses options; runs nothing on a device")
def test_an_unknown_command_is_named_with_the_commands() -> None:
    import vtools

    with pytest.raises(UsageError, match="no command 'trian' \\(commands: train, validate"):
        vtools.command_options("trian")

"""The README stays true: CI runs its test command verbatim, and the files it names exist."""

from __future__ import annotations

import csv
import importlib
import re
import shlex

import pytest

from tests.conftest import REPO, run_script, write_image_set, write_model_folder


def _quick_start() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.search(r"## Quick start\n(.*?)\n## ", text, re.S)
    assert section, "README has a Quick start section"
    return section.group(1)


def _quick_start_commands() -> list[str]:
    """The Quick start's bash blocks: the main job's, then the tests'; each must hold one command alone, so
    that pasting the first never starts the 25-minute suite."""
    blocks = re.findall(r"```bash\n(.*?)```", _quick_start(), re.S)
    assert len(blocks) == 2, "Quick start: one bash block for the main job, one for the tests"
    commands = []
    for block in blocks:
        lines = [line for line in block.splitlines() if line.strip()]
        assert len(lines) == 1, f"a Quick start block holds one command: {lines}"
        commands.append(lines[0])
    return commands


def test_ci_runs_the_readme_test_command() -> None:
    first, second = _quick_start_commands()
    assert "train.py -c configs/" in first and "pytest" not in first
    ci_lines = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]
    assert second in ci_lines


def _quoted_run_lines() -> list[str]:
    block = re.search(r"```text\n(.*?)```", _quick_start(), re.S)
    assert block, "the Quick start quotes the run's last lines"
    return block.group(1).splitlines()


NUMBER = re.compile(r"\d+(?:[.:]\d+)*")


def _as_pattern(quoted: str) -> re.Pattern:
    """A quoted line with every figure free (times, speeds and scores change with the host), words exact."""
    parts = NUMBER.split(quoted)
    return re.compile(r"[\d.:]+".join(re.escape(part) for part in parts) + r"\Z")


def test_the_cpu_only_hint_asks_for_the_versions_requirements_ask_for() -> None:
    """A CPU-only index that offers only older wheels must make pip stop, not install a torch below the floor."""
    floors = dict(re.findall(r"^(torch|torchvision)>=([\d.]+)", (REPO / "requirements.txt").read_text(), re.M))
    cpu_index = r"`(python3 -m pip install [^`]*--index-url https://download.pytorch.org/whl/cpu)`"
    hint = re.search(cpu_index, _quick_start())
    assert hint, "the Quick start gives the CPU-only install"
    asked = dict(re.findall(r"'(torch|torchvision)>=([\d.]+)'", hint.group(1)))
    assert asked == floors, (asked, floors)


@pytest.mark.cpu_only(reason="the Quick start's command as written: it picks the device itself (cpu here)")
def test_the_quick_start_prints_what_the_readme_quotes(tmp_path) -> None:
    """The main job as the README gives it (only its output folder moved to the test's), and its last lines
    word for word as the README quotes them; the figures may differ with the host, the best top-1 by a few
    points at most. Then the README's fine-tuning of that model folder, which must score higher than it."""
    train = _quick_start_commands()[0].split("&&")[-1].split()
    assert train[:2] == ["python3", "train.py"], train
    proc = run_script([*train[1:], "--output", str(tmp_path / "runs")], timeout=1200)
    assert proc.returncode == 0, proc.stderr
    quoted = _quoted_run_lines()
    printed = proc.stdout.replace(f"{tmp_path / 'runs'}", "runs").splitlines()[-len(quoted) :]
    for want, got in zip(quoted, printed):
        assert _as_pattern(want).match(got), f"README quotes\n  {want}\nthe run printed\n  {got}"
    best = re.compile(r"best top1 ([\d.]+)")
    said, ran = (float(best.search("\n".join(lines)).group(1)) for lines in (quoted, printed))
    assert abs(said - ran) < 3, (said, ran)
    # the README's fine-tuning line, on the model folder just made: the fine-tuned model scores higher
    fine_tune = "python3 train.py -c configs/fashion_mnist_finetune_cpu.yaml"
    assert f"\n{fine_tune}\n" in (REPO / "README.md").read_text(encoding="utf-8")
    model = tmp_path / "runs" / "fashion-mnist-cpu" / "model"
    tuned = run_script([*fine_tune.split()[1:], "--model", str(model), "--output", str(tmp_path / "runs")], timeout=600)
    assert tuned.returncode == 0, tuned.stderr
    assert float(best.search(tuned.stdout).group(1)) > ran, tuned.stdout[-2000:]


def test_files_the_readme_names_exist() -> None:
    text = "".join((REPO / name).read_text(encoding="utf-8") for name in ("README.md", "vtools/commands/train.py"))
    named = set(re.findall(r"\b(configs/[\w.-]+\.yaml|requirements[\w-]*\.txt|tools/[\w.-]+\.py)", text))
    assert named, "the README names configs and requirement files"
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert not missing, missing


DOCS = REPO / "docs"
DOC_LINK = re.compile(r"\]\((docs/[\w.-]+\.md)(?:#[^)]*)?\)")


def test_readme_is_an_on_ramp() -> None:
    """The README stays short; the reference lives in docs/, and every page is reachable from it."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = text.count("\n") + (not text.endswith("\n"))
    assert lines <= 250, f"README.md has {lines} lines; move reference material to docs/"
    linked = set(DOC_LINK.findall(text))
    broken = sorted(link for link in linked if not (REPO / link).is_file())
    assert not broken, f"README links to missing pages: {broken}"
    pages = {path.relative_to(REPO).as_posix() for path in DOCS.glob("*.md")}
    assert pages, "docs/ holds the reference pages"
    unlinked = sorted(pages - linked)
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


SCRIPTS = {"train.py": "train", "validate.py": "validate", "inference.py": "infer"}
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _fenced_lines(text: str) -> list[str]:
    """The lines of every fenced code block, with backslash continuations joined."""
    lines: list[str] = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        pending = ""
        for raw in block.splitlines():
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            lines.append(line[2:] if line.startswith("$ ") else line)
        if pending:
            lines.append(pending)
    return lines


def _command_of(line: str) -> tuple[str, list[str]] | None:
    """(vtools command, its arguments) for a command line the docs show, or None for anything else."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # not shell syntax shlex can read
        return None
    while words and ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words:
        return None
    if words[0] == "torchrun":  # torchrun's own options, up to and including the script
        script = next((i for i, word in enumerate(words) if word.endswith(".py")), None)
        if script is None or words[script] not in SCRIPTS:
            return None
        return SCRIPTS[words[script]], words[script + 1 :]
    if words[0] in ("python3", "python") and words[1:3] == ["-m", "tests.emulated_npu"]:
        words = words[:1] + words[3:]  # the script runs under the emulated npu with its own arguments
    if words[0] in ("python3", "python") and len(words) > 1 and words[1] in SCRIPTS:
        return SCRIPTS[words[1]], words[2:]
    if words[0] in ("python3", "python") and words[1:3] == ["-m", "benchmarks"]:
        return "benchmarks", words[3:]  # the development measurements, outside the package
    if words[0] in ("python3", "python") and words[1:3] == ["-m", "vtools"] and len(words) > 3:
        words = words[2:]
    if words[0] == "vtools" and len(words) > 1:
        return {"inference": "infer"}.get(words[1], words[1]), words[2:]
    return None


def _parse(command: str, argv: list[str]) -> bool:
    """Parse ``argv`` with the command's own parser, running nothing; False for commands without one."""
    from vtools.cli.config import parse_with_config

    if command == "train":
        from vtools.cli.train_flags import build_parser

        config = next((argv[i + 1] for i, word in enumerate(argv[:-1]) if word in ("-c", "--config")), None)
        if config is not None and not (REPO / config).is_file():
            # a config the repository does not hold (yet): test_files_the_readme_names_exist reports it;
            # the rest of the line must still parse
            index = argv.index(config)
            argv = argv[: index - 1] + argv[index + 1 :]
        parse_with_config(build_parser(), argv)
        return True
    from vtools.cli import registry

    if command == "benchmarks":
        importlib.import_module("benchmarks.command").build_parser().parse_args(argv)
        return True
    try:
        parser = registry.build_parser(command)
    except KeyError:
        return False
    parser.parse_args(argv)
    return True


def test_doc_commands_run_after_the_readme_install() -> None:
    """The README installs requirements, not the package: a bare `vtools` would be "command not found", so every
    command the README and docs show runs as `python3 -m vtools ...` (or a root script)."""
    bare = re.compile(
        r"(?:^|`)vtools (?:train|validate|infer|env|export|shards|plot|compare|parity|benchmark|bulk)\b", re.M
    )
    found = []
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        found += [f"{page.relative_to(REPO)}: {line}" for line in _fenced_lines(text) if line.startswith("vtools ")]
        found += [f"{page.relative_to(REPO)}: {match.group(0)}" for match in bare.finditer(text)]
    assert not found, "commands that need `pip install .` first:\n" + "\n".join(found)


def test_every_command_line_in_readme_and_docs_parses(monkeypatch) -> None:
    """Every train/validate/inference/vtools command shown in a code block is accepted by its parser."""
    from vtools.errors import UsageError

    monkeypatch.chdir(REPO)  # configs/... in the lines are relative to the repository root
    parsed, failures = 0, []
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for line in _fenced_lines(page.read_text(encoding="utf-8")):
            found = _command_of(line)
            if found is None:
                continue
            try:
                parsed += _parse(*found)
            except (UsageError, SystemExit) as err:
                failures.append(f"{page.relative_to(REPO)}: {line}\n    {err}")
    assert not failures, "command lines that do not parse:\n" + "\n".join(failures)
    assert parsed >= 10, f"only {parsed} command lines parsed; the collector is missing them"


def _fine_tune_command() -> list[str]:
    """The README's fine-tune line for the user's own folder, as written."""
    section = re.search(r"### Fine-tune on your own folder\n(.*?)\n## ", (REPO / "README.md").read_text(), re.S)
    assert section, "README has a fine-tune section"
    [line] = [line for line in _fenced_lines(section.group(1)) if "--data-dir path/to/my_data" in line]
    return shlex.split(line)


@pytest.mark.cpu_only(reason="the README's command as written: it picks the device itself (cpu here)")
def test_the_readme_fine_tune_example_runs_on_a_folder_of_seven_images(tmp_path) -> None:
    """The README's fine-tune line on a 5-class folder of 7 training images, as a first-time user runs it,
    offline: the hub name and --pretrained become a local resnet50 model folder (random weights, 1000
    classes, the same architecture as the README's resnet50.a1_in1k) and path/to/my_data the folder;
    nothing else changes. The default batch (128) is more than the set: the run trains in batches of the
    whole set (an update every epoch, said in a line) and keeps a checkpoint footprint of three files."""
    data = tmp_path / "my_data"
    for index, name in enumerate(["daisy", "dandelion", "rose", "sunflower", "tulip"]):
        write_image_set(data / "train", [name], per_class=2 if index < 2 else 1, seed=index)
        write_image_set(data / "val", [name], per_class=1, seed=10 + index)
    model = write_model_folder(tmp_path / "resnet50", 1000, model_name="resnet50")
    command = _fine_tune_command()
    assert command[:2] == ["python3", "train.py"], command
    at = command.index("--model")
    assert command[at : at + 3] == ["--model", "resnet50.a1_in1k", "--pretrained"], command
    argv = [*command[2:at], "--model", str(model), *command[at + 3 :]]
    argv = [str(data) if arg == "path/to/my_data" else arg for arg in argv]

    proc = run_script([str(REPO / "train.py"), *argv], cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "--batch-size 128 is more than the 7 training images: training in batches of 7" in proc.stdout
    [run] = (tmp_path / "runs").iterdir()
    assert run.name.startswith("resnet50-")
    rows = list(csv.DictReader((run / "summary.csv").open()))
    assert [int(row["epoch"]) for row in rows] == list(range(10))
    assert all(float(row["img_per_sec"]) > 0 for row in rows)  # every epoch trained its one batch
    assert (run / "model" / "model.safetensors").is_file()
    # the size trained with is what config.yaml and the checkpoint record: train.py -c and a resume agree
    import torch
    import yaml

    assert yaml.safe_load((run / "config.yaml").read_text())["batch_size"] == 7
    assert torch.load(run / "last.pth.tar", map_location="cpu", weights_only=True)["args"]["batch_size"] == 7
    checkpoints = sorted(run.glob("*.pth.tar"))
    last = (run / "last.pth.tar").stat().st_size
    assert len(checkpoints) <= 3, checkpoints  # last, the best, one numbered (timm's default keeps ten)
    assert sum(path.stat().st_size for path in checkpoints) <= 3 * last

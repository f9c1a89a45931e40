"""vtools/options/train_job.py: every train.py option is a field of exactly one concern of the typed TrainJob."""

from __future__ import annotations

import dataclasses
import typing
from collections import Counter

import pytest

from vtools.cli.timm_compat import no_op_flags, refused_flags
from vtools.cli.train_flags import build_parser, parse
from vtools.cli.typed import typed_options
from vtools.options.declare import declaration, declared_fields, default_of, option_names
from vtools.options.train_job import TimmOnlyOptions, TrainJob

pytestmark = pytest.mark.cpu_only(reason="builds dataclasses from the parser; runs nothing on a device")


def concerns() -> list[type]:
    hints = typing.get_type_hints(TrainJob)
    return [hints[field.name] for field in dataclasses.fields(TrainJob)]


def inert_dests() -> set[str]:
    """The dests of timm's flags accepted here without effect or refused at any value but timm's default."""
    parser = build_parser()
    inert = {*refused_flags(parser), *no_op_flags(parser)}
    return {action.dest for action in parser._actions if max(action.option_strings or [action.dest], key=len) in inert}


def missing_and_extra(job_names: set[str]) -> tuple[set[str], set[str]]:
    dests = {action.dest for action in build_parser()._actions} - {"help"}
    return dests - job_names, job_names - dests


def test_every_option_is_a_field_of_the_job_and_nothing_else() -> None:
    """The job carries every option (config.yaml, the checkpoints and the trackers are made from it)."""
    missing, extra = missing_and_extra(option_names(TrainJob))
    assert not missing, f"train.py options no concern of TrainJob holds: {sorted(missing)}"
    assert not extra, f"TrainJob fields that are no train.py option: {sorted(extra)}"


def test_the_flags_without_effect_are_kept_apart() -> None:
    """No concern the training code reads holds a flag that changes nothing; the timm concern holds only those."""
    inert = inert_dests()
    assert option_names(TimmOnlyOptions) == inert
    acting = set().union(*(option_names(concern) for concern in concerns() if concern is not TimmOnlyOptions))
    assert not acting & inert


def test_a_missing_field_is_caught() -> None:
    planted = option_names(TrainJob) - {"mixup_off_epoch"}
    assert missing_and_extra(planted) == ({"mixup_off_epoch"}, set())
    assert missing_and_extra(option_names(TrainJob) | {"planted"}) == (set(), {"planted"})


def test_each_option_belongs_to_one_concern() -> None:
    counts = Counter(field.name for concern in concerns() for field in dataclasses.fields(concern))
    assert [name for name, count in counts.items() if count > 1] == []


def test_concerns_are_frozen_and_only_declared_options_have_defaults() -> None:
    """A default lives in one place: a train.py option's declaration here, a shared flag's definition in
    vtools/cli/options.py (the runtime's --workers, which parity.py lacks, aside)."""
    for concern in concerns():
        assert concern.__dataclass_params__.frozen, concern.__name__
        undeclared = [
            f.name
            for f in dataclasses.fields(concern)
            if declaration(f) is None
            and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)
        ]
        assert undeclared == (["workers"] if concern.__name__ == "RuntimeOptions" else []), concern.__name__


def test_a_declared_option_parses_to_its_declared_default() -> None:
    """The generated parser gives each declared field the field's own default: nothing restates it."""
    parser = build_parser()
    declared = {f.name: default_of(f) for concern in concerns() for f, _ in declared_fields(concern)}
    assert len(declared) > 100
    assert {name: parser.get_default(name) for name in declared} == declared


def test_the_job_holds_the_parsed_values() -> None:
    args = parse(["/data", "--model", "resnet18", "--lr", "0.5", "--mixup", "0.2", "--log-interval", "7"])
    job = typed_options(TrainJob, args)
    assert (job.model.model, job.optim.lr, job.augment.mixup, job.logging.log_interval) == ("resnet18", 0.5, 0.2, 7)
    assert job.data.data_dir == "/data" and job.runtime.device == "auto"
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.optim.lr = 1.0  # type: ignore[misc]


def test_the_development_guide_quotes_the_code() -> None:
    """docs/development.md shows real declarations, their consumers and a command's parts: each quoted block
    is in the file the page names for it."""
    import re

    from tests.conftest import REPO

    guide = (REPO / "docs" / "development.md").read_text()
    # the tracker section's blocks are tests/observe/test_run_trackers.py's to check
    blocks = re.findall(r"```python\n(.*?)```", guide.split("## Adding a tracker")[0], re.S)
    sources = [
        REPO / "vtools" / name
        for name in (
            "options/train_job.py",
            "train/early_stop.py",
            "options/shared.py",
            "cli/benchmark_flags.py",
            "cli/plot_flags.py",
        )
    ]
    assert len(blocks) == len(sources)
    for block, source in zip(blocks, sources, strict=True):
        assert block in source.read_text(), f"docs/development.md quotes code that {source.name} no longer has"
    assert "job.run.early_stop_min_delta" in (REPO / "vtools" / "train" / "run.py").read_text()
    registry_line = re.search(r"`(Command\(\"plot\".*?\))`", guide).group(1)
    assert registry_line in (REPO / "vtools" / "cli" / "registry.py").read_text()

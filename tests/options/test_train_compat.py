"""timm's train.py flags that cannot act here (vtools/options/train_compat.py): at timm's default they
pass, any other value stops in one line with the declared reason; the no-ops take any value."""

from __future__ import annotations

import dataclasses

import pytest

from vtools.cli import registry
from vtools.cli.timm_compat import no_op_flags, refused_flags
from vtools.errors import UsageError
from vtools.options.declare import declared_fields
from vtools.options.train_compat import FeatureDistillFlags, TimmTrainFlags

pytestmark = pytest.mark.cpu_only(reason="parses command lines; runs nothing on a device")

# a value other than timm's default, for each kind of refused flag
OTHER_VALUE = {"--kd-distill-type": ["feature"], "--train-size-schedule": ["progressive"], "--worker-seeding": ["part"]}
OTHER_VALUE |= {"--kd-token-distill-type": ["hard"], "--variable-batch-loss-scale": ["sqrt"]}


def refused_fields() -> list[tuple[str, dataclasses.Field, object]]:
    return [
        (declared.flags[0], field, declared)
        for concern in (FeatureDistillFlags, TimmTrainFlags)
        for field, declared in declared_fields(concern)
        if declared.refused is not None
    ]


@pytest.mark.parametrize("flag, field, declared", refused_fields(), ids=[flag for flag, _, _ in refused_fields()])
def test_a_refused_flag_stops_off_its_default_with_its_reason(flag: str, field, declared) -> None:  # noqa: ANN001
    parser = registry.build_parser("train")
    value = OTHER_VALUE.get(flag) or ([] if field.type == "bool" else ["3"])
    with pytest.raises(UsageError) as refused:
        parser.parse_args(["--data-dir", "d", flag, *value])
    assert str(refused.value).endswith(declared.refused) and str(refused.value).startswith(flag)
    assert refused_flags(parser)[max(declared.flags, key=len)] == declared.refused


def test_the_no_ops_take_any_value() -> None:
    parser = registry.build_parser("train")
    parsed = parser.parse_args(["--train-num-samples", "5", "--use-multi-epochs-loader", "--local_rank", "1"])
    assert (parsed.train_num_samples, parsed.use_multi_epochs_loader, parsed.local_rank) == (5, True, 1)
    assert {"--train-num-samples", "--use-multi-epochs-loader", "--local_rank"} <= set(no_op_flags(parser))

"""Device spec parsing and resolution through the one code path."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import assert_usage_error, run_script
from vtools.errors import UsageError
from vtools.observe.env_report import describe
from vtools.runtime import device as dev


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("cpu", ("cpu", None)),
        ("cuda", ("cuda", None)),
        ("cuda:1", ("cuda", 1)),
        ("npu:0", ("npu", 0)),
        ("xpu:2", ("xpu", 2)),
        ("mps", ("mps", None)),
        ("auto", ("auto", None)),
        ("NPU:3", ("npu", 3)),
        ("my_backend:0", ("my_backend", 0)),
    ],
)
def test_parse_valid_specs(spec: str, expected: tuple) -> None:
    assert dev.parse_device_spec(spec) == expected


@pytest.mark.parametrize("spec", ["npu:x", "cuda:-1", ":0", "npu:", "cuda:0:1", "cpu:1", "npu 0"])
def test_parse_malformed_specs(spec: str) -> None:
    with pytest.raises(UsageError, match="malformed"):
        dev.parse_device_spec(spec)


@pytest.mark.parametrize("spec", ["npu:x", "cpu:1"])
def test_a_malformed_spec_names_the_flag_that_gave_it(spec: str) -> None:
    """parity's --against is resolved like --device; its errors named --device."""
    with pytest.raises(UsageError, match=f"malformed --against '{spec}'"):
        dev.parse_device_spec(spec, flag="--against")


def test_the_emulator_is_suggested_only_where_it_exists(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In a source checkout, --device npu without torch_npu says how to try the npu path on the emulated npu;
    an installed copy of vtools has no tests/ folder, and says nothing of it."""
    monkeypatch.setattr(sys, "argv", ["/anywhere/train.py"])
    npu, xpu = dev.kind_of("npu"), dev.kind_of("xpu")
    assert dev._emulator_hint(npu, "--device").endswith("python3 -m tests.emulated_npu train.py ... --device npu")
    assert dev._emulator_hint(xpu, "--device") == ""
    monkeypatch.setattr(dev, "_CHECKOUT", str(tmp_path))
    assert dev._emulator_hint(npu, "--device") == ""


def test_resolve_gives_current_device(device: torch.device) -> None:
    resolved = dev.resolve_device(str(device))
    assert resolved == device
    if device.type != "cpu":
        assert resolved.index is not None
        assert dev.device_module(device).current_device() == resolved.index


def test_local_rank_picks_index(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    if dev.device_count(device.type) < 2:
        pytest.skip("needs two devices of this type")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert dev.resolve_device(device.type) == torch.device(device.type, 1)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert dev.resolve_device(device.type) == torch.device(device.type, 0)


def test_index_out_of_range(device: torch.device) -> None:
    count = dev.device_count(device.type)
    if device.type == "cpu":
        pytest.skip("cpu takes no index")
    with pytest.raises(UsageError, match=rf"{device.type}:{count} requested, {count} visible"):
        dev.resolve_device(f"{device.type}:{count}")


@pytest.mark.cpu_only(reason="the message of a host where cuda is hidden, whatever the host has")
def test_a_timm_args_yaml_naming_cuda_says_what_runs_here(tmp_path: Path) -> None:
    """timm's train.py writes ``device: cuda`` into every args.yaml; off-GPU the stop named cuda and nothing
    else, though ``--device auto`` runs the same recipe on what the host has."""
    (tmp_path / "args.yaml").write_text("device: cuda\nmodel: test_resnet\nworkers: 4\n", encoding="utf-8")
    proc = run_script(
        ["train.py", "-c", str(tmp_path / "args.yaml"), "--data-dir", "data/fashion-mnist-mini"],
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert_usage_error(proc, "--device cuda: this torch supports cuda but no device is available")
    assert "; --device auto runs on what this host has (cpu)" in proc.stderr, proc.stderr


@pytest.mark.cpu_only(reason="resolution fails before any device is used")
def test_unknown_type_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown device type 'warpdrive'"):
        dev.resolve_device("warpdrive")


@pytest.mark.cpu_only(reason="resolution fails before any device is used")
def test_unimportable_device_module() -> None:
    with pytest.raises(UsageError, match="cannot import 'no_such_module_xyz'"):
        dev.resolve_device("cpu", ["no_such_module_xyz"])


def test_helpers_run_on_every_device(device: torch.device) -> None:
    """The generic helpers work (or are clean no-ops) on each device."""
    dev.synchronize(device)
    dev.reset_peak_memory(device)
    x = torch.ones(256, 256, device=device)
    peak = dev.peak_memory_bytes(device)
    if device.type == "cpu":
        assert peak is None
    else:
        assert peak >= x.numel() * 4
    assert dev.pin_memory(device) == (device.type != "cpu")
    assert dev.non_blocking(device) == dev.pin_memory(device)
    info = describe(device)
    assert info["device"] == str(device) and info["name"]


def test_seed_everything_repeats(device: torch.device) -> None:
    dev.seed_everything(123)
    first = torch.rand(4, device=device).cpu()
    dev.seed_everything(123)
    assert torch.equal(first, torch.rand(4, device=device).cpu())


def test_rng_state_round_trip(device: torch.device) -> None:
    state = dev.rng_state(device)
    first = torch.rand(4, device=device).cpu()
    dev.set_rng_state(device, state)
    assert torch.equal(first, torch.rand(4, device=device).cpu())


def test_dist_backend_per_device_type() -> None:
    assert dev.dist_backend(torch.device("cpu")) == "gloo"
    assert dev.kind_of("npu").dist_backend == "hccl"
    assert dev.kind_of("cuda").dist_backend == "nccl"
    assert dev.kind_of("xpu").dist_backend == "xccl"
    assert dev.kind_of("mps").dist_backend == "gloo"
    assert dev.dist_backend(torch.device("cpu"), override="gloo") == "gloo"


def test_dist_backend_checked_for_availability(device: torch.device) -> None:
    if device.type == "npu":  # the emulator registers hccl for npu (tests/emulated_npu/process_group.py)
        assert dev.dist_backend(device) == "hccl"
        assert dev.dist_backend(device, override="gloo") == "gloo"
    with pytest.raises(UsageError, match="'no_such_backend'"):
        dev.dist_backend(device, override="no_such_backend")


@pytest.fixture
def default_backend_flags():
    """Start from torch's defaults and put them back afterwards: the flags are process-wide."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark = False, False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark = saved


def test_cuda_tuning_is_what_timm_turns_on(default_backend_flags) -> None:
    """timm's train.py enables TF32 matmuls and cuDNN autotuning on CUDA; the cuda row does the same,
    without a branch anywhere (the flags can be set on any build, so this runs without a GPU)."""
    applied = dev.apply_tuning(torch.device("cuda", 0))
    assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.benchmark is True
    assert applied == {"torch.backends.cuda.matmul.allow_tf32": True, "torch.backends.cudnn.benchmark": True}


def test_other_devices_keep_torch_defaults(device: torch.device, default_backend_flags) -> None:
    if device.type == "cuda":
        pytest.skip("the cuda row tunes on purpose (test above)")
    assert dev.apply_tuning(device) == {}
    assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.benchmark is False


# ---------------------------------------------------------------- the table keeps its promise: a row, not a branch

DEVICE_MODULE = Path(dev.__file__)
DEVICE_NAMES = {*dev.DEVICE_KINDS, "cpu", "cuda", "npu", "xpu", "mps", "mlu", "hpu"}


def _names_in(node: ast.AST) -> set[str]:
    """Device names a comparison operand spells: a string literal, or literals in a tuple, list or set."""
    parts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {p.value.lower() for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)}


def device_name_branches(source: str) -> list[str]:
    """Comparisons (==, !=, in, match cases) with a device name, as ``line: code``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        if any(_names_in(operand) & DEVICE_NAMES for operand in operands):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_device_module_never_branches_on_a_device_name() -> None:
    """What differs between device types is a field of their row (vtools/runtime/device_kinds.py)."""
    offenders = device_name_branches(DEVICE_MODULE.read_text(encoding="utf-8"))
    assert not offenders, "device.py branches on a device name; make it a field of the row:\n" + "\n".join(offenders)


def test_the_branch_check_can_fail() -> None:
    planted = (
        "if device.type == 'npu':\n    pass\n"
        "ok = kind not in ('auto', 'cpu')\n"
        "same = 'MPS' != name\n"
        "match device.type:\n    case 'cuda':\n        pass\n"
        "fine = kind.host and name == 'auto' and spec != 'privateuse'\n"
    )
    assert [line.split(":")[0] for line in device_name_branches(planted)] == ["1", "3", "4", "6"]


def test_the_device_module_stays_short() -> None:
    """The table is data in its own module (the chips' in device_chips.py, the cards' in device_cards.py);
    device.py holds the operations on it."""
    assert len(DEVICE_MODULE.read_text(encoding="utf-8").splitlines()) < 355

"""Preflight: each set-up problem that breaks accelerator jobs is one line with its fix, fatal ones exit 2
before any model is built, and ``vtools env --check`` lists them all; on the emulated npu as on Ascend.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from tests.conftest import (
    EMULATED_NPU_MODULE,
    REPO,
    assert_usage_error,
    broken_torch_npu_package,
    device_flags,
    load_emulated_npu,
    run_script,
    train_args,
)
from vtools.runtime import preflight

pytestmark = pytest.mark.cpu_only(
    reason="each test sets up the device situation it checks; those about the npu load the emulator themselves"
)
CHECK_NPU = ["-m", "vtools", "env", "--check", "--device", "npu", "--device-modules", EMULATED_NPU_MODULE]


@pytest.mark.parametrize(
    "visible, local_world, fragment",
    [
        ("0,0", "1", "ASCEND_RT_VISIBLE_DEVICES=0,0 names device 0 twice"),
        ("1,0", "1", "ASCEND_RT_VISIBLE_DEVICES=1,0 is out of order"),
        ("0,x", "1", "device ids must be integers"),
        ("0", "2", "shows 1 device(s) but 2 processes run on this host"),
        ("0, 1", "1", "names 2 devices but the runtime reads 0 (it stops at the first character"),
    ],
)
def test_visible_devices_mistakes_stop_a_run_before_any_model(
    visible: str, local_world: str, fragment: str, fashion4: Path, tmp_path: Path
) -> None:
    env = {"ASCEND_RT_VISIBLE_DEVICES": visible, "LOCAL_WORLD_SIZE": local_world}
    if visible == "1,0":  # as a run meets it (once: every script runs the same preflight)
        proc = run_script(train_args(fashion4, tmp_path, "run", *device_flags("npu")), env=env)
        assert_usage_error(proc, fragment)
        assert not (tmp_path / "run").exists()
    check = run_script(CHECK_NPU, env=env)
    errors = [line for line in check.stdout.splitlines() if line.startswith("preflight error: ")]
    assert check.returncode == 2 and len(errors) == 1 and fragment in errors[0]


def test_a_space_in_the_visible_devices_hides_the_device_asked_for(fashion4: Path, tmp_path: Path) -> None:
    """torch_npu reads ``0, 1`` as device 0 alone: ``--device npu:1`` stops in one line naming the variable as
    the runtime reads it, before the backend would say there is no npu:1 (the emulator reads it the same way)."""
    env = {"ASCEND_RT_VISIBLE_DEVICES": "0, 1"}
    proc = run_script(train_args(fashion4, tmp_path, "run", "--device", "npu:1", *device_flags("npu")[2:]), env=env)
    assert_usage_error(proc, "ASCEND_RT_VISIBLE_DEVICES=0, 1' names 2 devices but the runtime reads 0")
    count = run_script(["-c", "import tests.emulated_npu, torch; print(torch.npu.device_count())"], env=env)
    assert count.stdout.strip() == "1"


def test_a_good_visible_devices_list_passes() -> None:
    check = run_script(CHECK_NPU, env={"ASCEND_RT_VISIBLE_DEVICES": "0,1"})
    assert check.returncode == 0, check.stdout + check.stderr
    assert "preflight: 0 error(s)" in check.stdout


def test_auto_with_a_broken_backend_is_never_a_silent_cpu_run(fashion4: Path, tmp_path: Path) -> None:
    broken_torch_npu_package(tmp_path)
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = run_script(train_args(fashion4, tmp_path, "run", "--device", "auto"), env=env)
    assert_usage_error(proc, "--device auto found no usable npu although torch_npu is installed", "--device cpu")
    chosen = run_script(train_args(fashion4, tmp_path, "cpu", "--device", "cpu", "--epochs", "1"), env=env)
    assert chosen.returncode == 0, chosen.stderr[-2000:]  # the cpu on purpose still runs


def _fake_backend_release(root: Path, version: str) -> dict[str, str]:
    """An installed torch_npu distribution of ``version`` (its metadata only: the emulator is the device)."""
    dist_info = root / f"torch_npu-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch_npu\nVersion: {version}\n")
    return {"PYTHONPATH": f"{root}:{REPO}"}


def test_a_backend_built_for_another_torch_stops(tmp_path: Path) -> None:
    import torch

    major, minor = torch.__version__.split(".")[:2]
    other = f"{major}.{int(minor) - 1}.0"
    proc = run_script(CHECK_NPU, env=_fake_backend_release(tmp_path / "old", other))
    assert proc.returncode == 2
    assert f"torch_npu {other} is built for torch {other}, this is torch {torch.__version__}" in proc.stdout
    matching = torch.__version__.split("+")[0] + ".post2"  # the release for this torch, a later build of it
    assert run_script(CHECK_NPU, env=_fake_backend_release(tmp_path / "same", matching)).returncode == 0


def test_the_rendezvous_port_in_use_stops_an_srun_style_launch(fashion4: Path, tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        proc = run_script(train_args(fashion4, tmp_path, "run", "--device", "cpu"), env=env)
    assert_usage_error(proc, f"MASTER_PORT {port} is already in use")


def test_the_start_line_names_the_chip_and_the_settings_applied(fashion4: Path, tmp_path: Path) -> None:
    """A 910A (no bf16, operators compiled per shape by default): the start line names the chip and its family,
    says fp16 + GradScaler, and --device-settings turns jit_compile off."""
    flags = [*device_flags("npu"), "--epochs", "1", "--device-settings"]
    proc = run_script(train_args(fashion4, tmp_path, "run", *flags), env={"VTOOLS_EMU_NPU_CHIP": "910A"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "npu:0: Ascend910A (Atlas training series (910A)), no bfloat16: --amp uses float16" in proc.stdout
    assert "device: applied npu.set_compile_mode(jit_compile=False)" in proc.stdout


@pytest.fixture
def emulated_settings() -> None:
    """The emulated npu's settings as a new process has them, before and after the test."""
    load_emulated_npu()
    from tests.emulated_npu import device as emulated

    saved = (dict(emulated._compile_mode), dict(emulated.matmul._values), dict(emulated.conv._values))
    emulated._compile_mode.clear()  # the chip's default, as in a process nothing has set it in
    yield
    emulated._compile_mode.clear()
    emulated._compile_mode.update(saved[0])
    emulated.matmul._values.update(saved[1])
    emulated.conv._values.update(saved[2])


@pytest.mark.npu_only(reason="the emulated npu posing as each chip family, whose defaults differ")
@pytest.mark.parametrize(("chip", "applied"), [("910A", True), ("910B", False), ("910_93", False), ("950", False)])
def test_the_recommended_settings_apply_only_where_the_chip_lacks_them(
    chip: str, applied: bool, emulated_settings: None
) -> None:
    """jit_compile is on by default on the Atlas training series only (the chip table): a bare
    --device-settings turns it off there, and elsewhere says it already is."""
    from tests.emulated_npu.chips import posing_as

    with posing_as(chip):
        npu = torch.device("npu:0")
        family = preflight.dev.chip_family(npu)
        assert torch.npu.is_jit_compile_false() is not applied
        [line] = preflight.apply_settings(npu, recommended=True, named={})
        assert torch.npu.is_jit_compile_false()
    expected = (
        "applied npu.set_compile_mode(jit_compile=False)"
        if applied
        else f"jit_compile is already False by default on the {family.name}"
    )
    assert line == expected


@pytest.mark.npu_only(reason="the emulated npu's settings objects, torch_npu's names")
def test_settings_by_name_set_each_target_and_refuse_what_is_unknown(emulated_settings: None) -> None:
    from vtools.errors import UsageError

    npu = torch.device("npu:0")
    lines = preflight.apply_settings(npu, recommended=False, named={"allow_hf32": "true", "jit_compile": False})
    assert lines == [
        "applied npu.set_compile_mode(jit_compile=False)",
        "applied npu.matmul.allow_hf32 = True",
        "applied npu.conv.allow_hf32 = True",
    ]
    assert torch.npu.matmul.allow_hf32 and torch.npu.conv.allow_hf32 and torch.npu.is_jit_compile_false()
    with pytest.raises(UsageError, match=r"^--device-kwargs allow_tf32: npu has no such setting \(it has: jit_co"):
        preflight.apply_settings(npu, recommended=False, named={"allow_tf32": True})
    with pytest.raises(UsageError, match=r"^--device-kwargs allow_hf32=maybe: expected true or false$"):
        preflight.apply_settings(npu, recommended=False, named={"allow_hf32": "maybe"})
    with pytest.raises(UsageError, match=r"cpu has no such setting \(it has: none\)"):
        preflight.apply_settings(torch.device("cpu"), recommended=False, named={"jit_compile": False})


@pytest.mark.npu_only(reason="the emulated npu's chip, with and without bfloat16")
def test_the_chip_note_says_what_amp_would_use_not_what_the_run_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """A float32 run on a bf16 chip printed "(float32)" and then "device: npu:0: ..., bfloat16"."""
    load_emulated_npu()
    [note] = preflight.chip(torch.device("npu:0"))
    assert note.text.endswith(", bfloat16 supported (--amp uses it)"), note.text
    monkeypatch.setenv("VTOOLS_EMU_NPU_NO_BF16", "1")
    [note] = preflight.chip(torch.device("npu:0"))
    assert note.text.endswith(", no bfloat16: --amp uses float16 with a GradScaler"), note.text


def test_recommended_settings_are_reported_until_set() -> None:
    unset = run_script(CHECK_NPU, env={"HCCL_CONNECT_TIMEOUT": None, "PYTORCH_NPU_ALLOC_CONF": None})
    assert "preflight note: HCCL_CONNECT_TIMEOUT=(unset)" in unset.stdout
    assert "recommended PYTORCH_NPU_ALLOC_CONF=expandable_segments:True" in unset.stdout
    done = run_script(
        CHECK_NPU, env={"HCCL_CONNECT_TIMEOUT": "1200", "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}
    )
    assert "HCCL_CONNECT_TIMEOUT=(" not in done.stdout and "ALLOC_CONF" not in done.stdout.split("preflight")[-1]


@pytest.mark.npu_only(reason="torch_npu's variables, read through the emulated npu's backend")
@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, []),
        ({"TASK_QUEUE_ENABLE": "2"}, []),
        ({"TASK_QUEUE_ENABLE": "0"}, ["note: the npu launch queue is off (TASK_QUEUE_ENABLE=0"]),
        ({"ASCEND_LAUNCH_BLOCKING": "1"}, ["warning: ASCEND_LAUNCH_BLOCKING=1: every operator launch waits"]),
        ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, []),
        (
            {"PYTORCH_ALLOC_CONF": "max_split_size_mb:512"},
            [
                "note: PYTORCH_ALLOC_CONF=max_split_size_mb:512: less fragmentation when sizes change; recommended "
                "PYTORCH_ALLOC_CONF=max_split_size_mb:512,expandable_segments:True"
            ],
        ),
        (
            {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"},
            ["error: both PYTORCH_NPU_ALLOC_CONF and PYTORCH_ALLOC_CONF are set, which the backend refuses"],
        ),
    ],
    ids=["defaults", "queue-2", "queue-off", "blocking", "torch-alloc-conf", "torch-alloc-conf-item", "both"],
)
def test_the_launch_queue_is_asked_and_the_allocator_variable_is_the_one_set(
    environment: dict[str, str], expected: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue's level is the backend's (the variable is not: a blocking launch forces it off); the
    allocator advice goes to whichever of torch_npu's two variables is set."""
    load_emulated_npu()
    names = ("TASK_QUEUE_ENABLE", "ASCEND_LAUNCH_BLOCKING", "PYTORCH_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CPU_AFFINITY_CONF", "2")
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "1200")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    if "PYTORCH_ALLOC_CONF" not in environment:
        monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")
    found = preflight.settings(preflight.dev.kind_of("npu"), torch.device("npu:0"))
    lines = [f"{finding.severity}: {finding.text}" for finding in found]
    assert len(lines) == len(expected) and all(line.startswith(start) for line, start in zip(lines, expected)), lines


def test_findings_are_data_not_branches() -> None:
    """Every check reads the device table: a device type with no such data yields no finding."""
    from vtools.runtime.device import DeviceKind

    plain = DeviceKind("newdev", visible_env="NEWDEV_VISIBLE")
    assert preflight.visible_devices(plain) == [] and preflight.backend_version(plain) == []
    assert preflight.settings(plain) == []


def test_a_leftover_process_holding_the_device_is_named(tmp_path: Path) -> None:
    """Another process with device 0's node open (an earlier job that never ended) is named with its pid;
    device 1's node, held by nobody, gives no finding; behind a visible-devices list the card's node is the one
    checked, and named."""
    import os
    import subprocess
    import sys
    import time

    from vtools.runtime.device import DeviceKind

    for index in (0, 1, 4):
        (tmp_path / f"davinci{index}").write_text("")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"f = open({str(tmp_path / 'davinci0')!r}); g = open({str(tmp_path / 'davinci4')!r}); "
            "print('ready', flush=True); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        kind = DeviceKind("npu", device_file=str(tmp_path / "davinci{}"))
        held = preflight.leftover_processes(kind, 0)
        assert len(held) == 1 and held[0].severity == "warning"
        assert f"pid {holder.pid} (" in held[0].text and "is held by" in held[0].text
        assert preflight.leftover_processes(kind, 1) == []
        # ASCEND_RT_VISIBLE_DEVICES=4,5: index 0 is card 4, whose node is checked and named
        visible = DeviceKind(
            "npu", device_file=str(tmp_path / "davinci{}"), visible_env="VTOOLS_TEST_VISIBLE", numeric_visible_ids=True
        )
        os.environ["VTOOLS_TEST_VISIBLE"] = "4,5"
        try:
            [card] = preflight.leftover_processes(visible, 0)
        finally:
            del os.environ["VTOOLS_TEST_VISIBLE"]
        assert card.text.startswith(f"npu:0 (card 4) ({tmp_path / 'davinci4'}) is held by pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait(timeout=10)
    time.sleep(0.1)
    assert preflight.leftover_processes(kind, 0) == []

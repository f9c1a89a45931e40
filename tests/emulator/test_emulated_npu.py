"""Self-tests of the emulated Ascend NPU (tests/emulated_npu).

Run: python3 -m pytest -q tests/emulator/test_emulated_npu.py
The first run compiles the C++ extension (~30-60 s on 2 cores); later runs reuse it.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tests.emulated_npu as emu
from tests.conftest import REPO, run_script

EMULATOR_SETTINGS = ("ASCEND_RT_VISIBLE_DEVICES", "VTOOLS_EMU_NPU_DEVICE_COUNT", "VTOOLS_EMU_NPU_NO_BF16")


def run_python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter with the emulator importable (the repository ahead of any inherited
    PYTHONPATH) and none of its settings but ``env``'s; return the last line of stdout."""
    path = os.pathsep.join(filter(None, [str(REPO), env.pop("PYTHONPATH", os.environ.get("PYTHONPATH"))]))
    proc = run_script(
        ["-c", textwrap.dedent(code)], env={**dict.fromkeys(EMULATOR_SETTINGS), **env, "PYTHONPATH": path}
    )
    assert proc.returncode == 0, f"subprocess failed:\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


# --- registration -------------------------------------------------------------


def test_backend_registered_and_idempotent():
    emu.install()  # a second install is a no-op
    import tests.emulated_npu  # noqa: F401  (re-import is harmless)

    assert torch._C._get_privateuse1_backend_name() == "npu"
    assert torch.npu is torch.get_device_module("npu")
    assert torch.device("npu:1").type == "npu"
    t = torch.ones(2).npu()
    assert t.is_npu and t.device == torch.device("npu", torch.npu.current_device())
    m = torch.nn.Linear(2, 2).npu()
    assert m.weight.device.type == "npu"


def test_accelerator_reports_npu():
    acc = torch.accelerator.current_accelerator()
    assert acc is not None and acc.type == "npu"
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == torch.npu.device_count() >= 1
    assert torch.npu.is_available()
    assert torch.accelerator.current_device_index() == torch.npu.current_device()


def test_set_device_and_bad_index():
    assert torch.npu.device_count() >= 2, "default emulator has 2 devices"
    old = torch.npu.current_device()
    try:
        torch.npu.set_device(1)
        assert torch.npu.current_device() == 1
        assert torch.zeros(1, device="npu").device == torch.device("npu:1")
        assert torch.ones(1).npu().device == torch.device("npu:1")
    finally:
        torch.npu.set_device(old)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.npu.set_device(99)
    with pytest.raises(RuntimeError):
        torch.zeros(1, device="npu:99")
    with pytest.raises(AssertionError):
        torch.npu.get_device_properties(99)
    with pytest.raises(ValueError):
        torch.npu.memory_allocated("cpu")
    props = torch.npu.get_device_properties(0)
    assert props.name == torch.npu.get_device_name() == "Emulated Ascend NPU (CPU memory)"
    assert props.total_memory > 0
    torch.npu.synchronize()
    torch.npu.synchronize("npu:1")


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, 2),
        ({"VTOOLS_EMU_NPU_DEVICE_COUNT": "4"}, 4),
        ({"ASCEND_RT_VISIBLE_DEVICES": "3,5,7"}, 3),
        ({"ASCEND_RT_VISIBLE_DEVICES": "6", "VTOOLS_EMU_NPU_DEVICE_COUNT": "4"}, 1),
        ({"VTOOLS_EMU_NPU_DEVICE_COUNT": "0"}, 0),
    ],
)
@pytest.mark.npu_only(reason="a self-test of the emulated npu, in a fresh process")
def test_device_count_honours_env(env, expected):
    out = run_python(
        """
        import torch, tests.emulated_npu
        print(torch.npu.device_count(), torch.accelerator.device_count(), torch.npu.is_available())
        """,
        **env,
    )
    assert out == f"{expected} {expected} {expected > 0}"


def test_build_is_cached_and_runner_works():
    from tests.emulated_npu import _build

    so = _build.build_dir() / f"{_build.EXTENSION_NAME}.so"
    assert so.is_file()
    mtime = so.stat().st_mtime_ns
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.emulated_npu",
            "-c",
            "import sys, torch; print(torch.ones(3, device='npu').sum().item(), "
            "torch.accelerator.current_accelerator().type, sys.argv[1:])",
            "x",
            "y",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "3.0 npu ['x', 'y']"
    assert so.stat().st_mtime_ns == mtime, "a second process must not rebuild the extension"


# --- data movement --------------------------------------------------------------


def test_round_trip_contiguous_noncontiguous_and_dtype():
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    assert torch.equal(x.npu().cpu(), x)

    # Non-contiguous source, both directions.
    nc = x.t()[::2]
    assert not nc.is_contiguous()
    on_npu = nc.npu()
    assert on_npu.device.type == "npu"
    assert torch.equal(on_npu.cpu(), nc)
    assert torch.equal(x.npu().t()[::2].cpu(), nc)  # strided view taken on the device

    # dtype changes on the way in, on the device and on the way out.
    assert torch.equal(x.to("npu", torch.float16).cpu(), x.half())
    assert torch.equal(x.npu().to(torch.bfloat16).cpu(), x.bfloat16())
    assert torch.equal(x.npu().to("cpu", torch.int32), x.int())
    ints = torch.arange(10)
    assert torch.equal(ints.npu().cpu(), ints)

    # npu -> npu across devices, and copy_ into a non-contiguous destination.
    assert torch.equal(x.to("npu:0").to("npu:1").cpu(), x)
    dst = torch.zeros(6, 4, device="npu").t()
    dst.copy_(x)
    assert torch.equal(dst.cpu(), x)


def test_views_share_storage_and_ops_run():
    y = torch.arange(12, dtype=torch.float32, device="npu").reshape(3, 4)
    v = y.view(-1)
    v[0] = 100.0
    y.t()[1, 2] = -1.0  # write through a transposed view
    u = y.unfold(1, 2, 2)
    u[0, 0, 0] += 1
    expected = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    expected[0, 0] = 101.0
    expected[2, 1] = -1.0
    assert torch.equal(y.cpu(), expected)
    assert y.sum().item() == expected.sum().item()
    idx = torch.tensor([2, 0], device="npu")
    assert torch.equal(y[idx].cpu(), expected[[2, 0]])
    assert torch.equal(torch.cat([y, y]).cpu(), torch.cat([expected, expected]))
    y.resize_(2, 2)
    assert y.shape == (2, 2) and y.device.type == "npu"


def test_printing_and_torch_load_map_location(tmp_path):
    t = torch.tensor([1.5, -2.0], device="npu")
    text = repr(t)  # repr formats via float64 upstream; patched to float32 for npu
    assert "1.5000" in text and "device='npu:0'" in text
    path = tmp_path / "ckpt.pt"
    torch.save({"w": t}, path)
    loaded = torch.load(path, map_location="npu:1")
    assert loaded["w"].device == torch.device("npu:1")
    assert torch.equal(loaded["w"].cpu(), t.cpu())
    assert torch.load(path)["w"].device == torch.device("npu:0")


def test_float64_raises():
    with pytest.raises(RuntimeError, match="float64"):
        torch.zeros(2, dtype=torch.float64, device="npu")
    with pytest.raises(RuntimeError, match="float64"):
        torch.randn(3, 3, dtype=torch.float64).to("npu")
    with pytest.raises(RuntimeError, match="float64"):
        torch.randn(3).npu().double()
    with pytest.raises(RuntimeError, match="float64"):
        torch.ones(2, dtype=torch.complex128).npu()
    # Documented exemption: 0-dim scalars (GradScaler computes 1/scale in float64).
    assert torch.tensor(4.0, dtype=torch.float64, device="npu").reciprocal().item() == 0.25


def test_pin_memory_and_dataloader():
    t = torch.randn(8, 3)
    pinned = t.pin_memory()
    assert pinned.is_pinned() and not t.is_pinned()
    assert torch.equal(pinned.to("npu", non_blocking=True).cpu(), t)

    ds = torch.utils.data.TensorDataset(torch.randn(10, 3), torch.arange(10))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True)
    batches = list(loader)
    assert len(batches) == 3
    for xb, yb in batches:
        assert xb.is_pinned() and yb.is_pinned()
    xs = torch.cat([xb.to("npu", non_blocking=True) for xb, _ in batches])
    assert torch.equal(xs.cpu(), ds.tensors[0])


def test_safetensors_load_to_npu(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tensors = {"w": torch.randn(5, 7), "b": torch.arange(4, dtype=torch.int64), "h": torch.randn(3).half()}
    path = tmp_path / "t.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    loaded = safetensors_torch.load_file(str(path), device="npu")
    assert set(loaded) == set(tensors)
    for k, v in tensors.items():
        assert loaded[k].device.type == "npu"
        assert loaded[k].dtype == v.dtype
        assert torch.equal(loaded[k].cpu(), v)


# --- memory statistics ------------------------------------------------------------


def test_memory_allocated_tracks_tensors():
    before = torch.npu.memory_allocated()
    t = torch.empty(1024, 256, device="npu")  # 1 MiB of float32
    assert torch.npu.memory_allocated() - before == 1024 * 256 * 4
    assert torch.npu.max_memory_allocated() >= torch.npu.memory_allocated()
    assert torch.accelerator.memory_allocated() == torch.npu.memory_allocated()
    free, total = torch.npu.mem_get_info()
    assert total == torch.npu.get_device_properties().total_memory and free <= total - 1024 * 256 * 4
    del t
    assert torch.npu.memory_allocated() == before
    torch.npu.reset_peak_memory_stats()
    assert torch.npu.max_memory_allocated() == before

    # Per device: an allocation on npu:1 is charged to npu:1 only.
    b0, b1 = torch.npu.memory_allocated(0), torch.npu.memory_allocated("npu:1")
    t1 = torch.empty(1000, dtype=torch.uint8, device="npu:1")
    assert torch.npu.memory_allocated(1) - b1 == 1000
    assert torch.npu.memory_allocated(0) == b0
    del t1


# --- random numbers -----------------------------------------------------------------


def test_seeding_is_reproducible():
    torch.manual_seed(123)
    a = torch.randn(5, device="npu")
    d1 = torch.nn.functional.dropout(torch.ones(100, device="npu"), 0.5)
    torch.manual_seed(123)
    b = torch.randn(5, device="npu")
    d2 = torch.nn.functional.dropout(torch.ones(100, device="npu"), 0.5)
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(d1.cpu(), d2.cpu())
    state = torch.npu.get_rng_state()
    c = torch.rand(3, device="npu")
    torch.npu.set_rng_state(state)
    assert torch.equal(torch.rand(3, device="npu").cpu(), c.cpu())
    assert not torch.npu._is_in_bad_fork()


# --- autocast and training -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_policies(dtype):
    a = torch.randn(8, 8, device="npu")
    w = torch.randn(4, 3, 3, 3, device="npu")
    img = torch.randn(1, 3, 8, 8, device="npu")
    with torch.autocast("npu", dtype=dtype):
        assert torch.mm(a, a).dtype == dtype
        assert torch.nn.functional.linear(a, a).dtype == dtype
        assert torch.bmm(a[None], a[None]).dtype == dtype
        assert torch.addmm(a, a, a).dtype == dtype
        assert torch.nn.functional.conv2d(img, w).dtype == dtype
        low = torch.mm(a, a)
        assert torch.softmax(low, dim=-1).dtype == torch.float32
        assert torch.nn.functional.layer_norm(low, (8,)).dtype == torch.float32
        assert torch.nn.functional.mse_loss(low, low).dtype == torch.float32
        assert (a + a).dtype == torch.float32  # no policy: unchanged
    assert torch.mm(a, a).dtype == torch.float32  # autocast off again


@pytest.mark.npu_only(reason="a self-test of the emulated npu, in a fresh process")
def test_no_bf16_env_like_910a():
    out = run_python(
        """
        import warnings, torch, tests.emulated_npu
        a = torch.randn(4, 4, device="npu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast("npu", dtype=torch.bfloat16):  # unsupported: autocast disables itself
                bf = torch.mm(a, a).dtype
        with torch.autocast("npu", dtype=torch.float16):
            fp = torch.mm(a, a).dtype
        print(torch.npu.is_bf16_supported(), torch.npu.get_amp_supported_dtype(), bf, fp)
        """,
        VTOOLS_EMU_NPU_NO_BF16="1",
    )
    assert out == "False [torch.float16, torch.float32] torch.float32 torch.float16"
    assert torch.npu.is_bf16_supported()
    assert torch.npu.get_amp_supported_dtype() == [torch.float16, torch.bfloat16, torch.float32]


def _small_timm_model():
    timm = pytest.importorskip("timm")
    name = "test_resnet" if "test_resnet" in timm.list_models("test_*") else "resnet10t"
    return timm.create_model(name, num_classes=10, pretrained=False)


def test_timm_fp16_autocast_train_step_with_grad_scaler():
    torch.manual_seed(0)
    model = _small_timm_model().npu().train()
    before = {k: v.detach().cpu().clone() for k, v in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("npu")
    x = torch.randn(4, 3, 64, 64).npu()
    y = torch.randint(0, 10, (4,)).npu()

    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("npu", dtype=torch.float16):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
        assert logits.dtype == torch.float16 and logits.device.type == "npu"
        assert torch.isfinite(loss).item()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    assert scaler.get_scale() > 0
    changed = [k for k, v in model.named_parameters() if not torch.equal(v.detach().cpu(), before[k])]
    assert len(changed) == len(before), "every parameter should have moved"
    assert all(p.device.type == "npu" for p in model.parameters())


def test_timm_fp32_npu_matches_cpu():
    torch.manual_seed(0)
    cpu_model = _small_timm_model().train()
    npu_model = copy.deepcopy(cpu_model).npu()
    x = torch.randn(2, 3, 64, 64)
    y = torch.tensor([3, 7])

    results = {}
    for tag, model, dev in (("cpu", cpu_model, "cpu"), ("npu", npu_model, "npu")):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        loss = torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
        loss.backward()
        opt.step()
        results[tag] = (
            loss.detach().cpu(),
            {k: v.detach().cpu() for k, v in model.state_dict().items()},
        )
    assert torch.allclose(results["cpu"][0], results["npu"][0], rtol=1e-5, atol=1e-6)
    for k, v in results["cpu"][1].items():
        assert torch.allclose(v.float(), results["npu"][1][k].float(), rtol=1e-4, atol=1e-5), k


def test_a_build_to_come_is_said_before_its_minute_of_silence(tmp_path: Path) -> None:
    """The first import compiles for a minute or more: that is said on stderr, and only then."""
    from tests.emulated_npu import _build

    assert _build._needs_build(tmp_path)  # nothing built there yet
    built = tmp_path / f"{_build.EXTENSION_NAME}.so"
    built.write_bytes(b"")
    newest = max(source.stat().st_mtime for source in _build.SOURCES)
    os.utime(built, (newest + 10, newest + 10))
    assert not _build._needs_build(tmp_path)
    os.utime(built, (newest - 10, newest - 10))  # a source changed since
    assert _build._needs_build(tmp_path)

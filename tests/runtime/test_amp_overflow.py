"""The GradScaler on a chip that saturates: torch_npu's flag protocol, read from the wheel, and the same skips
as on an IEEE chip.

On an IEEE chip an overflowing float16 backward leaves inf in the gradients and the scaler skips the step.
On a 910A the gradients hold 65504 instead: only the chip's float-status flag shows the overflow, so the
scaler must clear it before the step's backward and the device's unscale kernel must read it. Each body
below runs on cpu, the emulated npu (a 910B) and the emulated npu posing as a 910A, and must see the same.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import CHIP_DEVICES, chip_device_flags, chip_environment, run_script, torchrun
from vtools.runtime import overflow
from vtools.runtime.amp import FlagGradScaler, resolve_amp

BATCH, FEATURES, CLASSES = 4, 6, 3

# ---------------------------------------------------------------- the protocol, as the wheel writes it

# the calls and assignments of torch_npu 2.14.0's scaler and utils that touch the flag, in source order, each
# with the conditions it sits under (an ``if``'s test; ``not (...)`` for its else branch)
OUTER = "self._dynamic and (not self._clear_overflow_flag)"
VALUES = "is_support_inf_nan() and (not is_force_overflow_check())"  # an Inf/NaN chip, not forced: look at values
FLAG = f"not ({VALUES})"
FUSED = "hasattr(optimizer, 'is_fused_optimizer')"
FOUND = "per_device_found_inf.get(device).item() > 0"
WHEEL_PROTOCOL = {
    ("npu/amp/grad_scaler.py", "GradScaler.scale"): [
        ("torch_npu.npu.utils.is_support_inf_nan()", (OUTER,)),
        ("GradScaler.clear_npu_overflow_flag()", (OUTER, "not torch_npu.npu.utils.is_support_inf_nan()")),
        ("self._clear_overflow_flag = True", (OUTER,)),
    ],
    ("npu/amp/grad_scaler.py", "GradScaler.update"): [
        ("self._has_overflow = False", ()),
        ("self._clear_overflow_flag = False", ()),
    ],
    ("npu/amp/grad_scaler.py", "GradScaler._unscale_grads_"): [
        (
            "torch._amp_foreach_non_finite_check_and_unscale_()",
            ("hasattr(optimizer, 'is_fused_optimizer')", "self._dynamic"),
        ),
        (
            "self._has_overflow = True",
            (
                "hasattr(optimizer, 'is_fused_optimizer')",
                "self._dynamic",
                "per_device_found_inf.get(device).item() > 0",
            ),
        ),
        (
            "torch._amp_foreach_non_finite_check_and_unscale_()",
            ("not (hasattr(optimizer, 'is_fused_optimizer'))", "self._dynamic"),
        ),
        (
            "self._has_overflow = True",
            (
                "not (hasattr(optimizer, 'is_fused_optimizer'))",
                "self._dynamic",
                "per_device_found_inf.get(device).item() > 0",
            ),
        ),
        ("self._sync_dist_overflow_count()", ()),
    ],
    ("npu/amp/grad_scaler.py", "GradScaler._sync_dist_overflow_count"): [
        ("torch_npu.npu.utils.is_support_inf_nan()", ()),
        ("return", ("torch_npu.npu.utils.is_support_inf_nan()",)),
        ("dist.all_reduce()", ("self._dynamic and self._dist_initialized", "self._has_overflow")),
        ("dist.all_reduce()", ("self._dynamic and self._dist_initialized", "not (self._has_overflow)")),
        (
            "self._has_overflow = True",
            (
                "self._dynamic and self._dist_initialized",
                "not (self._has_overflow)",
                "self._dist_overflow_count.item() != 0",
            ),
        ),
    ],
    ("npu/utils.py", "npu_check_overflow"): [
        ("is_support_inf_nan()", ()),
        ("is_force_overflow_check()", ()),
        ("return", (VALUES, "cpu_sum == float('inf') or cpu_sum == -float('inf') or cpu_sum != cpu_sum")),
        ("return", (VALUES, "not (cpu_sum == float('inf') or cpu_sum == -float('inf') or cpu_sum != cpu_sum)")),
        ("get_npu_overflow_flag()", (FLAG,)),
        ("clear_npu_overflow_flag()", (FLAG, "ret")),
        ("return", (FLAG,)),
    ],
}
FLAG_WORDS = (
    "inf_nan",
    "overflow_flag",
    "float_status",
    "force_overflow",
    "sync_dist_overflow",
    "all_reduce",
    "_amp_foreach",
)


def flag_protocol(function: ast.FunctionDef) -> list[tuple[str, tuple[str, ...]]]:
    """The flag's events of ``function`` in source order: calls whose name has a :data:`FLAG_WORDS` word,
    assignments to an ``overflow`` attribute, and returns under a condition that asks the chip's mode."""
    events: list[tuple[str, tuple[str, ...]]] = []

    def calls(node: ast.AST, guards: tuple[str, ...]) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and any(word in ast.unparse(sub.func) for word in FLAG_WORDS):
                events.append((f"{ast.unparse(sub.func)}()", guards))

    def visit(node: ast.stmt, guards: tuple[str, ...]) -> None:
        if isinstance(node, ast.If):
            calls(node.test, guards)
            test = ast.unparse(node.test)
            for child in node.body:
                visit(child, (*guards, test))
            for child in node.orelse:
                visit(child, (*guards, f"not ({test})"))
            return
        if isinstance(node, ast.Return) and any("inf_nan" in guard for guard in guards):
            events.append(("return", guards))
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if "overflow" in ast.unparse(target):
                    events.append((f"{ast.unparse(target)} = {ast.unparse(node.value)}", guards))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                visit(child, guards)
            elif not isinstance(node, ast.Assign) or child is node.value:
                calls(child, guards)

    for statement in function.body:
        visit(statement, ())
    return events


def wheel_function(torch_npu_wheel: Path, source: str, qualified: str) -> ast.FunctionDef:
    tree = ast.parse((torch_npu_wheel / "torch_npu" / source).read_text(encoding="utf-8"))
    *owner, name = qualified.split(".")
    scope = tree.body
    if owner:
        scope = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == owner[0]).body
    return next(node for node in scope if isinstance(node, ast.FunctionDef) and node.name == name)


@pytest.mark.parametrize(("source", "function"), list(WHEEL_PROTOCOL), ids=[name for _, name in WHEEL_PROTOCOL])
def test_the_wheels_flag_protocol_is_the_one_vtools_follows(torch_npu_wheel: Path, source: str, function: str) -> None:
    """Clear once per update before the scaled loss, only where the chip saturates; the unscale kernel reads
    the flag; where it saturates, the ranks' overflows are summed; check = read, then clear if raised. A change
    upstream fails here until FlagGradScaler (and the emulator) learn it."""
    assert flag_protocol(wheel_function(torch_npu_wheel, source, function)) == WHEEL_PROTOCOL[source, function]


# ---------------------------------------------------------------- the same skips on every chip


def _float16(device: torch.device):
    return resolve_amp(device, True, "float16")


def _batch(scale: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(BATCH, FEATURES, generator=generator) * scale
    return images, torch.randint(0, CLASSES, (BATCH,), generator=generator)


def _scaled_step(model, scaler, optimizer, amp, device, images, targets) -> float:
    """One float16 step through ``scaler``; returns the scale after it."""
    with amp.autocast():
        loss = torch.nn.functional.cross_entropy(model(images.to(device)), targets.to(device))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return scaler.get_scale()


def _linear(device: torch.device) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, CLASSES).to(device)


def test_a_saturating_chip_gets_the_flag_reading_scaler(chip_device: torch.device) -> None:
    amp = _float16(chip_device)
    assert isinstance(amp.grad_scaler(), FlagGradScaler) == amp.overflow.saturates
    assert amp.overflow.saturates == (chip_device.type == "npu" and not torch.npu.utils.is_support_inf_nan())


def test_an_overflowing_float16_step_is_skipped_and_the_next_one_taken(chip_device: torch.device) -> None:
    """Inputs 100x larger overflow the float16 weight gradient at the initial scale 2**16: that step is
    skipped (the scale halves, the weights stay); the next batch steps. On a 910A the gradient holds 65504,
    not inf: the flag is what the scaler sees."""
    amp, model = _float16(chip_device), _linear(chip_device)
    start = [p.detach().cpu().clone() for p in model.parameters()]
    scaler, optimizer = amp.grad_scaler(), torch.optim.SGD(model.parameters(), lr=0.1)
    scales = [_scaled_step(model, scaler, optimizer, amp, chip_device, *_batch(100.0, 1))]
    assert all(torch.equal(p.detach().cpu(), s) for p, s in zip(model.parameters(), start))
    scales.append(_scaled_step(model, scaler, optimizer, amp, chip_device, *_batch(1.0, 2)))
    assert scales == [2.0**15, 2.0**15]
    reference = _linear(torch.device("cpu"))
    images, targets = _batch(1.0, 2)
    torch.nn.functional.cross_entropy(reference(images), targets).backward()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.detach().cpu(), theirs.detach() - 0.1 * theirs.grad, rtol=0, atol=2e-3)


def _raise_the_flag(device: torch.device) -> None:
    """What an earlier pass may leave behind: a float16 overflow outside this step (inf on an IEEE chip,
    65504 and a raised flag on a 910A)."""
    torch.exp(torch.full((), 12.0, dtype=torch.float16, device=device))


def test_an_overflow_before_the_scaled_loss_is_not_this_steps(chip_device: torch.device) -> None:
    """torch_npu's scaler clears the flag at the first scaled loss of an update, so an overflow from before
    (an evaluation, the forward pass) does not skip a step whose gradients are sound."""
    amp, model = _float16(chip_device), _linear(chip_device)
    scaler, optimizer = amp.grad_scaler(), torch.optim.SGD(model.parameters(), lr=0.1)
    _raise_the_flag(chip_device)
    assert _scaled_step(model, scaler, optimizer, amp, chip_device, *_batch(1.0, 2)) == 2.0**16


class WithoutTheClear(FlagGradScaler):
    """Planted: the clear before scaling removed."""

    def scale(self, outputs):
        return torch.amp.GradScaler.scale(self, outputs)


@pytest.mark.npu_only(reason="the planted fault shows on a saturating chip only (the emulated 910A)")
def test_without_the_clear_a_stale_flag_skips_a_sound_step() -> None:
    """The check above can fail: the same step through a scaler that does not clear is skipped on a 910A."""
    from tests.conftest import load_emulated_npu

    load_emulated_npu()
    from tests.emulated_npu.chips import posing_as

    device = torch.device("npu:0")
    with posing_as("910A"):
        amp, model = _float16(device), _linear(device)
        scaler, optimizer = WithoutTheClear("npu"), torch.optim.SGD(model.parameters(), lr=0.1)
        _raise_the_flag(device)
        assert _scaled_step(model, scaler, optimizer, amp, device, *_batch(1.0, 2)) == 2.0**15


def test_the_flag_is_cleared_once_per_update(chip_device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two micro-batches accumulate into each update: one clear per update (the wheel's
    ``_clear_overflow_flag``), none where the chip does not saturate."""
    clears: list[torch.device] = []
    original = overflow.FloatStatusFlag.clear
    monkeypatch.setattr(overflow.FloatStatusFlag, "clear", lambda self: (clears.append(self.device), original(self)))
    amp, model = _float16(chip_device), _linear(chip_device)
    scaler, optimizer = amp.grad_scaler(), torch.optim.SGD(model.parameters(), lr=0.1)
    for update in range(2):
        for micro in range(2):
            images, targets = _batch(1.0, 10 * update + micro)
            with amp.autocast():
                loss = torch.nn.functional.cross_entropy(model(images.to(chip_device)), targets.to(chip_device))
            scaler.scale(loss / 2).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    assert clears == ([chip_device] * 2 if amp.overflow.saturates else [])


RANKS_AGREE = textwrap.dedent(
    """
    import os
    import sys
    import torch
    import torch.distributed as dist
    from vtools.runtime.amp import resolve_amp
    from vtools.runtime.device import dist_backend, resolve_device

    device = resolve_device(sys.argv[1], sys.argv[3:])  # TYPE [--device-modules MODULE]
    dist.init_process_group(dist_backend(device), device_id=None if device.type == "cpu" else device)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 3).to(device))
    amp = resolve_amp(device, True, "float16")
    scaler, optimizer = amp.grad_scaler(), torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(4, 6, generator=generator) * (100.0 if rank == 0 else 1.0)  # only rank 0 overflows
    targets = torch.randint(0, 3, (4,), generator=generator)
    with amp.autocast():
        loss = torch.nn.functional.cross_entropy(model(images.to(device)), targets.to(device))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    total = sum(float(p.detach().cpu().double().sum()) for p in model.parameters())
    os.write(1, f"rank {rank} scale {scaler.get_scale()} weights {total:.9f}\\n".encode())  # one write: lines whole
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.mark.parametrize("device_type", CHIP_DEVICES)
def test_under_torchrun_one_ranks_overflow_skips_every_ranks_step(device_type: str, tmp_path: Path) -> None:
    """Rank 0's batch overflows, rank 1's does not. On an IEEE chip the inf reaches rank 1 through DDP's
    gradient sum; on a 910A the saturated gradients sum to finite values and rank 1's flag stays down, so the
    scaler's own agreement is what keeps the ranks from parting (one stepping, the other not)."""
    script = tmp_path / "ranks_agree.py"
    script.write_text(RANKS_AGREE, encoding="utf-8")
    flags = chip_device_flags(device_type)[1:]
    proc = run_script(torchrun([str(script), *flags]), env=chip_environment(device_type), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 2, proc.stdout
    assert [line.split(" ", 2)[2] for line in lines] == [lines[0].split(" ", 2)[2]] * 2  # same scale and weights
    assert " scale 32768.0 " in lines[0]

"""A model's speed on a device, as timm's benchmark.py measures it, timed by the device's own clock.

timm's benchmark.py waits for the device only when the device name contains 'cuda'; on an NPU or an XPU
it times kernel launches, not kernels, and reports speeds the chip cannot reach. Here every timed step
ends with the device layer's ``synchronize``, which knows each device type, and peak memory comes from
the same layer. The rest is timm's: synthetic batches of the model's input size, warm-up steps left out
of the timing, samples per second over the whole timed run and mean milliseconds per step, the training
step of timm's benchmark (forward, cross-entropy, backward, optimizer step), and parameters and GMACs
counted by deepspeed's or fvcore's counter where one is installed.
"""

from __future__ import annotations

import difflib
import importlib.util
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from vtools.errors import UsageError
from vtools.evaluation.batch_retry import with_smaller_batches
from vtools.models.create import create_model
from vtools.options.benchmark import BENCH_MODES, PRECISIONS
from vtools.runtime.compiler import compile_for
from vtools.runtime.device import peak_memory_bytes, reset_peak_memory, synchronize


@dataclass(frozen=True)
class SpeedOptions:
    """What timm's benchmark.py measures and how; field names are its flags' dests."""

    bench: str
    detail: bool  # train: forward, backward and optimizer times apart
    no_retry: bool  # out of memory: no smaller batch
    num_warm_iter: int
    num_bench_iter: int
    batch_size: int
    img_size: int | None
    input_size: list[int] | None
    use_train_size: bool
    num_classes: int | None
    gp: str | None
    channels_last: bool
    grad_checkpointing: bool
    precision: str
    reparam: bool
    model_kwargs: dict[str, Any]
    torchcompile: str | None
    torchcompile_mode: str | None
    opt: str
    opt_eps: float | None
    opt_betas: list[float] | None
    momentum: float
    weight_decay: float
    clip_grad: float | None
    clip_mode: str
    smoothing: float
    drop: float
    drop_path: float | None
    drop_block: float | None


@dataclass(frozen=True)
class Precision:
    """timm's resolve_precision: the autocast dtype (None: none), and the weights' and batches' dtype."""

    autocast: torch.dtype | None
    weights: torch.dtype

    @classmethod
    def named(cls, name: str) -> Precision:
        if name not in PRECISIONS:
            raise UsageError(f"--precision {name!r}: choose one of {', '.join(PRECISIONS)}")
        autocast = {"amp": torch.float16, "amp_bfloat16": torch.bfloat16}.get(name)
        weights = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(name, torch.float32)
        return cls(autocast, weights)

    def context(self, device: torch.device) -> Any:
        if self.autocast is None:
            return nullcontext()
        return torch.autocast(device.type, dtype=self.autocast)


class Setup:
    """One model on one device at one batch size, with its synthetic batch: what a timed run needs."""

    def __init__(self, name: str, options: SpeedOptions, device: torch.device, batch_size: int, train: bool):
        from timm.data import resolve_data_config
        from timm.utils.model import reparameterize_model

        self.device, self.options, self.batch_size = device, options, batch_size
        self.precision = Precision.named(options.precision)
        kwargs = {"global_pool": options.gp, "drop_rate": options.drop, "drop_path_rate": options.drop_path}
        kwargs["drop_block_rate"] = options.drop_block
        model = create_model(name, num_classes=options.num_classes, model_kwargs=options.model_kwargs, **kwargs)
        if options.reparam:
            model = reparameterize_model(model)
        layout = torch.channels_last if options.channels_last else torch.contiguous_format
        self.model = model.to(device=device, dtype=self.precision.weights, memory_format=layout)
        self.param_count = sum(p.numel() for p in self.model.parameters())
        overrides = {"img_size": options.img_size, "input_size": options.input_size}
        config = resolve_data_config(overrides, model=self.model, use_test_size=not options.use_train_size)
        self.input_size = tuple(config["input_size"])
        if train and options.grad_checkpointing:
            self.model.set_grad_checkpointing()
        self.model.train(train)
        self.timed_model = self.model
        if options.torchcompile:
            self.timed_model = compile_for(device, self.model, options.torchcompile, options.torchcompile_mode)
        batch = torch.randn((batch_size, *self.input_size), device=device, dtype=self.precision.weights)
        self.batch = batch.contiguous(memory_format=layout)

    def clock(self, wait: bool = True) -> float:
        """Now, after the device has run everything queued (``wait``): the end of a timed stretch."""
        if wait:
            synchronize(self.device)
        return time.perf_counter()


def _timed(setup: Setup, step: Callable[[], tuple[float, ...]]) -> tuple[list[tuple[float, ...]], float, int | None]:
    """Run ``step`` for the warm-up then the timed iterations; each returns its parts' seconds. Returns the
    parts of every timed step, the seconds of the whole timed run, and the peak device memory."""
    for _ in range(setup.options.num_warm_iter):
        step()
    reset_peak_memory(setup.device)
    started = setup.clock()
    parts = [step() for _ in range(setup.options.num_bench_iter)]
    elapsed = setup.clock() - started
    return parts, elapsed, peak_memory_bytes(setup.device)


def _row(setup: Setup, steps: int, step_seconds: float, elapsed: float, peak: int | None) -> dict[str, Any]:
    """timm's result columns of one benchmark, with the peak device memory added."""
    return {
        "samples_per_sec": round(setup.batch_size * steps / elapsed, 2),
        "step_time": round(1000 * step_seconds / steps, 3),
        "batch_size": setup.batch_size,
        "img_size": setup.input_size[-1],
        "param_count": round(setup.param_count / 1e6, 2),
        "peak_mem_mb": round(peak / 2**20, 1) if peak is not None else None,
    }


def run_inference(setup: Setup) -> dict[str, Any]:
    """timm's inference benchmark: forward passes under inference mode, each timed to its end on the device."""

    def step() -> tuple[float, ...]:
        begun = setup.clock(wait=False)
        with setup.precision.context(setup.device):
            setup.timed_model(setup.batch)
        return (setup.clock() - begun,)

    with torch.inference_mode():
        parts, elapsed, peak = _timed(setup, step)
    row = _row(setup, len(parts), sum(p[0] for p in parts), elapsed, peak)
    return {**row, **count_macs(setup)}


def run_train(setup: Setup) -> dict[str, Any]:
    """timm's training benchmark: forward, cross-entropy on random targets, backward, optimizer step; with
    ``detail`` the three parts timed apart (the device waited for between them)."""
    from timm.optim import create_optimizer_v2
    from timm.utils import dispatch_clip_grad

    options = setup.options
    extra = {"eps": options.opt_eps, "betas": options.opt_betas}
    optimizer = create_optimizer_v2(
        setup.model,
        opt=options.opt,
        lr=1e-4,  # timm's benchmark lr: the speed does not depend on it
        weight_decay=options.weight_decay,
        momentum=options.momentum,
        **{key: value for key, value in extra.items() if value is not None},
    )
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=options.smoothing)
    classes = setup.model.num_classes

    def step() -> tuple[float, ...]:
        optimizer.zero_grad(set_to_none=True)
        begun = setup.clock(wait=False)
        with setup.precision.context(setup.device):
            output = setup.timed_model(setup.batch)
            output = output[0] if isinstance(output, tuple) else output
            forward_end = setup.clock(wait=options.detail)
            target = torch.randint(0, classes, (output.shape[0],), device=setup.device)
            loss_fn(output.float(), target).backward()
        backward_end = setup.clock(wait=options.detail)
        if options.clip_grad is not None:
            dispatch_clip_grad(setup.model.parameters(), options.clip_grad, mode=options.clip_mode)
        optimizer.step()
        end = setup.clock()
        return (forward_end - begun, backward_end - forward_end, end - backward_end)

    parts, elapsed, peak = _timed(setup, step)
    row = _row(setup, len(parts), sum(sum(p) for p in parts), elapsed, peak)
    if options.detail:
        for name, index in (("fwd_time", 0), ("bwd_time", 1), ("opt_time", 2)):
            row[name] = round(1000 * sum(p[index] for p in parts) / len(parts), 3)
    return row


def run_profile(setup: Setup) -> dict[str, Any]:
    """timm's profile mode: GMACs and activations at batch size 1, no timing."""
    counted = count_macs(setup, required=True)
    size = {"batch_size": setup.batch_size, "img_size": setup.input_size[-1]}
    return {**counted, **size, "param_count": round(setup.param_count / 1e6, 2)}


def macs_counter(bench: str = "") -> str | None:
    """The GMACs counter timm would use: the one ``bench`` names (profile_deepspeed, profile_fvcore), else
    deepspeed, else fvcore, where installed; None when neither is."""
    wanted = [name for name in ("deepspeed", "fvcore") if name in bench] or ["deepspeed", "fvcore"]
    return next((name for name in wanted if importlib.util.find_spec(name) is not None), None)


def count_macs(setup: Setup, required: bool = False) -> dict[str, Any]:
    """GMACs (and fvcore's activations, in millions) of one forward pass at batch size 1, as timm counts
    them; nothing when no counter is installed (``required``: say so as an error) or the model is compiled."""
    counter = macs_counter(setup.options.bench)
    if counter is None:
        if required:
            raise UsageError(f"--bench {setup.options.bench} counts MACs with deepspeed or fvcore: pip install fvcore")
        return {}
    if setup.options.torchcompile:
        return {}
    example = torch.ones((1, *setup.input_size), device=setup.device, dtype=setup.precision.weights)
    if counter == "deepspeed":
        from deepspeed.profiling.flops_profiler import get_model_profile

        _, macs, _ = get_model_profile(
            model=setup.model, input_shape=tuple(example.shape), print_profile=False, as_string=False
        )
        return {"gmacs": round(macs / 1e9, 2)}
    from fvcore.nn import ActivationCountAnalysis, FlopCountAnalysis

    flops = FlopCountAnalysis(setup.model, example).unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    activations = ActivationCountAnalysis(setup.model, example).unsupported_ops_warnings(False)
    return {"gmacs": round(flops.total() / 1e9, 2), "macts": round(activations.total() / 1e6, 2)}


def check_optimizer(name: str) -> None:
    """Refuse an --opt that timm's optimizer factory would not find, naming it whole: the factory keeps only
    the text after the last underscore (an optional ``lookahead_`` before it) and so reports ``nonexistent_opt``
    as ``Optimizer opt not found``, and every model of a list as a failed row."""
    from timm.optim import list_optimizers

    known = list_optimizers()
    parts = name.lower().split("_")
    wrapper_ok = len(parts) == 1 or (len(parts) == 2 and parts[0] == "lookahead")
    if wrapper_ok and parts[-1] in known:
        return
    close = difflib.get_close_matches(name.lower(), known, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise UsageError(f"--opt {name}: not an optimizer timm knows ({hint}timm.optim.list_optimizers() names them)")


RUNNERS: dict[str, tuple[tuple[str, Callable[[Setup], dict[str, Any]], bool], ...]] = {
    "inference": (("infer", run_inference, False),),
    "train": (("train", run_train, True),),
    "both": (("infer", run_inference, False), ("train", run_train, True)),
    **{mode: (("infer", run_profile, False),) for mode in BENCH_MODES if mode.startswith("profile")},
}


def benchmark_model(
    name: str, options: SpeedOptions, device: torch.device, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """One model's row: each benchmark of ``options.bench`` with its columns prefixed (infer_, train_), the
    parameter count once; a benchmark that fails ends the row with its error, as in timm."""
    row: dict[str, Any] = {"model": name}
    for prefix, runner, train in RUNNERS[options.bench]:
        first_batch = 1 if runner is run_profile else options.batch_size

        def attempt(batch_size: int, runner: Callable[[Setup], dict[str, Any]] = runner, train: bool = train) -> dict:
            return runner(Setup(name, options, device, batch_size, train))

        try:
            found = with_smaller_batches(attempt, first_batch, not options.no_retry, f"{name} ({prefix})", say)
        except Exception as err:  # noqa: BLE001 - a model that fails is a row saying why, never the list's end
            said = str(err).splitlines()[0] if str(err) else ""
            return {**row, "error": f"{type(err).__name__}: {said}" if said else type(err).__name__}
        params = found.pop("param_count")
        row.update({f"{prefix}_{key}": value for key, value in found.items()})
    return {**row, "param_count": params}

"""``python -m vtools parity MODEL --device npu --against cpu``: does a device compute what another does?

Its two modes, its options and what ``--help`` says of it: vtools/cli/parity_flags.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from vtools.cli.parser import check_values
from vtools.cli.typed import typed_options
from vtools.data.readers.folder import find_images
from vtools.data.transforms import data_config_for
from vtools.deploy.export import check_images
from vtools.derived_options import model_in_chans, preprocess_overrides, timm_model_kwargs
from vtools.errors import RunFailed, UsageError
from vtools.models.create import create_model, model_files
from vtools.observe import parity
from vtools.options.declare import ParsedOptions
from vtools.options.train_job import TrainJob
from vtools.outputs import Output, check_outputs
from vtools.results import write_rows
from vtools.runtime.amp import resolve_amp
from vtools.runtime.device import resolve_device, seed_everything
from vtools.runtime.distributed import refuse_torchrun
from vtools.runtime.options import RuntimeOptions
from vtools.runtime.resolve import setup_runtime
from vtools.train import parity_recipe


def check_args(args: ParsedOptions) -> str:
    """The command line's one-line refusals, before any model is built; the model to compare (MODEL or
    --model)."""
    check_values(args)
    if args.model_name and args.model and args.model_name != args.model:
        raise UsageError(f"two models given: {args.model_name} and --model {args.model}")
    model_name = args.model_name or args.model
    if not model_name:
        raise UsageError("give the model: MODEL (a timm name, hf-hub:..., or a model folder)")
    refused = {
        "--torchcompile": args.torchcompile,
        "--model-dtype": args.model_dtype,
        "--profile": args.profile,
    }
    for flag, value in refused.items():
        if value:
            raise UsageError(f"{flag}: parity compares eager fp32 (or --amp) layer by layer; run it without {flag}")
    if args.data:
        find_images(args.data)  # a bad --data fails before any model is built
    if args.results_file:
        inputs = [*model_files(model_name), ("--checkpoint", args.checkpoint), ("--data", args.data)]
        check_outputs(inputs, [Output("--results-file", Path(args.results_file))])
    return model_name


def run(args: ParsedOptions) -> int:
    """Compare the model on two devices, or (``--train``) train.py's own step (vtools/cli/parity_flags.py)."""
    if args.train_job is not None:
        return run_train(args, args.train_job)
    refuse_torchrun("python -m vtools parity")
    model_name = check_args(args)
    runtime = setup_runtime(typed_options(RuntimeOptions, args))  # --device, its AMP policy, the cpu budget
    reference = resolve_device(args.against, args.device_modules or (), flag="--against")
    reference_amp = resolve_amp(reference, False)
    tols = parity.default_tolerances(runtime.amp.dtype_name, args.tol, args.grad_tol)
    # both sides at full fp32 where torch's generic switch reaches (it undoes TF32 matmuls on CUDA)
    torch.set_float32_matmul_precision("highest")
    seed_everything(args.seed)
    model = create_model(
        model_name,
        pretrained=args.pretrained,
        num_classes=args.num_classes,
        in_chans=model_in_chans(args),
        model_kwargs=timm_model_kwargs(args),
        checkpoint=args.checkpoint or None,
        use_ema=args.use_ema,
    )
    data_config = data_config_for(model, preprocess_overrides(args))
    images, targets, batch_words = parity_batch(args, data_config)
    layout = ", channels_last" if args.channels_last else ""
    print(
        f"parity: {model_name} on {runtime.device} ({runtime.amp.dtype_name}{layout}) against {reference} (float32), "
        f"{batch_words} at {tuple(data_config['input_size'])}, {args.steps} step(s); tolerance "
        f"{tols['forward']:g} (activations), {tols['backward']:g} (gradients)",
        flush=True,
    )
    sides = ((reference, reference_amp, False), (runtime.device, runtime.amp, bool(args.channels_last)))
    traces = [trace_on(side, model, images, targets, args) for side in sides]
    entries = parity.compare(traces[0], traces[1], tols)
    return finish(entries, parity.verdict(entries, args.steps), args, runtime.device, reference)


def parity_batch(args: ParsedOptions, data_config: dict) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The images both devices see (--data's, or a seeded random batch), seeded targets, and the words
    that name the batch on the first line."""
    if args.data:
        images = check_images(args.data, data_config, args.batch_size)
        words = f"{len(images)} images from {args.data}"
    else:
        generator = torch.Generator().manual_seed(args.seed)
        images = torch.randn((args.batch_size, *data_config["input_size"]), generator=generator)
        words = f"a random batch of {len(images)}"
    targets = torch.randint(0, 1 << 30, (len(images),), generator=torch.Generator().manual_seed(args.seed + 1))
    return images, targets, words


def trace_on(
    side: tuple, model: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor, args: ParsedOptions
) -> object:
    """One device's trace; a model that fails there is a one-line run failure naming the device."""
    device, amp, channels_last = side
    try:
        return parity.run_side(
            model, images, targets, device, amp, args.steps, args.lr, channels_last=channels_last, seed=args.seed
        )
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RunFailed(f"the model failed on {device}: {first}") from None


def run_train(own: ParsedOptions, job: TrainJob) -> int:
    """--train: train.py's own step on both devices (vtools/train/parity_recipe.py)."""
    refuse_torchrun("python -m vtools parity --train")
    refused = {"--torchcompile": job.model.torchcompile, "--model-dtype": job.runtime.model_dtype}
    refused["--resume"] = job.run.resume
    for flag, value in refused.items():
        if value:
            raise UsageError(f"{flag}: parity --train compares eager steps from the start; run it without {flag}")
    if own.results_file:
        check_outputs(training_inputs(job, job.run.config), [Output("--results-file", Path(own.results_file))])
    runtime = setup_runtime(job.runtime)
    reference = resolve_device(own.against, job.runtime.device_modules or (), flag="--against")
    tols = parity.default_tolerances(runtime.amp.dtype_name, own.tol, own.grad_tol)
    torch.set_float32_matmul_precision("highest")  # both sides at full fp32, as the MODEL mode
    entries = parity_recipe.run(
        job, runtime.device, runtime.amp, reference, resolve_amp(reference, False), own.steps, tols
    )
    return finish(entries, parity_recipe.verdict(entries, own.steps), own, runtime.device, reference)


def training_inputs(job: TrainJob, config: str) -> list[tuple[str, str | Path | None]]:
    """What a training run's options make it read, as (what, path): where a file it writes must not go."""
    weights = job.augment.class_weights if job.augment.class_weights != "balanced" else None
    return [
        ("the data folder", job.data.data or job.data.data_dir),
        ("-c", config or None),
        ("--class-map", job.data.class_map or None),
        ("--class-weights", weights or None),
        ("--initial-checkpoint", job.model.initial_checkpoint or None),
        ("--pretrained-path", job.model.pretrained_path),
        *model_files(job.model.model),
    ]


def finish(entries: list, verdict: str, own: ParsedOptions, device: torch.device, reference: torch.device) -> int:
    """The per-layer table (with --results-file), the verdict, and exit 3 when a tensor is out of tolerance."""
    if own.results_file:
        rows = [{**entry.row(), "device": str(device), "against": str(reference)} for entry in entries]
        write_rows(own.results_file, rows, own.results_format)
        print(f"per-layer table: {own.results_file} ({len(rows)} rows)")
    print(verdict)
    sys.stdout.flush()
    if parity.first_failure(entries) is not None:
        raise RunFailed(f"{device} differs from {reference} beyond tolerance (the verdict above)")
    return 0

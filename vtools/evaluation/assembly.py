"""The model and its loader for one evaluation pass, assembled once for validate.py and inference.py.

Both scripts build the same things in timm's order: create the model (weights, EMA,
--reparam), resolve its data config, get it ready (--test-pool, --model-dtype, memory
layout, --torchcompile), then read a source into normalized batches on the device,
refused first when those batches cannot fit in the host's memory. What differs
between the scripts (which source, which outputs are scored) stays with the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vtools.data.decode import bad_image_handler
from vtools.data.loaders import DeviceLoader, eval_device_loader
from vtools.data.memory_estimate import LoaderUse, check_host_memory
from vtools.data.readers.registry import Source
from vtools.data.transforms import data_config_for, eval_transform, image_mode
from vtools.evaluation.model_flags import ReadyOptions, check_input_mode, ready_for_eval, reparameterized
from vtools.models.activation_memory import activation_bytes_per_image
from vtools.models.create import create_model
from vtools.models.prepare import count_params, use_channels_last
from vtools.runtime.resolve import Runtime


@dataclass(frozen=True)
class EvalOptions:
    """What the evaluation scripts' flags ask of the model and its loader. Field names are the flags'
    dests; the command builds it (``vtools.cli.typed.typed_options``) and passes the values it resolves
    after parsing as overrides: ``in_chans``, ``model_kwargs`` and ``use_test_size``."""

    num_classes: int | None
    in_chans: int | None  # resolved: --in-chans, else --input-size's channels, else None (the model's)
    model_kwargs: dict[str, Any]  # resolved: --model-kwargs with --gp as timm passes it
    use_ema: bool
    pretrained: bool  # --pretrained; without a checkpoint the pretrained weights are loaded anyway
    img_size: int | None
    input_size: list[int] | None
    crop_pct: float | None
    crop_mode: str | None
    mean: list[float] | None
    std: list[float] | None
    interpolation: str | None
    use_test_size: bool  # resolved: the pretrained config's test size (validate.py unless --use-train-size)
    reparam: bool  # inference.py has no --reparam: off there
    channels_last: bool | None  # None: where it is faster
    ready: ReadyOptions
    input_img_mode: str | None
    crop_border_pixels: int | None  # inference.py has no --crop-border-pixels: None there
    batch_size: int
    on_bad_image: str

    @property
    def preprocess(self) -> dict[str, Any]:
        """The preprocessing flags in the form timm's resolve_data_config reads."""
        return {key: getattr(self, key) for key in PREPROCESS_KEYS}


PREPROCESS_KEYS = ("img_size", "input_size", "in_chans", "crop_pct", "crop_mode", "mean", "std", "interpolation")


@dataclass
class EvalModel:
    """A model to evaluate and what its loader needs: its data config and memory layout."""

    module: torch.nn.Module  # after ready(): pooled, cast, laid out and compiled
    data_config: dict[str, Any]
    channels_last: bool
    param_count: int | None  # None: an ONNX file read without the onnx package
    plain: torch.nn.Module  # as created: what the activation memory is measured on

    @classmethod
    def load(cls, name: str, checkpoint: str, options: EvalOptions, runtime: Runtime) -> EvalModel:
        """Create ``name`` with ``checkpoint``'s weights (pretrained ones without a checkpoint, as timm's
        scripts), apply --reparam and resolve its data config."""
        model = create_model(
            name,
            pretrained=options.pretrained or not checkpoint,
            num_classes=options.num_classes,
            in_chans=options.in_chans,
            model_kwargs=options.model_kwargs,
            checkpoint=checkpoint or None,
            use_ema=options.use_ema,
            device=runtime.device,
        )
        if options.reparam:
            model = reparameterized(model)
        param_count = count_params(model)
        data_config = data_config_for(model, options.preprocess, use_test_size=options.use_test_size)
        channels_last = use_channels_last(options.channels_last, model, runtime.device)
        return cls(model, data_config, channels_last, param_count, model)

    def ready(self, options: EvalOptions, runtime: Runtime) -> None:
        """--test-pool (crop 1.0 in the data config then), --model-dtype, memory layout, --torchcompile."""
        self.module = ready_for_eval(
            options.ready, self.plain, self.data_config, runtime.model_dtype, self.channels_last
        )

    def loader(
        self, source: Source, options: EvalOptions, runtime: Runtime, use: str, skipped: list[str]
    ) -> DeviceLoader:
        """``source`` as normalized batches on the device, in order; unreadable images are skipped into
        ``skipped`` or stop the run (--on-bad-image). Refused first when the batches of ``use`` (its name
        in the message) cannot fit in the host's memory."""
        mode = image_mode(self.data_config, options.input_img_mode)
        check_input_mode(mode, self.data_config)
        dataset = source.images(eval_transform(self.data_config, options.crop_border_pixels), mode)
        check_host_memory(
            [LoaderUse(use, self.data_config, source.samples)],
            options.batch_size,
            runtime.device,
            runtime.budget.workers,
            lambda: activation_bytes_per_image(self.plain, self.data_config["input_size"], training=False),
        )
        return eval_device_loader(
            dataset,
            options.batch_size,
            runtime.device,
            runtime.budget.workers,
            self.data_config,
            self.channels_last,
            bad_image_handler(options.on_bad_image, skipped),
            dtype=runtime.model_dtype,
        )

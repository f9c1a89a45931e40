"""timm's auto-augment ops through vtools' registration (vtools/data/augment_ops.py): Pillow 12's posterize on
every Pillow, fills that match a grayscale image, and every op timm registers at its magnitude extremes, alone
and in whole transforms, on the installed Pillow."""

from __future__ import annotations

import json
import pickle
import random
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import auto_augment
from timm.data.auto_augment import AugmentOp, AugMixAugment, AutoAugment, augmix_ops, rand_augment_transform

from tests.conftest import REPO
from vtools.data import augment_ops

REFERENCE = json.loads((REPO / "tests/data/posterize_pillow12.json").read_text())  # tools/make_posterize_reference.py
MEAN = (124, 116, 104)  # ImageNet's mean colour, as timm's create_transform passes it (img_mean)
GREY = round(sum(MEAN) / 3)
COMMON_AA = {
    "rand-m9-mstd0.5-inc1",
    "rand-m6-mstd0.5-inc1",
    "rand-m9-mstd0.5",
    "original",
    "v0",
    "augmix-m5-w4-d2",
    "3a",
}


def config_aa_strings() -> set[str]:
    """The auto-augment strings of the shipped configs."""
    from vtools.cli.config import read_yaml

    return {read_yaml(path)["aa"] for path in (REPO / "configs").glob("*.yaml") if read_yaml(path).get("aa")}


AA_STRINGS = sorted(config_aa_strings() | COMMON_AA)


@pytest.fixture
def registered() -> None:
    augment_ops.register()


@pytest.fixture
def timm_as_shipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """timm's table with its own functions for this test, as a process that never registered has it."""
    for name, op in auto_augment.NAME_TO_OP.items():
        monkeypatch.setitem(auto_augment.NAME_TO_OP, name, getattr(op, "timm_op", op))


def timm_function(name: str) -> Callable:
    op = auto_augment.NAME_TO_OP[name]
    return getattr(op, "timm_op", op)


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_posterize_gives_pillow12s_pixels_for_every_bits_value(mode: str, registered: None) -> None:
    """Every posterize op through timm's RandAugment (one op, always applied) at magnitudes 0..20 reaches bits -4
    to 8 (more than 8 keeps the image, as in timm) and gives what Pillow 12 gave for them, on an image with all
    256 levels in each band: black for 0 bits and fewer, Pillow's own call otherwise."""
    image = Image.frombytes(mode, tuple(REFERENCE["size"]), bytes.fromhex(REFERENCE["images"][mode]))
    names = [name for name in auto_augment.NAME_TO_OP if timm_function(name) is auto_augment.posterize]
    reached = set()
    for name in names:
        for magnitude in range(21):
            bits = auto_augment.LEVEL_TO_ARG[name](magnitude, {})[0]
            out = rand_augment_transform(f"rand-m{magnitude}-n1-p1.0-mmax20", transforms=[name])(image)
            assert out.mode == mode and out.tobytes().hex() == REFERENCE["posterize"][mode][str(min(bits, 8))], (
                name,
                magnitude,
                bits,
            )
            reached.add(bits)
    assert {"Posterize", "PosterizeIncreasing", "PosterizeOriginal"} <= set(names)
    assert set(range(-4, 9)) <= reached


@pytest.mark.parametrize(
    "name", ["Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"]
)
@pytest.mark.parametrize(
    "mode, mean, fill",
    [("L", MEAN, GREY), ("RGB", MEAN, MEAN), ("L", (GREY,), GREY), ("RGB", (GREY,), (GREY,) * 3)],
    ids=["grey-image-colour-mean", "colour-image-colour-mean", "grey-image-grey-mean", "colour-image-grey-mean"],
)
def test_geometric_ops_fill_with_the_mean_in_the_images_bands(
    name: str, mode: str, mean: tuple[int, ...], fill: int | tuple[int, ...], registered: None
) -> None:
    """The uncovered pixels of a turned, sheared or shifted white image are the mean colour, in the image's
    bands: the mean's average on a grayscale image, a one-value mean in every band of a colour image."""
    white = Image.new(mode, (32, 32), "white")
    hparams = {"img_mean": mean, "translate_const": 8, "interpolation": Image.Resampling.NEAREST}
    out = AugmentOp(name, prob=1.0, magnitude=10, hparams=hparams)(white)
    assert {colour for _, colour in out.getcolors()} == {white.getpixel((0, 0)), fill}


def one_op_transforms(name: str, magnitude: int, noise: float) -> Iterator[tuple[str, Callable]]:
    """``name`` alone in each of timm's three schemes: RandAugment (always applied), an AutoAugment policy of
    one sub-policy, AugMix chains (with AugMix's translate range); magnitudes up to 30, ``noise`` its std."""
    hparams = {"img_mean": MEAN, "translate_const": 9, "magnitude_std": noise, "magnitude_max": 30}
    yield "rand", rand_augment_transform(f"rand-m{magnitude}-n1-p1.0", dict(hparams), transforms=[name])
    yield "auto", AutoAugment([[AugmentOp(name, 1.0, magnitude, hparams)]])
    yield "augmix", AugMixAugment(augmix_ops(magnitude, {**hparams, "translate_pct": 0.3}, [name]), width=2, depth=2)


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_every_op_runs_at_its_magnitude_extremes(mode: str, registered: None) -> None:
    """Every op in timm's table (a new timm op is included as it comes) in RandAugment, AutoAugment and AugMix,
    at magnitude 0, 10 and 30 (beyond timm's 10, through magnitude_max), without and with magnitude noise
    (Gaussian std 0.5, uniform): an image of the input's mode and size each time."""
    random.seed(0)
    np.random.seed(0)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 24, 3), dtype=np.uint8)).convert(mode)
    failed = []
    for name in auto_augment.NAME_TO_OP:
        for magnitude in (0, 10, 30):
            for noise in (0.0, 0.5, float("inf")):
                for scheme, transform in one_op_transforms(name, magnitude, noise):
                    for _ in range(4):  # random signs, noise and chain depths
                        try:
                            out = transform(image)
                        except Exception as err:  # noqa: BLE001 - every failing case is listed
                            failed.append(f"{scheme} {name} m{magnitude} std{noise}: {err!r}")
                            break
                        assert (out.mode, out.size) == (mode, image.size), (scheme, name)
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("channels", [3, 1], ids=["rgb", "grayscale"])
@pytest.mark.parametrize("aa", AA_STRINGS)
def test_whole_training_transforms_run(aa: str, channels: int) -> None:
    """train.py's training transform (build_train_transform) with each config's and each common auto-augment
    string, on colour and grayscale (--in-chans 1) input: 3000 images (the DeiT string reaches the posterize
    edge in 2 to 5 of them), each a uint8 tensor of the model's shape. The builder registers the ops itself
    (this test asks for no fixture that does)."""
    from vtools.cli.train_flags import build_parser
    from vtools.cli.typed import typed_options
    from vtools.options.train_job import TrainJob
    from vtools.train.recipe import build_train_transform

    args = build_parser().parse_args(["--aa", aa])
    mean = (0.485, 0.456, 0.406) if channels == 3 else (0.449,)
    transform = build_train_transform(
        typed_options(TrainJob, args).augment,
        {"input_size": (channels, 32, 32), "mean": mean, "std": (0.25,) * channels},
    )
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 48, 3), dtype=np.uint8))
    image = image.convert("L" if channels == 1 else "RGB")
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    for _ in range(3000):
        out = transform(image)
        assert out.dtype == torch.uint8 and tuple(out.shape) == (channels, 32, 32)


def test_building_the_training_transform_registers_the_ops(timm_as_shipped: None) -> None:
    """In a process that never registered, build_train_transform puts the wrapped ops in timm's table before
    it builds (each op keeps the function it found), and the transform pickles, for spawned workers."""
    from vtools.cli.train_flags import build_parser
    from vtools.cli.typed import typed_options
    from vtools.options.train_job import TrainJob
    from vtools.train.recipe import build_train_transform

    assert not isinstance(auto_augment.NAME_TO_OP["PosterizeIncreasing"], augment_ops.FillMatched)
    args = build_parser().parse_args(["--aa", "rand-m9-mstd0.5-inc1"])
    transform = build_train_transform(
        typed_options(TrainJob, args).augment, {"input_size": (3, 32, 32), "mean": (0.5,) * 3, "std": (0.5,) * 3}
    )
    copy = pickle.loads(pickle.dumps(transform))
    (rand_augment,) = [t for t in copy.transforms if isinstance(t, auto_augment.RandAugment)]
    assert all(isinstance(op.aug_fn, augment_ops.FillMatched) for op in rand_augment.ops)
    (posterize,) = [op for op in rand_augment.ops if op.name == "PosterizeIncreasing"]
    posterize.prob, posterize.magnitude_std, posterize.magnitude = 1.0, 0, 10
    assert posterize(Image.new("RGB", (8, 8), "white")).getcolors() == [(64, (0, 0, 0))]
    augment_ops.register()
    assert auto_augment.NAME_TO_OP["Rotate"].timm_op is auto_augment.rotate, "registering twice wraps once"


def test_every_builder_of_an_auto_augment_transform_registers_first() -> None:
    """A module of vtools that hands timm an auto-augment string calls the registration (today only the
    training recipe does; the bench's transforms have no auto-augment)."""
    builders = [
        p for p in (REPO / "vtools").rglob("*.py") if "auto_augment" in p.read_text() and p.name != "augment_ops.py"
    ]
    assert [p.name for p in builders] == ["recipe.py"]
    assert all("augment_ops.register()" in p.read_text() for p in builders)

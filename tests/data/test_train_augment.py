"""The fused training augmentation against timm's own transform: the same draws, the same pixels where the
image is decoded in full, reduced-scale decoding only where the crop covers the output."""

from __future__ import annotations

import io
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance
from timm.data import create_transform

from vtools.data import color_jitter
from vtools.data.loaders import DeviceLoader, collate
from vtools.data.train_augment import FusedTrainAugment, fuse

REPO = Path(__file__).resolve().parents[2]
SNEAKER = sorted((REPO / "data/fashion-mnist-mini/train/sneaker").glob("*.png"))[0]


def timm_train(size: int, **overrides: object) -> object:
    """timm's training transform with timm train.py's default augmentation."""
    options = {"scale": (0.08, 1.0), "hflip": 0.5, "color_jitter": 0.4, "interpolation": "random"}
    options.update(overrides)
    return create_transform(size, is_training=True, use_prefetcher=True, **options)


def seeded(seed: int, make: object) -> object:
    random.seed(seed)
    torch.manual_seed(seed)
    return make()


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth colour photo-like image (random noise would make every resize a different image)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    return Image.fromarray(small).resize((width, height), Image.BICUBIC)


def jpeg_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def on_device(items: list[object], device: torch.device) -> torch.Tensor:
    """Collate the items and finish the batch as training does, in 0..255 (mean 0, std 1/255)."""
    batch = collate([(item, 0, k) for k, item in enumerate(items)])
    loader = DeviceLoader([batch], device, (0.0,) * 3, (1 / 255,) * 3)
    return next(iter(loader)).images.cpu().round()


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize(("size", "on_host"), [(24, False), (24, True), (96, True)])
def test_same_pixels_as_timm_for_the_same_seeds(device: torch.device, mode: str, size: int, on_host: bool) -> None:
    """Crop box, interpolation, flips and colour jitter drawn and applied as timm does: equal uint8 images,
    for a grayscale photo read as RGB (one channel until the batch) and for a colour one; with the jitter
    on the device (accelerators; small images on a host device) and in the worker (large ones there)."""
    images = {"RGB": photo(161, 127), "L": Image.open(SNEAKER)}
    image = images[mode]
    reference = timm_train(size)
    fused = fuse(reference, "RGB", computes_on_host=on_host)
    assert isinstance(fused, FusedTrainAugment)
    assert fused.device_jitter == (not on_host or size <= 64), "the measured rule: above 64 px on a host device"
    seeds = range(16)
    ours = on_device([seeded(seed, lambda: fused(image)) for seed in seeds], device)
    theirs = torch.stack([seeded(seed, lambda: reference(image.convert("RGB"))) for seed in seeds]).float()
    assert ours.shape == theirs.shape == (16, 3, size, size)
    assert torch.equal(ours, theirs)


def test_channel_order_and_flips_survive_the_batch_copy() -> None:
    """A planted-bug guard for the copy: an asymmetric colour image, flipped or not, keeps its channels and
    its left-right order (jitter off, so the comparison is of the copy alone)."""
    image = photo(40, 30, seed=3)
    reference = timm_train(16, color_jitter=None, hflip=0.5, vflip=0.5)
    fused = fuse(reference, "RGB")
    assert fused is not None and fused.jitter is None and len(fused.flips) == 2
    seeds = range(16)
    ours = on_device([seeded(seed, lambda: fused(image)) for seed in seeds], torch.device("cpu"))
    theirs = torch.stack([seeded(seed, lambda: reference(image)) for seed in seeds]).float()
    assert torch.equal(ours, theirs)


def test_reduced_decoding_keeps_timms_draws_and_happens_only_when_the_crop_covers_the_output() -> None:
    """From a large JPEG: the crop boxes and flips are timm's for the same seeds whether or not the decoder
    scaled down, the scale never leaves the crop smaller than the output, scaled decodes do happen, and
    their images stay close to a full decode of the same crop."""
    source = jpeg_bytes(photo(1024, 768, seed=5))
    full = Image.open(io.BytesIO(source)).convert("RGB")
    reference = timm_train(64, color_jitter=None)
    fused = fuse(reference, "RGB")
    crop = reference.transforms[0]
    differences = []
    for seed in range(120):
        box = seeded(seed, lambda: crop.get_params(full, crop.scale, crop.ratio))
        _, _, height, width = box
        reduction = fused.reduction(box)
        assert height / reduction >= 64 and width / reduction >= 64, (box, reduction)
        scaled = seeded(seed, lambda: fused.from_source(source, "photo"))
        exact = seeded(seed, lambda: fused(full))
        assert (scaled.hflip, scaled.vflip) == (exact.hflip, exact.vflip)
        if reduction == 1:
            assert np.array_equal(scaled.pixels, exact.pixels), seed
        else:
            differences.append(np.abs(scaled.pixels.astype(int) - exact.pixels.astype(int)).mean())
    assert fused.reduced_decodes == len(differences) >= 20
    assert max(differences) < 4.0, max(differences)


def test_the_draws_are_timms_over_many_seeds() -> None:
    """Scale, aspect ratio and flip rate of the fused draws equal timm's draw by draw (the same calls on the
    same generators), so their distributions are timm's."""
    image = photo(500, 375)
    reference = timm_train(224)
    fused = fuse(reference, "RGB")
    crop = reference.transforms[0]
    for seed in range(400):
        ours = seeded(seed, lambda: fused._draw(image))
        random.seed(seed)
        torch.manual_seed(seed)
        box = crop.get_params(image, crop.scale, crop.ratio)
        interpolation = random.choice(crop.interpolation)
        flip = bool(torch.rand(1) < 0.5)
        jitter = color_jitter.draw_params(reference.transforms[2])
        assert ours[0] == box and ours[1] == interpolation and ours[3] == [flip]
        assert np.array_equal(ours[4], jitter)


@pytest.mark.parametrize(
    "overrides",
    [
        {"auto_augment": "rand-m9-mstd0.5"},
        {"gaussian_blur_prob": 0.1},
        {"grayscale_prob": 0.1},
        {"color_jitter": (0.4, 0.4, 0.4, 0.1)},
        {"color_jitter_prob": 0.5},
        {"train_crop_mode": "rkrr"},
    ],
)
def test_other_recipes_keep_timms_transform(overrides: dict) -> None:
    assert fuse(timm_train(32, **overrides), "RGB") is None
    assert fuse(timm_train(32), "RGBA") is None


def test_jitter_groups_images_by_their_order(device: torch.device) -> None:
    """Images with different step orders in one batch each get their own order (against PIL image by
    image), including one with no jitter at all."""
    from torchvision.transforms import ColorJitter

    jitter = ColorJitter(0.4, 0.4, 0.4)
    images = [photo(20, 20, seed=seed) for seed in range(12)]
    params = [seeded(seed, lambda: color_jitter.draw_params(jitter)) for seed in range(12)]
    params[5][4:] = np.nan  # no step at all for this one
    batch = torch.stack([torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1) for im in images]).float()
    out = color_jitter.apply(batch.to(device), torch.from_numpy(np.stack(params))).cpu()
    for k, image in enumerate(images):
        expected = image if k == 5 else seeded(k, lambda: jitter(image))  # noqa: B023
        assert torch.equal(out[k], torch.from_numpy(np.asarray(expected).copy()).permute(2, 0, 1).float()), k


class HostCopies(torch.utils._python_dispatch.TorchDispatchMode):
    """Every copy from host memory to a device: (whether its source is pinned, whether it is asynchronous)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[tuple[bool, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args[0].device.type == "cpu":
            target = kwargs.get("device")
            if target is not None and torch.device(target).type != "cpu":
                self.copies.append((args[0].is_pinned(), bool(kwargs.get("non_blocking", False))))
        return func(*args, **kwargs)


def test_jitter_copies_asynchronously_only_from_pinned_memory(device: torch.device) -> None:
    """Its per-image factors and group indices are host tensors: a copy that does not wait must come from pinned
    memory (from pageable memory the backend may read it after it is freed), and on a device that pins its
    batches, it does."""
    from torchvision.transforms import ColorJitter

    jitter = ColorJitter(0.4, 0.4, 0.4)
    params = torch.from_numpy(np.stack([seeded(seed, lambda: color_jitter.draw_params(jitter)) for seed in range(6)]))
    batch = torch.rand(6, 3, 8, 8, device=device) * 255
    with HostCopies() as watch:
        color_jitter.apply(batch, params)
    assert all(pinned for pinned, asynchronous in watch.copies if asynchronous), watch.copies
    if device.type != "cpu":
        assert len(watch.copies) >= 2 and all(asynchronous for _, asynchronous in watch.copies), watch.copies


def _jittered(image: Image.Image, device: torch.device, step: int, factor: float) -> Image.Image:
    """``image`` through color_jitter.apply with one step (``step``: contrast or saturation) at ``factor``."""
    order = [step, *(other for other in range(4) if other != step)]
    params = torch.tensor([[*order, math.nan, math.nan, math.nan]], dtype=torch.float32)
    params[0, 4 + step] = factor
    batch = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)[None].float()
    out = color_jitter.apply(batch.to(device), params).cpu()[0]
    return Image.fromarray(out.permute(1, 2, 0).to(torch.uint8).numpy())


def test_saturation_grays_each_colour_as_pil_rounds_it(device: torch.device) -> None:
    """PIL's luma rounds (19595 R + 38470 G + 7471 B + 32768) >> 16: the colours whose sum lands one below a
    rounding edge are where another rounding would differ (all 247 of them)."""
    values = np.arange(256, dtype=np.int64)
    red, green, blue = np.meshgrid(values, values, values, indexing="ij")
    edge = (red * 19595 + green * 38470 + blue * 7471) % 65536 == 32767
    pixels = np.stack([red[edge], green[edge], blue[edge]], axis=-1).astype(np.uint8)[None]
    image = Image.fromarray(pixels, "RGB")
    assert np.array_equal(
        np.asarray(_jittered(image, device, color_jitter.SATURATION, 0.0)),
        np.asarray(ImageEnhance.Color(image).enhance(0.0)),
    )


def test_contrast_on_a_large_image_takes_pils_integer_mean(device: torch.device) -> None:
    """720 x 500 gray pixels sum to 36 179 999, beyond float32's exact integers: PIL's mean is 100.4999..,
    rounded to 100; a float sum rounds it to 100.5 and the image to 101."""
    gray = np.full(720 * 500, 100, dtype=np.uint8)
    gray[:179_999] = 101
    image = Image.fromarray(np.repeat(gray.reshape(500, 720, 1), 3, axis=2), "RGB")
    jittered = np.asarray(_jittered(image, device, color_jitter.CONTRAST, 0.0))
    assert np.array_equal(jittered, np.asarray(ImageEnhance.Contrast(image).enhance(0.0)))
    assert (jittered == 100).all()


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_a_grayscale_file_stays_one_channel_until_the_batch(device: torch.device, mode: str) -> None:
    """A grayscale JPEG read for an RGB model is cropped, resized and kept (decoded in full for a kept set)
    in one channel, a third of the work; the batch has timm's three equal channels. An L model reads L."""
    gray = jpeg_bytes(Image.open(SNEAKER).convert("L"))
    fused = fuse(timm_train(24), mode, computes_on_host=False)
    assert fused.decode(gray, "sneaker.jpg").mode == "L"
    augmented = seeded(3, lambda: fused.from_source(gray, "sneaker.jpg"))
    assert augmented.pixels.shape == (24, 24, 1)
    if mode == "RGB":
        theirs = seeded(3, lambda: timm_train(24)(Image.open(io.BytesIO(gray)).convert("RGB")))
        assert torch.equal(on_device([augmented], device)[0], theirs.float())


def test_an_image_of_another_mode_is_converted_and_gray_stays_one_channel(device: torch.device) -> None:
    """A kept image is augmented as decoded: RGBA (a PNG with transparency) becomes RGB as timm's loader
    makes it; a grayscale one stays in one channel until the batch."""
    fused = fuse(timm_train(24), "RGB", computes_on_host=False)
    rgba = photo(40, 30).convert("RGBA")
    ours = on_device([seeded(5, lambda: fused(rgba))], device)[0]
    assert torch.equal(ours, seeded(5, lambda: timm_train(24)(rgba.convert("RGB"))).float())
    assert seeded(5, lambda: fused(photo(40, 30).convert("L"))).pixels.shape == (24, 24, 1)

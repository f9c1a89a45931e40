"""train.py's timm flags against timm's own objects: repeated augmentation, distillation, BatchNorm
sharing, AGC clipping, dropout, no-aug, the loss choice, pretrained files, start epochs.

Each test compares with what timm's train.py builds from the same flags (its sampler, task, loss,
transform or model factory), never with a value this project computed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import timm
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from timm.data import create_transform, resolve_data_config
from timm.data.distributed_sampler import RepeatAugSampler
from timm.loss import BinaryCrossEntropy, LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.task import ClassificationTask, LogitDistillationTask

from tests.conftest import (
    DEVICE_TYPES,
    assert_same_weights,
    device_flags,
    free_port,
    run_script,
    summary,
    train_args,
    weights,
    write_model_folder,
)
from vtools.cli.train_flags import build_parser
from vtools.cli.typed import typed_options
from vtools.data.sampling import EpochSampler, sample_seed
from vtools.errors import UsageError
from vtools.options.train_job import TrainJob
from vtools.runtime.distributed import DistInfo
from vtools.train import recipe
from vtools.train.assemble import build_distillation, build_model
from vtools.train.loop import TrainComponents


def train_flags(*argv: str) -> TrainJob:
    """The typed job train.py's edge builds from these flags."""
    return typed_options(TrainJob, build_parser().parse_args(["--data-dir", "unused", *argv]))


# ---------------------------------------------------------------- --aug-repeats


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("repeats", [3, 2.5])
def test_aug_repeats_order_is_timms_repeat_aug_sampler(world_size: int, repeats: float) -> None:
    length = 300
    for rank in range(world_size):
        ours = EpochSampler(length, seed=7, rank=rank, world_size=world_size, repeats=repeats)
        reference = RepeatAugSampler(range(length), num_replicas=world_size, rank=rank, num_repeats=repeats)
        for epoch in (0, 1, 5):
            ours.set_epoch(epoch)
            reference.set_epoch(epoch)
            keys = list(ours)
            assert [index for _, index, _ in keys] == list(reference)
            assert {key[0] for key in keys} == {epoch}


def test_aug_repeats_copies_get_their_own_augmentation_and_resume_mid_epoch() -> None:
    """A sample's copies in one epoch land on different ranks with different seeds (the point of repeated
    augmentation); skipping trained samples (a mid-epoch resume) continues the same keys."""
    keys = {rank: list(_started(EpochSampler(100, 0, rank, 3, repeats=3))) for rank in range(3)}
    first = keys[0][0][1]
    copies = [key for rank_keys in keys.values() for key in rank_keys if key[1] == first]
    assert len(copies) == 3 and len({sample_seed(0, *key) for key in copies}) == 3
    resumed = EpochSampler(100, 0, 1, 3, repeats=3)
    resumed.set_epoch(0, skip_samples=10)
    assert list(resumed) == keys[1][10:]


def _started(sampler: EpochSampler) -> EpochSampler:
    sampler.set_epoch(0)
    return sampler


def test_without_aug_repeats_each_sample_keeps_its_seed() -> None:
    sampler = _started(EpochSampler(20, seed=3))
    assert all(len(key) == 2 for key in sampler)  # (epoch, index): seeds as before --aug-repeats existed


# ---------------------------------------------------------------- distillation


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BatchNorm teacher with running statistics far from the defaults: a teacher left in train mode
    would normalize with the batch's statistics and give other logits."""
    folder = tmp_path_factory.mktemp("teacher") / "model"
    write_model_folder(folder, 4, model_name="test_resnet", seed=3)
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    for key in [k for k in state if k.endswith("running_mean")]:
        state[key] += 0.5
    save_file(state, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("weight", [{"task_loss_weight": 0.3}, {"distill_loss_weight": 0.4}])
def test_distillation_loss_equals_timms_task(device: torch.device, teacher_folder: Path, weight: dict) -> None:
    """The loss of train.py's distillation equals timm's task built with the same temperature and weight
    (--task-loss-weight or --distill-loss-weight: timm derives the other from the one given)."""
    torch.manual_seed(0)
    student = timm.create_model("test_resnet", num_classes=4).to(device)
    ((name, value),) = weight.items()
    flag = "--" + name.replace("_", "-")
    job = train_flags("--kd-model-name", str(teacher_folder), "--kd-temperature", "2", flag, str(value))
    criterion = recipe.build_train_loss(job.augment, mixup_active=False).to(device)
    ours = build_distillation(job.distill, None, student, criterion, device)
    parts = TrainComponents(student, torch.optim.SGD(student.parameters(), lr=0.1), criterion, None, device, task=ours)
    from safetensors.torch import load_file

    teacher = timm.create_model("test_resnet", num_classes=4)
    teacher.load_state_dict(load_file(str(teacher_folder / "model.safetensors")))
    reference = LogitDistillationTask(
        student,
        teacher.to(device),
        criterion=criterion,
        temperature=2.0,
        device=device,
        verbose=False,
        **weight,
    )
    student.train()
    images, targets = torch.randn(8, 3, 32, 32, device=device), torch.randint(0, 4, (8,), device=device)
    expected = reference(images, targets)["loss"]
    assert torch.allclose(parts.loss(images, targets), expected, rtol=1e-5, atol=1e-6)
    assert not any(p.requires_grad for p in ours.teacher.parameters())
    assert not ours.teacher.model.training


def test_a_teacher_of_other_classes_is_refused(device: torch.device, teacher_folder: Path) -> None:
    """timm gives a teacher of other classes a new, random classifier (a 1000-class teacher of a 3-class
    student trained on noise, exit 0); the teacher keeps its own and a class count unlike the student's
    stops the run in one line."""
    student = timm.create_model("test_resnet", num_classes=3).to(device)
    job = train_flags("--kd-model-name", str(teacher_folder))  # 4 classes
    criterion = recipe.build_train_loss(job.augment, mixup_active=False).to(device)
    with pytest.raises(UsageError, match=f"--kd-model-name {teacher_folder} predicts 4 classes and the student 3"):
        build_distillation(job.distill, None, student, criterion, device)
    student = timm.create_model("test_resnet", num_classes=4).to(device)  # the same classes: taken as it is
    task = build_distillation(job.distill, None, student, criterion, device)
    assert task is not None and task.teacher.model.num_classes == 4


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_distillation_trains_and_resumes_exactly(
    device_type: str, fashion4: Path, teacher_folder: Path, tmp_path: Path
) -> None:
    """Two epochs with a teacher, and the same run stopped after one and resumed: the student's weights end
    identical; checkpoints hold the student only (the teacher is rebuilt from --kd-model-name)."""
    recipe_flags = ["--kd-model-name", str(teacher_folder), "--epochs", "2", *device_flags(device_type)]
    full = run_script(train_args(fashion4, tmp_path, "full", *recipe_flags))
    assert full.returncode == 0, full.stderr[-3000:]
    resumed = run_script(
        train_args(
            fashion4, tmp_path, "resumed", *recipe_flags, "--resume", str(tmp_path / "full" / "checkpoint-0.pth.tar")
        )
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"distilling from {teacher_folder} (logit, temperature 4.0, task weight 1" in full.stdout
    if device_type == "cpu":  # the teacher is really used: without it the same run trains otherwise
        plain = run_script(train_args(fashion4, tmp_path, "plain", *recipe_flags[2:]))
        assert plain.returncode == 0, plain.stderr[-3000:]
        assert summary(tmp_path / "plain")[0]["train_loss"] != summary(tmp_path / "full")[0]["train_loss"]
    last = weights(tmp_path / "full" / "last.pth.tar")
    assert_same_weights(last, weights(tmp_path / "resumed" / "last.pth.tar"))
    assert set(last) == set(timm.create_model("test_resnet", num_classes=4).state_dict())
    assert float(summary(tmp_path / "full")[-1]["eval_top1"]) > 0


# ---------------------------------------------------------------- --dist-bn


BN_CASES = [  # --dist-bn, --sync-bn, expected running mean and var (None: each rank keeps its own)
    ("reduce", False, 1.5, 2.5),
    ("broadcast", False, 1.0, 1.0),
    ("", False, None, None),
    ("reduce", True, None, None),
]


def _share_bn(rank: int, port: int, out: str) -> None:
    from vtools.train.run import share_batchnorm_statistics

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for case, (mode, sync_bn, _, _) in enumerate(BN_CASES):
            model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
            model[1].running_mean.fill_(float(rank + 1))
            model[1].running_var.fill_(float(3 * rank + 1))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            parts = TrainComponents(model, optimizer, torch.nn.Identity(), None, torch.device("cpu"))
            share_batchnorm_statistics(parts, DistInfo(rank, 2), mode, sync_bn, ema_force_cpu=False)
            state = {k: v for k, v in model.state_dict().items() if "running" in k}
            torch.save(state, f"{out}-{case}-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes
@pytest.mark.cpu_only(
    reason="distribute_bn is device-agnostic c10d; 2-rank npu runs (emulated hccl, --dist-bn reduce): "
    "tests/scripts/test_train.py"
)
def test_dist_bn_shares_running_statistics_as_timm(tmp_path: Path) -> None:
    """After an epoch, timm's distribute_bn: reduce averages the ranks' statistics, broadcast copies rank 0's,
    '' and --sync-bn leave each rank's (rank 0 holds mean 1 / var 1, rank 1 mean 2 / var 4)."""
    mp.spawn(_share_bn, args=(free_port(), str(tmp_path / "bn")), nprocs=2)
    for case, (_, _, mean, var) in enumerate(BN_CASES):
        for rank in range(2):
            state = torch.load(tmp_path / f"bn-{case}-{rank}.pt", weights_only=True)
            expected_mean = mean if mean is not None else float(rank + 1)
            expected_var = var if var is not None else float(3 * rank + 1)
            assert torch.allclose(state["1.running_mean"], torch.full((4,), expected_mean)), (case, rank)
            assert torch.allclose(state["1.running_var"], torch.full((4,), expected_var)), (case, rank)


# ---------------------------------------------------------------- clipping, dropout, no-aug, loss choice


def test_agc_clipping_leaves_the_classifier_out_as_timm(device: torch.device) -> None:
    model = timm.create_model("test_resnet", num_classes=4).to(device)
    task = ClassificationTask(model, torch.nn.CrossEntropyLoss(), device=device, verbose=False)
    for mode, exclude_head in (("agc", True), ("norm", False), ("value", False)):
        ours = recipe.clip_parameters(model, mode)
        assert [id(p) for p in ours] == [id(p) for p in task.get_clip_parameters(exclude_head=exclude_head)]
    head = model.get_classifier()
    assert all(p is not head.weight and p is not head.bias for p in recipe.clip_parameters(model, "agc"))


@pytest.mark.parametrize("name", ["ghostnet_050", "rexnet_100", "repghostnet_050", "legacy_seresnet18"])
def test_drop_defaults_to_timms_zero(name: str) -> None:
    """Models whose own dropout is 0.2 train with timm's --drop default, 0."""
    job = train_flags("--model", name)
    model = build_model(job.model, 10, torch.device("cpu"))
    reference = timm.create_model(name, num_classes=10, drop_rate=0.0)
    assert model.drop_rate == reference.drop_rate == 0.0
    assert timm.create_model(name, num_classes=10).drop_rate > 0  # the model's own default, not taken


def test_no_aug_resizes_with_the_models_interpolation() -> None:
    model = timm.create_model("vit_tiny_patch16_224", num_classes=4)  # bicubic in its pretrained config
    job = train_flags("--no-aug")
    data_config = resolve_data_config({}, model=model)
    ours = recipe.build_train_transform(job.augment, data_config)
    reference = create_transform(
        data_config["input_size"],
        is_training=True,
        use_prefetcher=True,
        no_aug=True,
        interpolation=data_config["interpolation"],
        mean=data_config["mean"],
        std=data_config["std"],
    )
    assert data_config["interpolation"] == "bicubic" and repr(ours) == repr(reference)


@pytest.mark.parametrize("bce", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("mixup", [False, True])
def test_loss_choice_follows_timms_train_py(bce: bool, smoothing: float, mixup: bool) -> None:
    """timm's train.py: mixup -> BCE or soft-target CE; else smoothing -> BCE or label smoothing; else plain
    cross-entropy, --bce-loss or not."""
    job = train_flags("--smoothing", str(smoothing), *(["--bce-loss", "--bce-sum"] if bce else []))
    loss = recipe.build_train_loss(job.augment, mixup_active=mixup)
    if mixup:
        expected = BinaryCrossEntropy if bce else SoftTargetCrossEntropy
    elif smoothing:
        expected = BinaryCrossEntropy if bce else LabelSmoothingCrossEntropy
    else:
        expected = torch.nn.CrossEntropyLoss
    assert type(loss) is expected
    if isinstance(loss, BinaryCrossEntropy):
        # under mixup timm builds BCE without a smoothing argument: the class default, not --smoothing
        assert loss.sum_classes and loss.smoothing == (BinaryCrossEntropy().smoothing if mixup else smoothing)


# ---------------------------------------------------------------- model and schedule flags


def test_pretrained_path_adapts_the_classifier_and_keeps_the_rest(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    source = timm.create_model("test_resnet", num_classes=10)
    save_file(source.state_dict(), str(tmp_path / "w.safetensors"))
    job = train_flags("--model", "test_resnet", "--pretrained-path", str(tmp_path / "w.safetensors"))
    model = build_model(job.model, 4, torch.device("cpu"))
    head = model.pretrained_cfg["classifier"]
    body = {k: v for k, v in model.state_dict().items() if not k.startswith(head)}
    assert_same_weights(body, {k: v for k, v in source.state_dict().items() if not k.startswith(head)})
    assert model.get_classifier().out_features == 4


def test_head_init_and_grad_checkpointing_as_timm() -> None:
    torch.manual_seed(0)
    plain = build_model(train_flags("--model", "vit_tiny_patch16_224").model, 4, torch.device("cpu"))
    torch.manual_seed(0)
    job = train_flags(
        "--model",
        "vit_tiny_patch16_224",
        "--head-init-scale",
        "0.001",
        "--head-init-bias",
        "-2",
        "--grad-checkpointing",
    )
    model = build_model(job.model, 4, torch.device("cpu"))
    assert torch.equal(model.get_classifier().weight, plain.get_classifier().weight * 0.001)
    assert torch.equal(model.get_classifier().bias, torch.full((4,), -2.0))
    assert model.grad_checkpointing


@pytest.mark.cpu_only(
    reason="the schedule is host-side arithmetic; resumed positions on npu: tests/scripts/test_train.py"
)
def test_start_epoch_begins_the_schedule_there(fashion4: Path, tmp_path: Path) -> None:
    """--start-epoch 2 of 3: one epoch runs, at the rate epoch 2 of the full schedule has."""
    base = ["--epochs", "3", "--warmup-epochs", "0", "--device", "cpu", "--sched", "cosine"]
    full = run_script(train_args(fashion4, tmp_path, "full", *base))
    late = run_script(train_args(fashion4, tmp_path, "late", *base, "--start-epoch", "2"))
    assert full.returncode == 0 and late.returncode == 0, late.stderr[-2000:]
    assert [r["lr"] for r in summary(tmp_path / "late")] == [r["lr"] for r in summary(tmp_path / "full")][2:]
    assert [r["epoch"] for r in summary(tmp_path / "late")] == ["2"]


@pytest.mark.npu_only(
    reason="on cpu a run from timm's args.yaml trains with --aug-repeats 3 (tests/cli/test_timm_compat.py)"
)
def test_aug_repeats_trains_on_the_emulated_npu_too(fashion4: Path, tmp_path: Path) -> None:
    flags = ["--aug-repeats", "3", "--epochs", "1", *device_flags("npu")]
    proc = run_script(train_args(fashion4, tmp_path, "rep", *flags))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = summary(tmp_path / "rep")
    assert len(rows) == 1 and float(rows[0]["train_loss"]) > 0

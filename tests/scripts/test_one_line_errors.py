"""Bad input ends a script with one line on stderr and exit code 2 (3: a run that failed on its own), no
traceback, and nothing half-made — as a user meets it, each case a script run as a subprocess.

One table, one test body. A row is ``Row(id, args, code, fragments, ...)``: the command line after
``python`` (a script, ``-m vtools ...``), the exit code, and the words the one stderr line must hold.
What a case needs beyond that is a keyword of its row:

- ``files``: files written under the test's folder first (str contents are filled in, bytes are not);
- ``setup(tmp, <fixture>...)``: anything more, called with the test's folder and the fixtures it names;
- ``env``: environment on top of the test's (a value of None removes a variable);
- ``checks``: callables ``(tmp, <fixture>... | line)`` run after the error, e.g. that no file was left;
- ``cpu_only``: why the case runs once, on cpu (by default: input checks come before any device work);
  None runs it on every device type, with ``DEVICE`` in its args where the device flags go;
- ``as_user``: file modes apply to the script even where the tests run as root (a read-only folder
  refuses its writes; ``run_script(..., file_permissions_apply=True)``).

``{name}`` in args, env, file contents and fragments is filled in: ``tmp`` (the test's own folder),
``data`` (the shipped subset), ``repo``, or a fixture of that name (``custom_images``, ``fashion4``...).

Models that would need a download (``NEEDS_DOWNLOAD``) show that a check comes before the model is built:
a check after model creation would show up as a network error instead.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import pickle
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import timm
import torch

from tests.conftest import (
    CLASSES,
    DEVICE_TYPES,
    EMULATED_NPU_MODULE,
    REPO,
    assert_one_line_error,
    broken_autoload_backend,
    broken_torch_npu_package,
    device_flags,
    file_permissions_can_apply,
    run_script,
    train_args,
    write_model_folder,
)
from tests.data.test_step_errors import planted, tiny_image
from vtools.cli.runner import command_main

DATA = REPO / "data" / "fashion-mnist-mini"
NEEDS_DOWNLOAD = ["--model", "resnet18.a1_in1k", "--pretrained"]
OFFLINE = {"HF_HUB_OFFLINE": "1"}
DEVICE = "{device flags}"  # in a row's args: --device <type> (and what it needs), for each device type
INPUT_CHECKS = "input checks: the run stops with one line before any device work"
DEVICE_SITUATION = "each case sets up the device situation it checks (missing, broken, hidden, out-of-range backends)"


@dataclass
class Row:
    id: str
    args: list[str]
    code: int
    fragments: list[str]
    files: dict[str, str | bytes] = field(default_factory=dict)
    setup: Callable[..., None] | None = None
    env: dict[str, str | None] | None = None
    checks: tuple[Callable[..., None], ...] = ()
    cpu_only: str | None = INPUT_CHECKS
    as_user: bool = False


# ---------------------------------------------------------------- setups and checks that rows share


def _folders(*relative: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        for name in relative:
            (tmp / name).mkdir(parents=True)

    return setup


def _absent(relative: str) -> Callable[[Path], None]:
    def check(tmp: Path) -> None:
        assert not (tmp / relative).exists(), relative

    return check


def _no_csv_in(relative: str) -> Callable[[Path], None]:
    def check(tmp: Path) -> None:
        out = tmp / relative
        assert not out.exists() or not any(out.glob("*.csv"))

    return check


def _nothing_written(tmp: Path) -> None:
    assert not any(tmp.iterdir())  # nothing half-made


def _no_download_mentioned(tmp: Path, line: str) -> None:
    """Offline, a hub model would fail as a network error after retries; the data error must come first."""
    assert "pretrained weights" not in line


class _RunsCode:
    """Unpickling it runs ``touch marker``: what loading weights must never do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _pickle_that_runs_code(name: str, protocol: int = 2) -> Callable[[Path], None]:
    """protocol 2 is what torch.save writes; pickle.dump's default (5) is refused as well."""

    def setup(tmp: Path) -> None:
        (tmp / name).write_bytes(pickle.dumps({"state_dict": _RunsCode(tmp / "pwned")}, protocol=protocol))

    return setup


# model folders broken one way: a copy of custom_model_dir (test_resnet, 3 classes) at {tmp}/model


def _model_folder(change: Callable[[Path], None]) -> Callable[[Path, Path], None]:
    def setup(tmp: Path, custom_model_dir: Path) -> None:
        shutil.copytree(custom_model_dir, tmp / "model")
        change(tmp / "model")

    return setup


def _config_edit(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        edit(config)
        (folder / "config.json").write_text(json.dumps(config))

    return change


def _weights_of(model_name: str, num_classes: int) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        from safetensors.torch import save_file

        save_file(
            timm.create_model(model_name, num_classes=num_classes).state_dict(), str(folder / "model.safetensors")
        )

    return change


def _no_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()


def _pickled_weights(protocol: int) -> Callable[[Path], None]:
    """pytorch_model.bin in place of model.safetensors, a pickle that runs ``touch {tmp}/pwned``."""

    def change(folder: Path) -> None:
        (folder / "model.safetensors").unlink()
        state = {"conv1.0.weight": _RunsCode(folder.parent / "pwned")}
        (folder / "pytorch_model.bin").write_bytes(pickle.dumps(state, protocol=protocol))

    return change


# Hugging Face tables (parquet, save_to_disk) and tar shards of custom_images (3 classes) as the validation split


def _shards(tmp: Path, custom_images: Path, fmt: str, out: str) -> Path:
    from vtools.data.shard_writer import convert

    convert(custom_images, tmp / out, "c3", fmt, split="validation")
    return tmp / out


def _parquet_table(
    name: str, change: Callable | None = None, keep_metadata: bool = True
) -> Callable[[Path, Path], None]:
    """{tmp}/<name>/data/validation-00000-of-00001.parquet, its columns changed by ``change(table) -> columns``."""

    def setup(tmp: Path, custom_images: Path) -> None:
        pytest.importorskip("datasets")
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = _shards(tmp, custom_images, "parquet", name) / "data" / "validation-00000-of-00001.parquet"
        table = pq.read_table(path)
        if change is not None:
            metadata = table.schema.metadata if keep_metadata else None
            table = pa.table(change(table)).replace_schema_metadata(metadata)
            pq.write_table(table, path)

    return setup


def _labels(table) -> list[int]:
    return table.column("label").to_pylist()


def _int_image_column(table) -> dict:
    import pyarrow as pa

    return {"image": pa.array(range(table.num_rows), pa.int64()), "label": table.column("label")}


def _string_labels(table) -> dict:
    return {"image": table.column("image"), "label": [["cat", "dog", "fox"][label] for label in _labels(table)]}


def _labels_plus_5(table) -> dict:
    import pyarrow as pa

    return {"image": table.column("image"), "label": pa.array([label + 5 for label in _labels(table)], pa.int64())}


def _loading_script(tmp: Path) -> None:
    pytest.importorskip("datasets")
    (tmp / "script" / "script").mkdir(parents=True)
    (tmp / "script" / "script" / "script.py").write_text("import datasets\n")


def _script_beside_data(tmp: Path, custom_images: Path) -> None:
    _parquet_table("both")(tmp, custom_images)
    (tmp / "both" / "both.py").write_text("import datasets\n")


def _saved_to_disk(relative: str, content: str) -> Callable[[Path, Path], None]:
    """DatasetDict.save_to_disk at {tmp}/saved/saved, then ``relative`` in it overwritten with ``content``."""

    def setup(tmp: Path, custom_images: Path) -> None:
        datasets = pytest.importorskip("datasets")
        parquet = _shards(tmp, custom_images, "parquet", "pq") / "data" / "validation-00000-of-00001.parquet"
        saved = tmp / "saved" / "saved"
        datasets.load_dataset("parquet", data_files={"validation": str(parquet)}).save_to_disk(str(saved))
        (saved / relative).write_text(content)

    return setup


def _tar_shards_with_label(cls: bytes | None) -> Callable[[Path, Path], None]:
    """{tmp}/w: tar shards (wds/c3), the 5th sample's .cls rewritten to ``cls`` (None: left as written)."""

    def setup(tmp: Path, custom_images: Path) -> None:
        folder = _shards(tmp, custom_images, "wds", "w")
        if cls is None:
            return
        shard = folder / "c3-validation-000000.tar"
        members = []
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                data = tar.extractfile(member).read()
                if member.name == "000000004.cls":
                    data = cls
                    member.size = len(data)
                members.append((member, data))
        with tarfile.open(shard, "w") as tar:
            for member, data in members:
                tar.addfile(member, io.BytesIO(data))

    return setup


def _no_unlabelled_message(tmp: Path, line: str) -> None:
    assert "no label" not in line


def _plain_state_dict(tmp: Path, custom_model_dir: Path) -> None:
    from safetensors.torch import load_file

    torch.save(load_file(str(custom_model_dir / "model.safetensors")), tmp / "plain.pth")


def _integer_weights(tmp: Path) -> None:
    from safetensors.torch import save_file

    state = {
        k: v.to(torch.int64) if v.is_floating_point() else v
        for k, v in timm.create_model("test_resnet", num_classes=10).state_dict().items()
    }
    save_file(state, str(tmp / "ints.safetensors"))


def _empty_class_folder_first(tmp: Path, custom_images: Path) -> None:
    """An empty folder would still count as a class in sorted-folder labelling, shifting every label after it:
    it is refused by name (not found out as a puzzling "4 classes but 3 outputs")."""
    shutil.copytree(custom_images, tmp / "imgs")
    (tmp / "imgs" / "aardvark").mkdir()  # sorts first: every other folder's label moves up by one
    write_model_folder(tmp / "unnamed", 3)  # no class names: labels by sorted folder order


def _only_empty_training_images(tmp: Path, fashion4: Path) -> None:
    shutil.copytree(fashion4 / "val", tmp / "data" / "val")
    for name in CLASSES:
        (tmp / "data" / "train" / name).mkdir(parents=True)
        (tmp / "data" / "train" / name / "empty.png").write_bytes(b"")


RESUMABLE = [
    "--data-dir",
    "{data}",
    "--model",
    "test_resnet",
    "--device",
    "cpu",
    "--workers",
    "0",
    "--img-size",
    "28",
    "--output",
    "{tmp}",
    "--experiment",
    "run",
    "--epochs",
    "1",
    "--batch-size",
    "200",
]


def _run_with_damaged_summary(tmp: Path) -> None:

    assert command_main("train")([arg.format(data=DATA, tmp=tmp) for arg in RESUMABLE]) == 0
    (tmp / "run" / "summary.csv").write_bytes(b"\xff\xfe garbage\n")


# run folders train.py cannot use: a lock file it did not write, a folder it may not write (issue 33)

DAMAGED_LOCK = bytes(range(255, 0, -7)) * 3  # bytes no vtools run writes (not even UTF-8)


def _damaged_lock(tmp: Path) -> None:
    """An earlier run's folder whose lock file was overwritten with other bytes: the ledger is lost."""
    (tmp / "run").mkdir()
    (tmp / "run" / ".vtools-run.lock").write_bytes(DAMAGED_LOCK)
    (tmp / "run" / "summary.csv").write_text("epoch,train_loss\n0,1.0\n")


def _damaged_lock_left_alone(tmp: Path) -> None:
    assert (tmp / "run" / ".vtools-run.lock").read_bytes() == DAMAGED_LOCK
    assert sorted(p.name for p in (tmp / "run").iterdir()) == [".vtools-run.lock", "summary.csv"]
    assert sorted(p.name for p in tmp.iterdir()) == ["run"]  # no run-2 either


def _still_empty(relative: str) -> Callable[[Path], None]:
    def check(tmp: Path) -> None:
        assert not any((tmp / relative).iterdir()), sorted((tmp / relative).iterdir())

    return check


def _read_only_folder(tmp: Path) -> None:
    (tmp / "run").mkdir()
    (tmp / "run").chmod(0o555)


def _files_in(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _finished_run_made_read_only(everything: bool) -> Callable[[Path], None]:
    """A finished run whose folder (``everything``: and every file in it, the lock too) is made read-only."""

    def setup(tmp: Path) -> None:

        assert command_main("train")([arg.format(data=DATA, tmp=tmp) for arg in RESUMABLE]) == 0
        folder = tmp / "run"
        for path in [*folder.rglob("*"), folder] if everything else [folder]:
            path.chmod(path.stat().st_mode & ~0o222)
        (tmp / "before.json").write_text(json.dumps(_files_in(folder)))

    return setup


def _run_folder_unchanged(tmp: Path) -> None:
    assert _files_in(tmp / "run") == {k: tuple(v) for k, v in json.loads((tmp / "before.json").read_text()).items()}


def _blocker_intact(tmp: Path) -> None:
    assert (tmp / "a_file").read_text() == "x"


# outputs that are inputs, lie inside the data, are shared by two models, or cannot be written (issue 33)


def _model_copies(*relatives: str) -> Callable[[Path, Path], None]:
    """Copies of custom_model_dir at {tmp}/<relative>."""

    def setup(tmp: Path, custom_model_dir: Path) -> None:
        for relative in relatives:
            shutil.copytree(custom_model_dir, tmp / relative)

    return setup


def _model_intact(tmp: Path, custom_model_dir: Path) -> None:
    """{tmp}/model holds custom_model_dir's files, byte for byte, and nothing else."""
    assert {p.name: p.read_bytes() for p in (tmp / "model").iterdir()} == {
        p.name: p.read_bytes() for p in custom_model_dir.iterdir()
    }


def _ledgered(relative: str, files: dict[str, str]) -> Callable[[Path], None]:
    """A run folder at {tmp}/<relative> as train.py leaves it: ``files`` and its ledger naming them, a folder
    (model/, eval/) by its name as train.py names it."""

    def setup(tmp: Path) -> None:
        for name, text in files.items():
            (tmp / relative / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / relative / name).write_text(text)
        listed = dict.fromkeys(name.split("/")[0] for name in files)
        (tmp / relative / ".vtools-run.lock").write_text("\n".join(["1", *listed]) + "\n")

    return setup


def _images_copy(tmp: Path, custom_images: Path) -> None:
    """custom_images at {tmp}/imgs (3 class folders), with {tmp}/link a symlink to it."""
    shutil.copytree(custom_images, tmp / "imgs")
    (tmp / "link").symlink_to(tmp / "imgs")


IMAGES_OF_CAT = ["cat_0.jpg", "cat_1.png", "cat_2.jpg", "cat_3.png"]  # custom_images/cat


def _data_copy(tmp: Path, fashion4: Path) -> None:
    shutil.copytree(fashion4, tmp / "data")


def _classes_unchanged(relative: str, classes: list[str]) -> Callable[[Path], None]:
    def check(tmp: Path) -> None:
        assert sorted(p.name for p in (tmp / relative).iterdir()) == classes

    return check


def _nan_weights_model(tmp: Path, custom_model_dir: Path) -> None:
    """{tmp}/nan: custom_model_dir with every weight nan: its loss is not finite (a run's failure, exit 3)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(custom_model_dir, tmp / "nan")
    weights = str(tmp / "nan" / "model.safetensors")
    save_file(
        {k: v.fill_(float("nan")) if v.is_floating_point() else v for k, v in load_file(weights).items()}, weights
    )


def _rows_of(relative: str, *models: str) -> Callable[..., None]:
    """The results file holds exactly the rows of ``models`` (placeholders filled in)."""

    def check(tmp: Path, custom_model_dir: Path) -> None:
        import pandas as pd

        expected = [model.format(tmp=tmp, custom_model_dir=custom_model_dir) for model in models]
        assert pd.read_csv(tmp / relative)["model"].tolist() == expected

    return check


def _no_picture_in_the_repository(tmp: Path) -> None:
    assert not (REPO / "curves.png").exists()  # the old default: ./curves.png in the current folder


REPORT_FILES = {"a/overall.csv": "samples,top1\n3,100.0\n", "a/per_class.csv": "class,top1,f1\ncat,100.0,100.0\n"}
REPORT_FILES |= {name.replace("a/", "b/"): text for name, text in REPORT_FILES.items()}


def _intact(relative: str, text: str) -> Callable[[Path], None]:
    def check(tmp: Path) -> None:
        assert (tmp / relative).read_text() == text

    return check


SUMMARY = "epoch,train_loss,eval_top1\n0,1.0,50.0\n"


VALIDATE_RESULTS = ["--results-file", "{tmp}/out/results.csv"]  # and _absent("out/results.csv"): none written
INFERENCE_RESULTS = ["--results-dir", "{tmp}/out"]  # and _no_csv_in("out")

# ---------------------------------------------------------------- issue 33's adversarial probe: setups and checks


def _teacher_of(classes: int) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        write_model_folder(tmp / "teacher", classes)

    return setup


def _timm_args_yaml(*argv: str) -> Callable[[Path], None]:
    """{tmp}/args.yaml as timm's train.py writes it for ``argv`` (every option, data_dir and device as timm's)."""

    def setup(tmp: Path) -> None:
        from tests.timm_reference import timm_args_yaml

        (tmp / "args.yaml").write_text(timm_args_yaml("train.py", list(argv)), encoding="utf-8")

    return setup


def _names_no_other_flag(*flags: str) -> Callable[[Path, str], None]:
    """The line suggests or names none of ``flags`` (options the command does not take, or the wrong one)."""

    def check(tmp: Path, line: str) -> None:
        assert not any(flag in line for flag in flags), line

    return check


# ---------------------------------------------------------------- unreadable entries, empty class folders, host memory,
# worker errors (issue 33): setups


def _imgs_with(change: Callable[[Path], None]) -> Callable[[Path, Path], None]:
    """A copy of custom_images (cat, dog, fox: 4 images each) at {tmp}/imgs, changed one way."""

    def setup(tmp: Path, custom_images: Path) -> None:
        shutil.copytree(custom_images, tmp / "imgs")
        change(tmp / "imgs")

    return setup


def _fashion_with(change: Callable[[Path], None]) -> Callable[[Path, Path], None]:
    """A copy of fashion4 (train/ and val/) at {tmp}/data, changed one way."""

    def setup(tmp: Path, fashion4: Path) -> None:
        shutil.copytree(fashion4, tmp / "data")
        change(tmp / "data")

    return setup


def _dangling_link(root: Path) -> None:
    (root / "dog" / "dog_1.png").unlink()
    (root / "dog" / "dog_1.png").symlink_to(root / "nowhere.png")


def _unlistable_sub_folder(root: Path) -> None:
    (root / "cat" / "private").mkdir()
    shutil.copy(root / "cat" / "cat_0.jpg", root / "cat" / "private" / "kept.jpg")
    (root / "cat" / "private").chmod(0)


def _tiny_validation_image(root: Path) -> None:
    """16x16: --crop-border-pixels 10 trims it to nothing, and the planted transform fails on it."""
    tiny_image(root / "dog" / "tiny.png")


HUGE = [3, 100_000, 100_000]
_huge_input_size = _model_folder(
    _config_edit(lambda c: c["pretrained_cfg"].update(input_size=HUGE, test_input_size=HUGE))
)


# ---------------------------------------------------------------- the table

FLAG_VALUES = [  # validate.py and inference.py alike
    (["--img-size", "0"], "--img-size must be a positive integer"),
    (["--input-size", "3", "0", "0"], "--input-size needs three positive numbers"),
    (["--workers", "-1"], "--workers must be 0"),
    (["--in-chans", "0"], "--in-chans must be a positive integer"),
    (["--mean", "0.5", "0.5"], "--mean needs one value per input channel"),
    (["--std", "0", "0", "0"], "--std must not be 0"),
    (["--batch-size", "nan"], "invalid int value"),
    (["--batchsize", "8"], "did you mean --batch-size?"),
]

TRAINING_FLAGS = [
    ("lr-nan", ["--lr", "nan"], "--lr must be a finite number"),
    ("epochz", ["--epochz", "3"], "did you mean --epochs?"),
    ("val-interval-0", ["--val-interval", "0"], "--val-interval must be a positive integer"),
    ("naflex", ["--naflex-loader"], "--naflex-loader: variable-resolution and NaFlex batches need"),
    ("scale-one-value", ["--scale", "0.5"], "--scale takes two values, low and high, got 0.5"),
    # torch's timedelta overflows past ~1e9 days, gloo's store times out before it starts below a few seconds
    ("dist-timeout-huge", ["--dist-timeout", "1e30"], "--dist-timeout: invalid time '1e30': give seconds from 10 to"),
    ("dist-timeout-tiny", ["--dist-timeout", "1e-9"], "--dist-timeout: invalid time '1e-9': give seconds from 10 to"),
    (  # timm asserts on this pair mid-setup; a colour mean for a grayscale model is a mistake, not a broadcast
        "gray-with-colour-mean",
        ["--in-chans", "1", "--mean", "0.5", "0.4", "0.3"],
        "--mean needs one value per input channel (1) or a single value, got 3",
    ),
]

YAML_VALUES = [  # data-dir, then the line: line numbers count data-dir as line 1
    ("yaml-batch-size-null", "batch-size: null", "key 'batch-size' expects an integer, got null"),
    ("yaml-epochs-null", "epochs: null", "key 'epochs' expects an integer, got null"),
    ("yaml-model-null", "model: null", "key 'model' expects a value, got null"),
    ("yaml-lr-twice", "lr: 0.1\nlr: 0.2", "key 'lr' is given twice (line 3)"),
]

YAML_TYPES = [  # data-dir, then the line; the config alone on the command line
    ("yaml-epochs-many", "epochs: many", "key 'epochs' expects an integer"),
    ("yaml-lr-list", "lr: [1, 2]", "key 'lr' expects a single value"),
    ("yaml-amp-yes", "amp: 'yes'", "key 'amp' expects true or false"),
    ("yaml-scale-one-value", "scale: [0.5]", "--scale takes two values, low and high, got 0.5"),
    ("yaml-clip-mode", "clip-mode: sideways", "key 'clip-mode' expects one of norm, value, agc"),
    ("yaml-not-yaml", "epochs: [", "is not valid YAML"),
]

# What each script reads, for rows about something else: the command line is checked before the device,
# so a row without its input would stop at "give the data folder"
DATA_OF = {
    "train.py": ["--data-dir", "{data}"],
    "validate.py": ["{data}/val"],
    "inference.py": ["{data}/val", "--model", "test_resnet"],
}

ROWS = [
    # ------------------------------------------------ flag values, before any model is built
    *[
        Row(
            f"{script.removesuffix('.py')}-{flags[0].lstrip('-')}",
            [script, "{data}/val", *NEEDS_DOWNLOAD, *flags],
            2,
            [fragment],
            env=OFFLINE,
        )
        for script in ("validate.py", "inference.py")
        for flags, fragment in FLAG_VALUES
    ],
    *[
        Row(
            f"train-{name}",
            ["train.py", "--data-dir", "{data}", *NEEDS_DOWNLOAD, "--output", "{tmp}", *flags],
            2,
            [fragment],
            env=OFFLINE,
            checks=(_nothing_written,),
        )
        for name, flags, fragment in TRAINING_FLAGS
    ],
    Row(
        "train-input-img-mode-channels",
        [
            "train.py",
            "--data-dir",
            "{data}",
            "--model",
            "test_resnet",
            "--img-size",
            "32",
            "--output",
            "{tmp}",
            "--input-img-mode",
            "RGBA",
            "--device",
            "cpu",
        ],
        2,
        ["images are read in PIL mode RGBA (4 channels) but the model takes 3"],
        checks=(_nothing_written,),
        cpu_only="the image mode is checked on the host, before the first batch",
    ),
    Row(  # the patch embedding asserted at the first forward, after the run folder and loaders existed
        "train-fixed-size-model-other-size",
        [
            "train.py",
            "--data-dir",
            "{data}",
            "--model",
            "deit_tiny_patch16_224",
            "--img-size",
            "32",
            "--output",
            "{tmp}",
            "--device",
            "cpu",
        ],
        2,
        ["the model takes 224x224 images only and the data is 32x32", "--model-kwargs img_size=32"],
        checks=(_nothing_written,),
        cpu_only="the size is checked on the host, before the first batch",
    ),
    Row(
        "validate-negative-profile",
        ["validate.py", "{data}/val", "--model", "test_resnet", "--profile", "-1"],
        2,
        ["--profile must be 0 (off) or a number of steps"],
    ),
    *[
        Row(
            f"bench{flag}-0",
            ["-m", "benchmarks", flag, "0"],
            2,
            [flag, "must be 1 or more"],
            cpu_only="the counts are refused before any device is resolved",
        )
        for flag in ("--repeats", "--recipe-epochs", "--steps")
    ],
    # ------------------------------------------------ data, checked before any model download
    *[
        Row(
            f"validate-data-{name}-before-download",
            ["validate.py", "{tmp}/val", *NEEDS_DOWNLOAD],
            2,
            ["{tmp}/val"],
            setup=setup,
            env=OFFLINE,
            checks=(_no_download_mentioned,),
        )
        for name, setup in (("missing", None), ("empty", _folders("val")), ("no-images", _folders("val/bag")))
    ],
    Row(
        "validate-missing-directory",
        ["validate.py", "{tmp}/nope", "--model", "{custom_model_dir}", *VALIDATE_RESULTS],
        2,
        ["does not exist"],
        checks=(_absent("out/results.csv"),),
    ),
    Row(
        "validate-empty-directory",
        ["validate.py", "{tmp}/empty", "--model", "{custom_model_dir}", *VALIDATE_RESULTS],
        2,
        ["no class folders"],
        setup=_folders("empty"),
        checks=(_absent("out/results.csv"),),
    ),
    Row(
        "validate-class-folders-without-images",
        ["validate.py", "{tmp}/d", "--model", "{custom_model_dir}", *VALIDATE_RESULTS],
        2,
        ["no images found"],
        files={"d/cat/notes.txt": "not an image"},
        checks=(_absent("out/results.csv"),),
    ),
    Row(
        "validate-empty-class-folder-among-full-ones",
        ["validate.py", "{tmp}/imgs", "--model", "{tmp}/unnamed", *VALIDATE_RESULTS],
        2,
        ["empty class folder {tmp}/imgs/aardvark: labels come from the sorted folder names", "shift the labels"],
        setup=_empty_class_folder_first,
        checks=(_absent("out/results.csv"),),
    ),
    Row(
        "validate-torchvision-dataset-missing",
        ["validate.py", "--dataset", "torch/cifar10", "--data-dir", "{tmp}", "--model", "{custom_model_dir}"],
        2,
        ["--dataset torch/cifar10", "--dataset-download"],
    ),
    Row(
        "inference-missing-source",
        ["inference.py", "{tmp}/nothing", "--model", "{custom_model_dir}", *INFERENCE_RESULTS],
        2,
        ["does not exist"],
        checks=(_no_csv_in("out"),),
    ),
    Row(
        "inference-no-images",
        ["inference.py", "{tmp}/docs", "--model", "{custom_model_dir}", *INFERENCE_RESULTS],
        2,
        ["no images found"],
        files={"docs/a.txt": "hello"},
        checks=(_no_csv_in("out"),),
    ),
    # ------------------------------------------------ where results go
    Row(
        "validate-unwritable-results-file",
        [
            "validate.py",
            "{custom_images}",
            "--model",
            "{custom_model_dir}",
            "--results-file",
            "{tmp}/a_file/results.csv",
        ],
        2,
        ["--results-file"],
        files={"a_file": "x"},  # a file where a folder is needed
        checks=(_blocker_intact,),
    ),
    Row(
        "validate-report-is-a-file",
        ["validate.py", "{custom_images}", "--model", "{custom_model_dir}", "--report", "{tmp}/a_file"],
        2,
        ["--report", "is a file"],
        files={"a_file": "x"},
        checks=(_blocker_intact,),
    ),
    Row(
        "validate-report-worst-negative",
        [
            "validate.py",
            "{custom_images}",
            "--model",
            "{custom_model_dir}",
            "--report",
            "{tmp}/r",
            "--report-worst",
            "-1",
        ],
        2,
        ["--report-worst must be 0"],
        checks=(_absent("r"),),
    ),
    Row(
        "inference-unwritable-results-dir",
        [
            "inference.py",
            "{custom_images}",
            "--model",
            "{custom_model_dir}",
            "--results-dir",
            "{tmp}/a_file/results.csv",
        ],
        2,
        ["cannot create folder"],
        files={"a_file": "x"},
        checks=(_blocker_intact,),
    ),
    Row(
        "plot-needs-a-run",
        ["-m", "vtools", "plot", "{tmp}", "-o", "{tmp}/x.png"],
        2,
        ["no summary.csv"],
        checks=(_absent("x.png"),),
        cpu_only="logging and drawing are host-side; device training: tests/scripts/test_train.py",
    ),
    # ------------------------------------------------ models and checkpoints
    Row(
        "validate-unknown-model-suggests",
        ["validate.py", "{custom_images}", "--model", "resnet5O", *VALIDATE_RESULTS],
        2,
        ["unknown model 'resnet5O'", "did you mean"],
        checks=(_absent("out/results.csv"),),
    ),
    Row(
        "inference-unknown-model-suggests",
        ["inference.py", "{custom_images}", "--model", "vit_tiny_patch16_22", *INFERENCE_RESULTS],
        2,
        ["unknown model", "did you mean"],
        checks=(_no_csv_in("out"),),
    ),
    Row(
        "validate-hub-model-without-network",
        ["validate.py", "{custom_images}", "--model", "hf-hub:timm/resnet18.a1_in1k", *VALIDATE_RESULTS],
        2,
        ["the Hugging Face Hub cannot be used (HF_HUB_OFFLINE is set)", "local model folder"],
        env=OFFLINE,
        checks=(_absent("out/results.csv"),),
    ),
    Row(
        "inference-model-folder-without-config",
        ["inference.py", "{custom_images}", "--model", "{tmp}/empty_model", *INFERENCE_RESULTS],
        2,
        ["has no config.json"],
        setup=_folders("empty_model"),
        checks=(_no_csv_in("out"),),
    ),
    Row(
        "validate-model-folder-config-not-an-object",
        ["validate.py", "{data}/val", "--model", "{tmp}/model", "--device", "cpu"],
        2,
        ["config.json must hold an object"],
        files={"model/config.json": "[1, 2]"},
    ),
    Row(
        "validate-empty-checkpoint",
        ["validate.py", "{data}/val", "--model", "test_resnet", "--num-classes", "10"]
        + ["--checkpoint", "{tmp}/empty.pth", "--device", "cpu"],
        2,
        ["is empty (0 bytes)"],
        files={"empty.pth": b""},
    ),
    Row(
        "train-empty-initial-checkpoint",
        ["train.py", "--data-dir", "{data}", "--model", "test_resnet", "--initial-checkpoint", "{tmp}/empty.pth"]
        + ["--device", "cpu", "--output", "{tmp}/out"],
        2,
        ["is empty (0 bytes)"],
        files={"empty.pth": b""},
    ),
    Row(
        "validate-unreadable-pytorch-checkpoint",
        ["validate.py", "{custom_images}", "--model", "test_resnet", "--num-classes", "3"]
        + ["--checkpoint", "{tmp}/bad.pth", *VALIDATE_RESULTS],
        2,
        ["not a readable PyTorch checkpoint"],
        files={"bad.pth": b"\x00garbage" * 10},
        checks=(_absent("out/results.csv"),),
    ),
    Row(
        "validate-unreadable-safetensors",
        ["validate.py", "{custom_images}", "--model", "test_resnet", "--num-classes", "3"]
        + ["--checkpoint", "{tmp}/bad.safetensors", *VALIDATE_RESULTS],
        2,
        ["not a readable safetensors file"],
        files={"bad.safetensors": b"garbage"},
        checks=(_absent("out/results.csv"),),
    ),
    Row(
        "validate-mismatched-checkpoint-names-keys",
        ["validate.py", "{custom_images}", "--model", "test_resnet", "--num-classes", "5"]
        + ["--checkpoint", "{custom_model_dir}/model.safetensors", *VALIDATE_RESULTS],
        2,
        ["does not fit the model", "shape mismatch", "fc.weight"],
        checks=(_absent("out/results.csv"),),
    ),
    Row(
        "validate-integer-weights-into-float-model",
        ["validate.py", "{data}/val", "--model", "test_resnet", "--num-classes", "10"]
        + ["--checkpoint", "{tmp}/ints.safetensors", "--device", "cpu"],
        2,
        ["integer vs floating-point", "torch.int64 vs torch.float32"],
        setup=_integer_weights,
    ),
    Row(
        "validate-use-ema-without-ema-weights",
        ["validate.py", "{custom_images}", "--model", "test_resnet", "--num-classes", "3"]
        + ["--checkpoint", "{tmp}/plain.pth", "--use-ema", *VALIDATE_RESULTS],
        2,
        ["has no state_dict_ema"],
        setup=_plain_state_dict,
        checks=(_absent("out/results.csv"),),
    ),
    Row(
        "validate-malicious-pickle-never-runs",
        ["validate.py", "{custom_images}", "--model", "test_resnet", "--num-classes", "3"]
        + ["--checkpoint", "{tmp}/evil.pth", *VALIDATE_RESULTS],
        2,
        ["refused"],
        setup=_pickle_that_runs_code("evil.pth"),
        checks=(_absent("out/results.csv"), _absent("pwned")),
    ),
    Row(
        "validate-malicious-pickle-protocol-5-never-runs",
        ["validate.py", "{custom_images}", "--model", "test_resnet", "--num-classes", "3"]
        + ["--checkpoint", "{tmp}/evil.pth", *VALIDATE_RESULTS],
        2,
        ["was refused", "posix.system"],
        setup=_pickle_that_runs_code("evil.pth", protocol=5),
        checks=(_absent("out/results.csv"), _absent("pwned")),
    ),
    *[
        Row(
            f"validate-model-kwargs-not-taken-{name}",
            ["validate.py", "{custom_images}", *model, "--model-kwargs", "bogus=1", *VALIDATE_RESULTS],
            2,
            ["--model-kwargs bogus", "does not take 'bogus'"],
            checks=(_absent("out/results.csv"),),
        )
        for name, model in (
            ("model-folder", ["--model", "{custom_model_dir}"]),
            ("timm-name", ["--model", "test_resnet", "--num-classes", "3"]),
        )
    ],
    # model folders whose config.json and weights do not make a model, through validate.py and inference.py
    *[
        Row(
            f"{script.removesuffix('.py')}-model-folder-{case}",
            [script, "{custom_images}", "--model", "{tmp}/model", *extra, *results],
            2,
            fragments,
            setup=_model_folder(change),
            checks=(absent, _absent("pwned")),
        )
        for script, results, absent in (
            ("validate.py", VALIDATE_RESULTS, _absent("out/results.csv")),
            ("inference.py", INFERENCE_RESULTS, _no_csv_in("out")),
        )
        for case, change, extra, fragments in (
            (
                "architecture-not-of-the-weights",
                _config_edit(lambda c: c.update(architecture="resnet18")),
                [],
                ["model folder {tmp}/model", "model.safetensors does not fit resnet18", "config.json", "missing:"],
            ),
            (
                "architecture-not-of-the-weights-new-head",
                _config_edit(lambda c: c.update(architecture="resnet18")),
                ["--num-classes", "5"],
                ["does not fit resnet18"],
            ),
            (
                "unknown-model-arg",
                _config_edit(lambda c: c["model_args"].update(bogus_arg=1)),
                [],
                ["config.json's model_args has 'bogus_arg'", "remove it from model_args"],
            ),
            (
                "model-args-a-list",
                _config_edit(lambda c: c.update(model_args=[3, 3])),
                [],
                ["'model_args' must be an object", "not a list"],
            ),
            (
                "no-architecture",
                _config_edit(lambda c: c.pop("architecture")),
                [],
                ["config.json has no 'architecture'", "add it"],
            ),
            (
                "unknown-architecture",
                _config_edit(lambda c: c.update(architecture="resnet10x")),
                [],
                ["'resnet10x' is not a timm model", "did you mean resnet10t"],
            ),
            ("no-weights", _no_weights, [], ["model.safetensors is missing"]),
            (
                "weights-of-another-model",
                _weights_of("resnet10t", 3),
                [],
                ["model.safetensors does not fit test_resnet", "shape mismatch"],
            ),
            (
                "weights-for-5-classes",
                _weights_of("test_resnet", 5),
                [],
                ["does not fit test_resnet", "fc.weight (5, 96) vs (3, 96)"],
            ),
            (
                "pickle-that-runs-code",
                _pickled_weights(2),
                [],
                ["{tmp}/model/pytorch_model.bin was refused", "would run code"],
            ),
            (
                "pickle-protocol-5-that-runs-code",
                _pickled_weights(5),
                [],
                ["pytorch_model.bin was refused", "would run code", "posix.system"],
            ),
        )
    ],
    # Hugging Face tables that are not image classification data (the setups skip without datasets)
    *[
        Row(
            f"validate-hfds-{case}",
            ["validate.py", "--dataset", f"hfds/{name}", "--data-dir", f"{{tmp}}/{name}", "--model"]
            + ["{custom_model_dir}", *VALIDATE_RESULTS],
            2,
            fragments,
            setup=setup,
            checks=(_absent("out/results.csv"),),
        )
        for case, name, setup, fragments in (
            (
                "image-column-of-integers",
                "intimage",
                _parquet_table("intimage", _int_image_column, keep_metadata=False),
                ["column 'image'", "holds int64, not images", "--input-key"],
            ),
            (
                "string-labels",
                "strlabels",
                _parquet_table("strlabels", _string_labels, keep_metadata=False),
                ["holds string values", "(e.g. 'cat')", "not class indices", "class_encode_column"],
            ),
            (
                "labels-out-of-range",
                "outofrange",
                _parquet_table("outofrange", _labels_plus_5),
                ["has label 7 in column 'label'", "out of range for its 3 class names", "cat, dog, fox", "ClassLabel"],
            ),
            (
                "loading-script",
                "script",
                _loading_script,
                ["holds a dataset loading script (script.py)", "parquet"],
            ),
            (
                "loading-script-beside-data",
                "both",
                _script_beside_data,
                ["holds a dataset loading script (both.py) beside its data files", "move both.py out"],
            ),
            (
                "dataset-dict-not-json",
                "saved",
                _saved_to_disk("dataset_dict.json", '{"splits": ["validation"'),
                ["{tmp}/saved/saved/dataset_dict.json is not readable JSON", "save_to_disk"],
            ),
            (
                "dataset-dict-a-list",
                "saved",
                _saved_to_disk("dataset_dict.json", "[1, 2]"),
                ["dataset_dict.json holds a JSON list, not an object"],
            ),
            (
                "split-state-not-json",
                "saved",
                _saved_to_disk("validation/state.json", "{oops"),
                ["validation/state.json is not readable JSON", "save_to_disk"],
            ),
        )
    ],
    # tar shards: a .cls outside the classes of _info.json, and the reader's package missing
    *[
        Row(
            f"validate-wds-label-{name}-out-of-range",
            ["validate.py", "--dataset", "wds/c3", "--data-dir", "{tmp}/w", "--model", "{custom_model_dir}"]
            + VALIDATE_RESULTS,
            2,
            [
                "{tmp}/w/c3-validation-000000.tar:000000004",
                f"label {cls.decode()} (.cls) is out of range",
                "class indices 0..2 for the 3 classes of {tmp}/w/_info.json",
            ],
            setup=_tar_shards_with_label(cls),
            checks=(_absent("out/results.csv"), _no_unlabelled_message),
        )
        for name, cls in (("7", b"7"), ("minus-1", b"-1"))
    ],
    *[
        Row(
            f"{script.removesuffix('.py')}-wds-without-wids-names-the-install",
            [script, *source, "--dataset", "wds/c3", "--model", "{custom_model_dir}", *results],
            2,
            ["--dataset wds/c3 needs the package wids, which is not installed", "pip install wids"],
            setup=_tar_shards_with_label(None),
            files={"shadow/wids/__init__.py": "raise ImportError('No module named wids')\n"},
            env={"PYTHONPATH": f"{{tmp}}/shadow{os.pathsep}{{repo}}"},
            checks=(absent,),
        )
        for script, source, results, absent in (
            ("validate.py", ["--data-dir", "{tmp}/w"], VALIDATE_RESULTS, _absent("out/results.csv")),
            ("inference.py", ["{tmp}/w"], INFERENCE_RESULTS, _no_csv_in("out")),
        )
    ],
    # ------------------------------------------------ resuming
    Row(
        "train-resume-pickle-that-runs-code",
        ["train.py", "--data-dir", "{data}", "--model", "test_resnet", "--device", "cpu"]
        + ["--resume", "{tmp}/evil.pth.tar", "--output", "{tmp}/out"],
        2,
        ["--resume", "refused: loading it would run code"],
        setup=_pickle_that_runs_code("evil.pth.tar"),
        checks=(_absent("pwned"),),
    ),
    Row(
        "train-resume-damaged-summary",
        ["train.py", *RESUMABLE, "--epochs", "2", "--resume", "auto"],
        2,
        ["summary.csv is damaged"],
        setup=_run_with_damaged_summary,
    ),
    Row(
        "train-resume-missing-checkpoint",
        train_args(Path("{fashion4}"), Path("{tmp}"), "r", "--device", "cpu", "--resume", "{tmp}/nope.pth"),
        2,
        ["--resume", "no such checkpoint"],
        checks=(_absent("r"),),
    ),
    Row(
        "train-resume-unreadable-checkpoint",
        train_args(Path("{fashion4}"), Path("{tmp}"), "r", "--device", "cpu", "--resume", "{tmp}/junk.pth.tar"),
        2,
        ["not a readable training checkpoint"],
        files={"junk.pth.tar": b"not a checkpoint"},
        checks=(_absent("r"),),
    ),
    # ------------------------------------------------ run folders: damaged locks, read-only folders (issue 33)
    *[
        Row(
            f"train-damaged-run-lock{suffix}",
            train_args(Path("{fashion4}"), Path("{tmp}"), "run", "--device", "cpu", *extra),
            2,
            ["{tmp}/run/.vtools-run.lock is damaged", "another --experiment", "delete the file", "--resume auto"],
            setup=_damaged_lock,
            checks=(_damaged_lock_left_alone,),
        )
        for suffix, extra in (("", []), ("-resume-auto", ["--resume", "auto"]))
    ],
    Row(
        "train-read-only-run-folder-new-run",
        train_args(Path("{fashion4}"), Path("{tmp}"), "run", "--device", "cpu"),
        2,
        ["the run folder {tmp}/run is not writable", "chmod -R u+w", "another --experiment"],
        setup=_read_only_folder,
        checks=(_still_empty("run"),),
        as_user=True,
    ),
    *[
        Row(
            f"train-read-only-run-folder-resume-auto{suffix}",
            ["train.py", *RESUMABLE, "--epochs", "2", "--resume", "auto"],
            2,
            ["the run folder {tmp}/run is not writable", "chmod -R u+w"],
            setup=_finished_run_made_read_only(everything),
            checks=(_run_folder_unchanged,),
            as_user=True,
        )
        for suffix, everything in (("", False), ("-files-too", True))
    ],
    # ------------------------------------------------ configuration files
    *[
        Row(
            name,
            ["train.py", "-c", "{tmp}/run.yaml", "--output", "{tmp}/out"],
            2,
            [fragment],
            files={"run.yaml": f"data-dir: {{data}}\n{line}\n"},
        )
        for name, line, fragment in YAML_VALUES
    ],
    *[
        Row(
            name,
            ["train.py", "-c", "{tmp}/bad.yaml"],
            2,
            [fragment],
            files={"bad.yaml": f"data-dir: {{fashion4}}\n{line}\n"},
        )
        for name, line, fragment in YAML_TYPES
    ],
    Row(
        "yaml-unknown-key",
        ["train.py", "-c", "{tmp}/bad.yaml"],
        2,
        ["unknown key 'learning-rate'"],
        files={"bad.yaml": "data-dir: {fashion4}\nmodel: test_resnet\nlearning-rate: 0.1\n"},
    ),
    Row(
        "yaml-unknown-key-suggests",
        ["train.py", "-c", "{tmp}/bad.yaml"],
        2,
        ["unknown key 'warmup_epoch'", "did you mean 'warmup_epochs'"],
        files={"bad.yaml": "data-dir: {fashion4}\nwarmup_epoch: 1\n"},
    ),
    Row(
        "yaml-not-utf8",
        ["train.py", "-c", "{tmp}/run.yaml"],
        2,
        ["is not UTF-8 text"],
        files={"run.yaml": b"lr: \xff\xfe\n"},
    ),
    Row("yaml-is-a-folder", ["train.py", "-c", "{tmp}"], 2, ["is a folder, not a YAML file"]),
    # ------------------------------------------------ training
    Row(
        "train-sync-bn-on-cpu",
        train_args(Path("{fashion4}"), Path("{tmp}"), "s", "--device", "cpu", "--sync-bn"),
        2,
        ["--sync-bn needs an accelerator"],
        cpu_only="a refusal specific to cpu",
    ),
    Row(
        "train-unavailable-dist-backend",
        train_args(Path("{fashion4}"), Path("{tmp}"), "d", "--device", "cpu", "--dist-backend", "hccl"),
        2,
        ["'hccl' for cpu is not available"],
    ),
    Row(
        "train-mixup-needs-an-even-batch",
        train_args(Path("{fashion4}"), Path("{tmp}"), "odd", "--device", "cpu", "--batch-size", "3", "--mixup", "0.2"),
        2,
        ["--batch-size must be even"],
    ),
    Row(
        "train-model-kwargs-that-a-flag-sets",
        train_args(Path("{fashion4}"), Path("{tmp}"), "kw", "--device", "cpu", "--model-kwargs", "drop_rate=0.3"),
        2,
        ["--model-kwargs drop_rate: train.py sets it with --drop"],
    ),
    Row(
        "train-num-classes-fewer-than-the-data",
        train_args(Path("{fashion4}"), Path("{tmp}"), "r", "--device", "cpu", "--num-classes", "2"),
        2,
        ["--num-classes 2 is fewer than the 4 classes of", "leave --num-classes out"],
        checks=(_absent("r"),),
    ),
    Row(
        "train-no-readable-training-image",
        train_args(Path("{tmp}/data"), Path("{tmp}"), "none", "--device", "cpu", "--epochs", "1")
        + ["--batch-size", "2", "--on-bad-image", "skip"],
        2,
        ["no readable training image is left"],
        setup=_only_empty_training_images,
        cpu_only="decoding is host-side; the run stops before training",
    ),
    Row(
        "train-missing-tensorboard-names-the-install",
        train_args(Path("{fashion4}"), Path("{tmp}"), "run", "--device", "cpu", "--epochs", "1", "--log-tensorboard"),
        2,
        ["--log-tensorboard needs the package tensorboard", "requirements-track.txt"],
        files={"shadow/tensorboard/__init__.py": "raise ImportError('No module named tensorboard')\n"},
        env={"PYTHONPATH": f"{{tmp}}/shadow{os.pathsep}{{repo}}"},
        checks=(_absent("run"),),
        cpu_only="logging and drawing are host-side; device training: tests/scripts/test_train.py",
    ),
    # A diverged run is not bad input: its own exit code, 3 (a huge mean: the inputs overflow float32).
    Row(
        "train-non-finite-loss-names-epoch-and-step",
        train_args(Path("{fashion4}"), Path("{tmp}"), "nan", DEVICE, "--mean", "3e38", "3e38", "3e38"),
        3,
        ["the loss overflowed at epoch 0 step 0 (it became"],
        cpu_only=None,
    ),
    # ------------------------------------------------ devices: missing, broken, hidden, out of range
    *[
        Row(
            f"{script.removesuffix('.py')}-malformed-device",
            [script, *DATA_OF[script], "--device", "npu:x"],
            2,
            ["malformed --device 'npu:x'"],
            cpu_only=DEVICE_SITUATION,
        )
        for script in ("train.py", "validate.py", "inference.py")
    ],
    Row(
        "negative-device-index",
        ["validate.py", "--device", "cuda:-1"],
        2,
        ["malformed", "cuda:-1"],
        cpu_only=DEVICE_SITUATION,
    ),
    Row(
        "unknown-device-type",
        ["inference.py", *DATA_OF["inference.py"], "--device", "quantum"],
        2,
        ["unknown device type 'quantum'"],
        cpu_only=DEVICE_SITUATION,
    ),
    Row(
        "backend-not-installed",
        ["train.py", *DATA_OF["train.py"], "--device", "npu"],
        2,
        ["needs the package torch_npu, which is not installed", "torch"],
        cpu_only=DEVICE_SITUATION,
    ),
    # torch_npu importable but failing (no CANN), with autoload off so torch itself imports
    Row(
        "backend-installed-but-broken",
        ["validate.py", "--device", "npu"],
        2,
        ["torch_npu is installed but failed to load", "libascendcl.so", "set_env.sh"],
        setup=broken_torch_npu_package,
        env={"PYTHONPATH": "{tmp}:{repo}", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        cpu_only=DEVICE_SITUATION,
    ),
    *[
        Row(
            f"{script.removesuffix('.py')}-backend-breaks-import-torch",
            [script, *DATA_OF[script], "--device", "cpu"],
            2,
            ["Failed to load the backend extension", "TORCH_DEVICE_BACKEND_AUTOLOAD=0", "set_env.sh", "libhccl.so"],
            setup=broken_autoload_backend,
            env={"PYTHONPATH": "{tmp}:{repo}"},
            cpu_only=DEVICE_SITUATION,
        )
        for script in ("train.py", "validate.py", "inference.py")
    ],
    # the emulated npu with every device hidden: the type exists, no device is visible
    Row(
        "device-type-present-but-unavailable",
        ["validate.py", "--device", "npu", "--device-modules", EMULATED_NPU_MODULE],
        2,
        ["no device is available", "ASCEND_RT_VISIBLE_DEVICES="],
        env={"ASCEND_RT_VISIBLE_DEVICES": ""},
        cpu_only=DEVICE_SITUATION,
    ),
    Row(
        "device-index-out-of-range-names-visibility",
        ["inference.py", *DATA_OF["inference.py"], "--device", "npu:3", "--device-modules", EMULATED_NPU_MODULE],
        2,
        ["npu:3 requested, 2 visible; ASCEND_RT_VISIBLE_DEVICES=4,5"],
        env={"ASCEND_RT_VISIBLE_DEVICES": "4,5"},
        cpu_only=DEVICE_SITUATION,
    ),
    Row(
        "unimportable-device-module",
        ["train.py", *DATA_OF["train.py"], "--device", "npu", "--device-modules", "no_such_mod"],
        2,
        ["--device-modules: cannot import 'no_such_mod'"],
        cpu_only=DEVICE_SITUATION,
    ),
    # issue 21: inputs that ended in a traceback, and the refusals that keep a run from doing something else
    *[
        Row(
            f"train-{case}",
            ["train.py", "--data-dir", "{fashion4}", "--model", "test_resnet", "--epochs", "1", *extra],
            2,
            fragments,
            files={"afile": "not a folder"},
        )
        for case, extra, fragments in (
            ("output-is-a-file", ["--output", "{tmp}/afile"], ["--output {tmp}/afile is a file, not a folder"]),
            ("output-under-a-file", ["--output", "{tmp}/afile/sub"], ["--output {tmp}/afile/sub: cannot create it"]),
            ("output-under-proc", ["--output", "/proc/vtools-out"], ["--output /proc/vtools-out: cannot create it"]),
            (
                "experiment-is-a-file",
                ["--output", "{tmp}", "--experiment", "afile"],
                ["--experiment afile: {tmp}/afile is a file, not a run folder"],
            ),
            ("negative-lr", ["--output", "{tmp}/out", "--lr", "-1"], ["--lr must be 0 or more, got -1.0"]),
            ("smoothing-above-1", ["--output", "{tmp}/out", "--smoothing", "1.5"], ["--smoothing must be from 0"]),
            ("drop-above-1", ["--output", "{tmp}/out", "--drop", "1.5"], ["--drop must be from 0"]),
            (
                "negative-early-stop-patience",
                ["--output", "{tmp}/out", "--early-stop-patience", "-1"],
                ["--early-stop-patience must be 0 or more, got -1"],
            ),
            (
                "class-weights-file-missing",
                ["--output", "{tmp}/out", "--class-weights", "{tmp}/none.json"],
                ["--class-weights {tmp}/none.json: cannot read it (FileNotFoundError"],
            ),
            (
                "class-weights-not-weights",
                ["--output", "{tmp}/out", "--class-weights", "{tmp}/afile"],
                ["--class-weights {tmp}/afile: expected class,weight rows or a JSON object/list of weights"],
            ),
            (
                "eval-metric-map-on-single-label-data",
                ["--output", "{tmp}/out", "--eval-metric", "map"],
                ["--eval-metric map needs multi-label data; {fashion4}/train (240 images) has one label per image"],
            ),
            (
                "balanced-sampler-with-aug-repeats",
                ["--output", "{tmp}/out", "--balanced-sampler", "--aug-repeats", "2"],
                ["--balanced-sampler and --aug-repeats each choose the epoch's order: give one of them"],
            ),
        )
    ],
    *[
        Row(
            f"{flag.lstrip('-')}-on-multi-label-data",
            ["train.py", "--data-dir", "{tmp}/ml", "--model", "test_resnet", "--output", "{tmp}/out", flag, *value],
            2,
            [
                f"{flag} balances single-label classes; {{tmp}}/ml/train (2 images, multi-label: 2 classes from "
                "labels.csv) is multi-label"
            ],
            files={"ml/train/labels.csv": "a.png,cat\nb.png,dog\n", "ml/validation/labels.csv": "c.png,cat\n"},
        )
        for flag, value in (("--class-weights", ["balanced"]), ("--balanced-sampler", []))
    ],
    Row(
        "multi-label-training-with-single-label-validation",
        ["train.py", "--data-dir", "{tmp}/ml", "--model", "test_resnet", "--output", "{tmp}/out"],
        2,
        ["{tmp}/ml/train (2 images, multi-label: 2 classes from labels.csv) is multi-label but {tmp}/ml/validation"],
        files={"ml/train/labels.csv": "a.png,cat\nb.png,dog\n", "ml/validation/cat/c.png": "not an image"},
    ),
    Row(
        "validate-metrics-avg-on-multi-label-data",
        ["validate.py", "{tmp}/ml", "--model", "{custom_model_dir}", "--split", "train", "--metrics-avg", "macro"],
        2,
        [
            "--metrics-avg scores single-label data; {tmp}/ml/train (2 images, multi-label: 3 classes from "
            "labels.csv) is multi-label"
        ],
        files={"ml/train/labels.csv": "a.png,cat\nb.png,dog\n"},
    ),
    Row(
        "yaml-names-one-option-twice",
        ["train.py", "-c", "{tmp}/run.yaml"],
        2,
        ["'batch_size' and 'batch-size' are the same option, given twice"],
        files={"run.yaml": "data-dir: {fashion4}\nbatch_size: 64\nbatch-size: 32\n"},
        checks=(_absent("runs"),),
    ),
    Row(
        "device-module-that-raises",
        ["validate.py", "{custom_images}", "--model", "{custom_model_dir}", "--device-modules", "raising_backend"],
        2,
        ["--device-modules: importing 'raising_backend' failed (RuntimeError: no driver)"],
        files={"raising_backend.py": "raise RuntimeError('no driver')\n"},
        env={"PYTHONPATH": "{tmp}:{repo}"},
        cpu_only=DEVICE_SITUATION,
    ),
    *[
        Row(
            f"{script.removesuffix('.py')}-under-torchrun",
            [script, "{custom_images}", "--model", "{custom_model_dir}"],
            2,
            [f"{script} runs in one process, but torchrun started 2"],
            env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"},
        )
        for script in ("validate.py", "inference.py")
    ],
    Row(
        "unreachable-hub-said-at-once-without-retries",
        ["validate.py", "{custom_images}", *NEEDS_DOWNLOAD],
        2,
        ["the Hugging Face Hub cannot be used (127.0.0.1", "not in the local cache", "local model folder"],
        env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": "{tmp}/hf", "HF_HUB_OFFLINE": None},
    ),
    # issue 33: an output path that is one of the command's inputs, lies inside its data, would hold another
    # model's result, or cannot be written: refused in one line before any model is built, nothing written
    Row(
        "validate-results-file-is-the-models-config",
        ["validate.py", "{custom_images}", "--model", "{tmp}/model", "--results-file", "{tmp}/model/config.json"],
        2,
        ["--results-file {tmp}/model/config.json would write over the model's config.json"],
        setup=_model_copies("model"),
        checks=(_model_intact,),
    ),
    Row(  # the side file a results file brings is checked as the results file is
        "validate-results-files-fallback-list-is-the-class-map",
        [
            "validate.py",
            "{custom_images}",
            "--model",
            "{custom_model_dir}",
            "--class-map",
            "{tmp}/cm/r.cpu_fallbacks.csv",
        ]
        + ["--results-file", "{tmp}/cm/r.csv"],
        2,
        [
            "the --results-file's cpu fallbacks list {tmp}/cm/r.cpu_fallbacks.csv would write over --class-map "
            "{tmp}/cm/r.cpu_fallbacks.csv"
        ],
        files={"cm/r.cpu_fallbacks.csv": "cat\ndog\nfox\n"},
        checks=(_intact("cm/r.cpu_fallbacks.csv", "cat\ndog\nfox\n"), _absent("cm/r.csv")),
    ),
    *[
        Row(
            f"validate-report-inside-the-data-{how}",
            ["validate.py", "{tmp}/imgs", "--model", "{custom_model_dir}", "--report", report],
            2,
            [f"--report {report} is inside the data folder {{tmp}}/imgs"],
            setup=_images_copy,
            checks=(_classes_unchanged("imgs", ["cat", "dog", "fox"]), _classes_unchanged("imgs/cat", IMAGES_OF_CAT)),
        )
        for how, report in (
            ("split", "{tmp}/imgs/rep"),
            ("class-folder", "{tmp}/imgs/cat"),
            ("through-a-symlink", "{tmp}/link/cat/rep"),
            ("through-dotdot", "{tmp}/out/../imgs/rep"),
        )
    ],
    Row(
        "validate-two-run-models-one-report-folder",
        ["validate.py", "{custom_images}", "--model", "{tmp}/x/a/model,{tmp}/y/a/model", "--report", "{tmp}/R"],
        2,
        ["the --report of {tmp}/x/a/model {tmp}/R/a and the --report of {tmp}/y/a/model {tmp}/R/a are one path"],
        setup=_model_copies("x/a/model", "y/a/model"),
        checks=(_absent("R"),),
    ),
    Row(
        "validate-one-bad-model-of-two-keeps-the-others-rows",
        ["validate.py", "{custom_images}", "--model", "{custom_model_dir},{tmp}/nosuch/model", *VALIDATE_RESULTS],
        2,
        ["1 of 2 models failed: --model {tmp}/nosuch/model: no such model folder", "results of the other 1 are in"],
        checks=(_rows_of("out/results.csv", "{custom_model_dir}"),),
    ),
    Row(
        "validate-one-model-of-two-fails-on-its-own",
        ["validate.py", "{custom_images}", "--model", "{tmp}/nan,{custom_model_dir}", *VALIDATE_RESULTS],
        3,
        ["1 of 2 models failed: {tmp}/nan: the loss over 12 images is nan", "results of the other 1 are in"],
        setup=_nan_weights_model,
        checks=(_rows_of("out/results.csv", "{custom_model_dir}"),),
    ),
    Row(  # said before the data is read or the model built: neither exists here
        "validate-results-file-under-proc",
        ["validate.py", "{custom_images}", *NEEDS_DOWNLOAD, "--results-file", "/proc/vtools-r.csv"],
        2,
        ["--results-file /proc/vtools-r.csv: folder /proc is not writable"],
        env=OFFLINE,
    ),
    Row(
        "validate-report-under-proc",
        ["validate.py", "{custom_images}", "--model", "{custom_model_dir}", "--report", "/proc/vtools-report"],
        2,
        ["--report /proc/vtools-report: cannot create folder /proc/vtools-report"],
    ),
    Row(
        "validate-report-under-a-file",
        ["validate.py", "{custom_images}", "--model", "{custom_model_dir}", "--report", "{tmp}/a_file/rep"],
        2,
        ["--report {tmp}/a_file/rep: cannot create folder {tmp}/a_file/rep (Not a directory)"],
        files={"a_file": "x"},
        checks=(_blocker_intact,),
    ),
    *[
        Row(
            f"validate-{flag.strip('-')}-in-a-read-only-folder",
            ["validate.py", "{custom_images}", "--model", "{custom_model_dir}", flag, "{tmp}/run/out"],
            2,
            [fragment],
            setup=_read_only_folder,
            checks=(_still_empty("run"),),
            as_user=True,
        )
        for flag, fragment in (
            ("--results-file", "--results-file {tmp}/run/out: folder {tmp}/run is not writable (Permission denied)"),
            ("--report", "--report {tmp}/run/out: cannot create folder {tmp}/run/out (Permission denied)"),
        )
    ],
    Row(
        "inference-results-in-a-read-only-folder",
        ["inference.py", "{custom_images}", "--model", "{custom_model_dir}", "--results-dir", "{tmp}/run"],
        2,
        ["results file {tmp}/run/custom_model", "folder {tmp}/run is not writable (Permission denied)"],
        setup=_read_only_folder,
        checks=(_still_empty("run"),),
        as_user=True,
    ),
    Row(
        "inference-results-inside-the-source",
        ["inference.py", "{tmp}/imgs", "--model", "{custom_model_dir}", "--results-dir", "{tmp}/imgs/out"],
        2,
        ["results file {tmp}/imgs/out/custom_model", "is inside SOURCE {tmp}/imgs"],
        setup=_images_copy,
        checks=(_absent("imgs/out"),),
    ),
    Row(
        "inference-results-file-is-the-models-config",
        [
            "inference.py",
            "{custom_images}",
            "--model",
            "{tmp}/model",
            "--results-dir",
            "{tmp}/model",
            "--results-file",
            "config",
            "--results-format",
            "json",
        ],
        2,
        ["results file {tmp}/model/config.json would write over the model's config.json"],
        setup=_model_copies("model"),
        checks=(_model_intact,),
    ),
    Row(
        "train-output-inside-the-data",
        train_args(Path("{tmp}/data"), Path("{tmp}/data/train"), "run", "--device", "cpu"),
        2,
        ["--output {tmp}/data/train is inside the data folder {tmp}/data"],
        setup=_data_copy,
        checks=(_classes_unchanged("data/train", CLASSES),),
    ),
    Row(
        "train-experiment-is-the-data",
        train_args(Path("{tmp}/data"), Path("{tmp}"), "data", "--device", "cpu"),
        2,
        ["--experiment data: {tmp}/data is the data folder {tmp}/data"],
        setup=_data_copy,
        checks=(_classes_unchanged("data", ["train", "val"]),),
    ),
    Row(
        "train-output-is-proc",
        train_args(Path("{fashion4}"), Path("/proc"), None, "--device", "cpu"),
        2,
        ["--output /proc: folder /proc is not writable"],
    ),
    Row(
        "export-output-is-the-models-weights",
        [
            "-m",
            "vtools",
            "export",
            "{tmp}/model",
            "--data",
            "{custom_images}",
            "--output",
            "{tmp}/model/model.safetensors",
        ],
        2,
        ["--output {tmp}/model/model.safetensors would write over the model's model.safetensors"],
        setup=_model_copies("model"),
        checks=(_model_intact,),
    ),
    Row(
        "compare-output-is-a-reports-file",
        ["-m", "vtools", "compare", "{tmp}/a", "{tmp}/b", "--output", "{tmp}/a/overall.csv"],
        2,
        ["--output {tmp}/a/overall.csv would write over REPORT {tmp}/a's overall.csv"],
        files=REPORT_FILES,
        checks=(_intact("a/overall.csv", REPORT_FILES["a/overall.csv"]),),
    ),
    Row(
        "compare-a-per-class-table-that-is-not-text",
        ["-m", "vtools", "compare", "{tmp}/a", "{tmp}/b"],
        2,
        ["{tmp}/b/per_class.csv: not a CSV table of a class report (UnicodeDecodeError"],
        files={**REPORT_FILES, "b/per_class.csv": bytes(range(128, 256))},
    ),
    Row(
        "compare-a-per-class-table-without-classes",
        ["-m", "vtools", "compare", "{tmp}/a", "{tmp}/b"],
        2,
        ["{tmp}/b/per_class.csv: not a CSV table of a class report (no column class)"],
        files={**REPORT_FILES, "b/per_class.csv": "name,top1\ncat,100.0\n"},
    ),
    # a run folder's files are that run's: another command's output never replaces them
    Row(
        "compare-output-is-another-runs-weights",
        ["-m", "vtools", "compare", "{tmp}/a", "{tmp}/runs/B", "--output", "{tmp}/runs/B/model/model.safetensors"],
        2,
        ["--output {tmp}/runs/B/model/model.safetensors would replace model/model.safetensors of the run {tmp}/runs/B"],
        files={"a/overall.csv": REPORT_FILES["a/overall.csv"], "a/per_class.csv": REPORT_FILES["a/per_class.csv"]},
        setup=_ledgered(
            "runs/B",
            {"model/model.safetensors": "weights", "eval/overall.csv": REPORT_FILES["a/overall.csv"]}
            | {"eval/per_class.csv": REPORT_FILES["a/per_class.csv"]},
        ),
        checks=(_intact("runs/B/model/model.safetensors", "weights"),),
    ),
    Row(
        "plot-output-is-the-runs-class-report",
        ["-m", "vtools", "plot", "{tmp}/run", "-o", "{tmp}/run/eval/per_class.csv"],
        2,
        ["--output {tmp}/run/eval/per_class.csv would replace eval/per_class.csv of the run {tmp}/run"],
        setup=_ledgered("run", {"summary.csv": SUMMARY, "eval/per_class.csv": "class,top1\n"}),
        checks=(_intact("run/eval/per_class.csv", "class,top1\n"),),
    ),
    Row(
        "validate-results-file-is-another-runs-summary",
        [
            "validate.py",
            "{custom_images}",
            "--model",
            "{custom_model_dir}",
            "--results-file",
            "{tmp}/runs/B/summary.csv",
        ],
        2,
        ["--results-file {tmp}/runs/B/summary.csv would replace summary.csv of the run {tmp}/runs/B"],
        setup=_ledgered("runs/B", {"summary.csv": SUMMARY}),
        checks=(_intact("runs/B/summary.csv", SUMMARY),),
    ),
    Row(
        "validate-results-file-in-another-runs-folder",
        ["validate.py", "{custom_images}", "--model", "{custom_model_dir}", "--results-file", "{tmp}/runs/B/mine.csv"],
        2,
        ["--results-file {tmp}/runs/B/mine.csv is inside the run folder {tmp}/runs/B, which this command does"],
        setup=_ledgered("runs/B", {"summary.csv": SUMMARY}),
        checks=(_absent("runs/B/mine.csv"),),
    ),
    Row(
        "plot-output-is-the-runs-summary",
        ["-m", "vtools", "plot", "{tmp}/run", "-o", "{tmp}/run/summary.csv"],
        2,
        ["--output {tmp}/run/summary.csv would write over RUN {tmp}/run's summary"],
        files={"run/summary.csv": SUMMARY},
        checks=(_intact("run/summary.csv", SUMMARY),),
    ),
    Row(
        "plot-several-runs-name-their-picture",
        ["-m", "vtools", "plot", "{tmp}/a", "{tmp}/b"],
        2,
        ["2 runs are drawn into one picture: name it with -o PNG"],
        files={"a/summary.csv": SUMMARY, "b/summary.csv": SUMMARY},
        checks=(_no_picture_in_the_repository, _absent("a/curves.png"), _absent("b/curves.png")),
    ),
    Row(
        "shards-out-inside-the-folder",
        ["-m", "vtools", "shards", "{tmp}/imgs", "{tmp}/imgs/cat/shards"],
        2,
        ["OUT {tmp}/imgs/cat/shards is inside FOLDER {tmp}/imgs"],
        setup=_images_copy,
        checks=(_classes_unchanged("imgs/cat", IMAGES_OF_CAT),),
    ),
    Row(
        "bench-output-inside-the-data",
        ["-m", "benchmarks", "--data", "{tmp}/imgs", "--output", "{tmp}/imgs/bench.csv"],
        2,
        ["--output {tmp}/imgs/bench.csv is inside --data {tmp}/imgs"],
        setup=_images_copy,
        checks=(_absent("imgs/bench.csv"),),
    ),
    Row(
        "parity-results-file-is-the-models-weights",
        ["-m", "vtools", "parity", "{tmp}/model", "--results-file", "{tmp}/model/model.safetensors"],
        2,
        ["--results-file {tmp}/model/model.safetensors would write over the model's model.safetensors"],
        setup=_model_copies("model"),
        checks=(_model_intact,),
    ),
    # parity --train reads what a training run reads: its results file goes nowhere near any of it
    Row(
        "parity-train-results-file-is-the-models-weights",
        ["-m", "vtools", "parity", "--train", "--data-dir", "{data}", "--model", "{tmp}/model"]
        + ["--results-file", "{tmp}/model/model.safetensors"],
        2,
        ["--results-file {tmp}/model/model.safetensors would write over the model's model.safetensors"],
        setup=_model_copies("model"),
        checks=(_model_intact,),
    ),
    Row(
        "parity-train-results-file-is-the-run-file",
        ["-m", "vtools", "parity", "--train", "-c", "{tmp}/run.yaml", "--results-file", "{tmp}/run.yaml"],
        2,
        ["--results-file {tmp}/run.yaml would write over -c {tmp}/run.yaml"],
        files={"run.yaml": "data-dir: {data}\nmodel: test_resnet\n"},
    ),
    Row(
        "parity-train-results-file-is-the-class-weights",
        ["-m", "vtools", "parity", "--train", "--data-dir", "{data}", "--model", "test_resnet"]
        + ["--class-weights", "{tmp}/w.csv", "--results-file", "{tmp}/w.csv"],
        2,
        ["--results-file {tmp}/w.csv would write over --class-weights {tmp}/w.csv"],
        files={"w.csv": "bag,2\n"},
        checks=(_intact("w.csv", "bag,2\n"),),
    ),
    # issue 33, an adversarial probe: refusals that a YAML file slipped past, a teacher of other classes,
    # values no transform means, misleading names and hints, and inputs that ended in a traceback or a hang
    *[
        Row(
            f"yaml-refused-{name}",
            ["train.py", "-c", "{tmp}/run.yaml", "--output", "{tmp}/out", *flags],
            2,
            [fragment],
            files={"run.yaml": f"data-dir: {{fashion4}}\nmodel: test_resnet\nepochs: 1\n{line}\n"},
            checks=(_absent("out"),),
        )
        for name, line, flags, fragment in (
            ("aug-splits", "aug-splits: 2", [], "--aug-splits 2: AugMix split batches"),
            ("aug-splits-and-flag", "aug-splits: 2", ["--aug-splits", "2"], "--aug-splits 2: AugMix split batches"),
            ("torchscript", "torchscript: true", [], "--torchscript: TorchScript is deprecated"),
            ("mlflow-artifacts-alone", "mlflow-artifacts: true", [], "--mlflow-artifacts uploads to MLflow: add --log"),
            ("naflex-loader", "naflex-loader: true", [], "--naflex-loader: variable-resolution"),
            ("worker-seeding", "worker_seeding: part", [], "--worker-seeding part: vtools seeds every sample"),
        )
    ],
    Row(
        "timm-args-yaml-feature-distillation",
        [
            "train.py",
            "-c",
            "{tmp}/args.yaml",
            "--data-dir",
            "{fashion4}",
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--output",
            "{tmp}/out",
        ],
        2,
        ["--kd-distill-type feature: feature and token distillation"],
        setup=_timm_args_yaml(
            "--model", "test_resnet", "--kd-model-name", "test_resnet", "--kd-distill-type", "feature"
        ),
        checks=(_absent("out"),),
    ),
    Row(
        "train-teacher-of-other-classes",
        train_args(Path("{fashion4}"), Path("{tmp}"), "r", "--device", "cpu", "--kd-model-name", "{tmp}/teacher"),
        2,
        ["--kd-model-name {tmp}/teacher predicts 10 classes and the student 4", "random one"],
        setup=_teacher_of(10),
        checks=(_absent("r"),),
        cpu_only="the teacher is checked as it is built, before the first step",
    ),
    Row(
        "train-teacher-errors-name-kd-model-name",
        train_args(Path("{fashion4}"), Path("{tmp}"), "r", "--device", "cpu", "--kd-model-name", "resnet5O"),
        2,
        ["--kd-model-name: unknown model 'resnet5O'"],
        checks=(_absent("r"),),
        cpu_only="the teacher is checked as it is built, before the first step",
    ),
    *[
        Row(
            f"{script.removesuffix('.py')}-crop-pct-{value}",
            [script, "{custom_images}", "--model", "{custom_model_dir}", "--crop-pct", value, *results],
            2,
            ["--crop-pct must be above 0 and at most 2", *more],
            checks=(check,),
        )
        for script, results, check in (
            ("validate.py", VALIDATE_RESULTS, _absent("out/results.csv")),
            ("inference.py", INFERENCE_RESULTS, _no_csv_in("out")),
        )
        for value, more in (("0", ["got 0"]), ("50", ["a percentage? 50 % is 0.5"]))
    ],
    *[
        Row(
            name,
            ["train.py", "-c", "{tmp}/bad.yaml"],
            2,
            [fragment],
            files={"bad.yaml": f"data-dir: {{fashion4}}\n{line}\n"},
        )
        for name, line, fragment in (
            ("yaml-crop-pct-percentage", "crop-pct: 87.5", "got 87.5 (a percentage? 87.5 % is 0.875)"),
            ("yaml-epochs-inf", "epochs: .inf", "key 'epochs' expects an integer, got inf"),
            ("yaml-epochs-nan", "epochs: .nan", "key 'epochs' expects an integer, got nan"),
            ("yaml-list-as-a-key", "[a, b]: 1", "line 2: a key must be an option name, not a list"),
            ("yaml-misspelt-learning-rate", "lerning-rate: 0.1", "unknown key 'lerning-rate' (did you mean 'lr'?)"),
        )
    ],
    *[
        Row(
            f"{script.removesuffix('.py')}-amp-with-a-model-dtype",
            [*args, "--amp", "--amp-dtype", "float16", "--model-dtype", "bfloat16"],
            2,
            ["--amp with --model-dtype bfloat16", "use one of them"],
        )
        for script, args in (
            ("train.py", train_args(Path("{fashion4}"), Path("{tmp}"), "r", "--device", "cpu")),
            ("validate.py", ["validate.py", "{custom_images}", "--model", "{custom_model_dir}"]),
            ("inference.py", ["inference.py", "{custom_images}", "--model", "{custom_model_dir}"]),
        )
    ],
    Row(
        "inference-in-chans-and-input-size-disagree",
        [
            "inference.py",
            "{custom_images}",
            "--model",
            "{custom_model_dir}",
            "--in-chans",
            "3",
            "--input-size",
            "1",
            "32",
            "32",
        ],
        2,
        ["--in-chans 3 and --input-size 1 32 32 disagree on the number of input channels"],
    ),
    *[
        Row(
            f"{script.removesuffix('.py')}-slurm-ntasks-not-a-number",
            [script, "{custom_images}", "--model", "{custom_model_dir}", "--device", "cpu"],
            2,
            ["SLURM_NTASKS='abc' is not a whole number of 1 or more"],
            env={"SLURM_PROCID": "0", "SLURM_NTASKS": "abc"},
        )
        for script in ("train.py", "validate.py", "inference.py")
    ],
    # without the check, rank 5 of 2 waits in the rendezvous for ranks that never come, silent, forever
    Row(
        "train-slurm-rank-outside-the-tasks",
        train_args(Path("{fashion4}"), Path("{tmp}"), "r", "--device", "cpu"),
        2,
        ["SLURM_PROCID=5 is not below SLURM_NTASKS=2", "wait forever"],
        env={"SLURM_PROCID": "5", "SLURM_NTASKS": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
        checks=(_absent("r"),),
    ),
    Row(
        "parity-against-names-its-flag",
        ["-m", "vtools", "parity", "{custom_model_dir}", "--device", "cpu", "--against", "npu:x"],
        2,
        ["malformed --against 'npu:x'"],
        checks=(_names_no_other_flag("--device"),),
        cpu_only=DEVICE_SITUATION,
    ),
    Row(
        "parity-against-a-missing-backend",
        ["-m", "vtools", "parity", "{custom_model_dir}", "--device", "cpu", "--against", "npu"],
        2,
        ["--against npu needs the package torch_npu", "python3 -m tests.emulated_npu <script> ... --against npu"],
        cpu_only=DEVICE_SITUATION,
    ),
    Row(
        "parity-bad-image-suggests-no-foreign-flag",
        ["-m", "vtools", "parity", "{custom_model_dir}", "--device", "cpu", "--data", "{tmp}/imgs"],
        2,
        ["--data: cannot use image {tmp}/imgs/broken.png", "remove it from --data"],
        files={"imgs/broken.png": b"not an image"},
        checks=(_names_no_other_flag("--on-bad-image"),),
    ),
    Row(
        "validate-npu-without-torch-npu-names-the-emulator",
        ["validate.py", "--device", "npu"],
        2,
        [
            "needs the package torch_npu",
            "no NPU at hand?",
            "python3 -m tests.emulated_npu validate.py ... --device npu",
        ],
        cpu_only=DEVICE_SITUATION,
    ),
    Row(
        "train-dist-timeout-past-a-910a-collective-range",
        train_args(Path("{fashion4}"), Path("{tmp}"), "run", *device_flags("npu"), "--dist-timeout", "20000"),
        2,
        ["--dist-timeout 20000: HCCL_EXEC_TIMEOUT would be 20040 s", "takes 1 to 17340 s", "17300 or less"],
        env={"VTOOLS_EMU_NPU_CHIP": "910A"},
        checks=(_absent("run"),),
        cpu_only="a 910A's collective range (the chip table): the emulated npu poses as one",
    ),
    Row(
        "train-overflow-on-a-910a-is-seen-by-its-flag-and-advises-full-precision",
        train_args(
            Path("{fashion4}"), Path("{tmp}"), "nan", *device_flags("npu"), "--amp", "--mean", "3e38", "3e38", "3e38"
        ),
        3,
        [
            "the loss overflowed at epoch 0 step 0 (the chip saturates: its float-status flag rose",
            "train without --amp (no bfloat16 here)",
        ],
        env={"VTOOLS_EMU_NPU_CHIP": "910A"},
        checks=(_names_no_other_flag("--amp-dtype bfloat16"),),
        cpu_only="a 910A's situation (no bfloat16): the emulated npu poses as one with VTOOLS_EMU_NPU_CHIP=910A",
    ),
    *[
        Row(
            f"train-misspelt-{flag.lstrip('-')}",
            ["train.py", "--data-dir", "{data}", flag, "1"],
            2,
            [f"did you mean {meant}?"],
        )
        for flag, meant in (
            ("--lerning-rate", "--lr"),
            ("--learning-rate", "--lr"),
            ("--min-learning-rate", "--min-lr"),
            ("--optimizer", "--opt"),
            ("--lr-scheduler", "--sched"),
            ("--data-path", "--data-dir"),
        )
    ],
    # ------------------------------------------------ unreadable entries, empty class folders (issue 33)
    Row(
        "validate-dangling-link-in-a-class-folder",
        ["validate.py", "{tmp}/imgs", *NEEDS_DOWNLOAD, *VALIDATE_RESULTS],
        2,
        [
            "cannot read image {tmp}/imgs/dog/dog_1.png: reading failed (a link to {tmp}/imgs/nowhere.png, which "
            "does not exist)",
            "--on-bad-image skip",
        ],
        setup=_imgs_with(_dangling_link),
        env=OFFLINE,
        checks=(_absent("out/results.csv"), _no_download_mentioned),
    ),
    Row(
        "inference-dangling-link-in-the-folder",
        ["inference.py", "{tmp}/imgs", *NEEDS_DOWNLOAD, *INFERENCE_RESULTS],
        2,
        ["cannot read image {tmp}/imgs/dog/dog_1.png: reading failed (a link to", "--on-bad-image skip"],
        setup=_imgs_with(_dangling_link),
        env=OFFLINE,
        checks=(_no_csv_in("out"), _no_download_mentioned),
    ),
    Row(
        "inference-list-names-a-missing-file",
        ["inference.py", "{tmp}/list.txt", "--model", "{custom_model_dir}", *INFERENCE_RESULTS],
        2,
        ["cannot read image {tmp}/gone.png: reading failed (listed in {tmp}/list.txt, but it does not exist)"],
        files={"list.txt": "gone.png\n"},
        checks=(_no_csv_in("out"),),
    ),
    Row(
        "validate-sub-folder-that-cannot-be-listed",
        ["validate.py", "{tmp}/imgs", "--model", "{custom_model_dir}", *VALIDATE_RESULTS],
        2,
        ["cannot read image {tmp}/imgs/cat/private: reading failed (PermissionError: the folder cannot be listed"],
        setup=_imgs_with(_unlistable_sub_folder),
        checks=(_absent("out/results.csv"),),
        as_user=True,
    ),
    Row(
        "train-empty-class-folder",
        train_args(Path("{tmp}/data"), Path("{tmp}"), "run", "--device", "cpu"),
        2,
        [
            "empty class folder {tmp}/data/train/aardvark: labels come from the sorted folder names",
            "add images to it or remove it",
        ],
        setup=_fashion_with(lambda data: (data / "train" / "aardvark").mkdir()),
        checks=(_absent("run"),),
    ),
    # ------------------------------------------------ host memory: an input size that cannot fit (issue 33)
    Row(
        "validate-input-size-beyond-host-memory",
        ["validate.py", "{custom_images}", "--model", "{tmp}/model", DEVICE, *VALIDATE_RESULTS],
        2,
        ["input size 3x100000x100000 at batch size 256 needs about", "TiB of host memory", "not even one image fits"],
        setup=_huge_input_size,
        checks=(_absent("out/results.csv"),),
        cpu_only=None,
    ),
    Row(
        "inference-input-size-beyond-host-memory",
        ["inference.py", "{custom_images}", "--model", "{tmp}/model", *INFERENCE_RESULTS],
        2,
        ["input size 3x100000x100000 at batch size 256 needs about", "is available", "--img-size or --input-size"],
        setup=_huge_input_size,
        checks=(_no_csv_in("out"),),
    ),
    Row(
        "train-input-size-beyond-host-memory",
        train_args(Path("{fashion4}"), Path("{tmp}"), "run", "--device", "cpu", "--input-size", *map(str, HUGE)),
        2,
        ["input size 3x100000x100000 at batch size 32 needs about", "not even one image fits"],
        checks=(_absent("run"),),
    ),
    # ------------------------------------------------ worker errors: a transform fails on one image (issue 33)
    *[
        Row(
            f"validate-transform-fails-on-one-image-workers-{workers}",
            ["validate.py", "{tmp}/imgs", "--model", "{custom_model_dir}", DEVICE, "--crop-border-pixels", "10"]
            + ["--workers", workers, *VALIDATE_RESULTS],
            2,
            [
                "cannot transform image {tmp}/imgs/dog/tiny.png: transform Resize failed (ZeroDivisionError: "
                "division by zero) at batch 0",
                "--on-bad-image skip",
            ],
            setup=_imgs_with(_tiny_validation_image),
            checks=(_absent("out/results.csv"),),
            cpu_only=None,
        )
        for workers in ("0", "1")
    ],
    *[
        Row(
            f"train-planted-transform-fails-on-one-image-workers-{workers}",
            [*planted("train"), *train_args(Path("{tmp}/data"), Path("{tmp}"), "run", DEVICE)[1:]]
            + ["--epochs", "1", "--workers", workers],
            2,
            [
                "cannot transform image {tmp}/data/train/bag/tiny.png: transform Planted failed (ValueError: planted "
                "failure) at training epoch 0, batch ",
                "--on-bad-image skip",
            ],
            setup=_fashion_with(lambda data: tiny_image(data / "train" / "bag" / "tiny.png")),
            cpu_only=None,
        )
        for workers in ("0", "1")
    ],
    Row(
        "inference-planted-transform-fails-on-one-image",
        [*planted("infer"), "{tmp}/imgs", "--model", "{custom_model_dir}", DEVICE, *INFERENCE_RESULTS],
        2,
        ["cannot transform image {tmp}/imgs/dog/tiny.png: transform Planted failed (ValueError: planted failure)"],
        setup=_imgs_with(_tiny_validation_image),
        checks=(_no_csv_in("out"),),
        cpu_only=None,
    ),
]


def _params(rows: list[Row]) -> list:
    """Each row once, marked cpu_only with its reason, or once per device type (a row with DEVICE)."""
    params = []
    for row in rows:
        assert (DEVICE in row.args) == (row.cpu_only is None), (
            f"{row.id}: DEVICE in its args exactly when cpu_only=None"
        )
        host = [pytest.mark.skipif(not file_permissions_can_apply(), reason="root here, and no setpriv")] * row.as_user
        if row.cpu_only is None:
            params += [
                pytest.param(row, device_type, id=f"{row.id}-{device_type}", marks=host) for device_type in DEVICE_TYPES
            ]
        else:
            marks = [pytest.mark.cpu_only(reason=row.cpu_only), *host]
            params.append(pytest.param(row, "cpu", id=row.id, marks=marks))
    ids = [param.id for param in params]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    return params


class _Placeholders(dict):
    """The values of ``{name}``: tmp, data, repo, or the fixture of that name, requested when first used."""

    def __init__(self, request: pytest.FixtureRequest, tmp: Path) -> None:
        super().__init__(tmp=tmp, data=DATA, repo=REPO)
        self.request = request

    def __missing__(self, name: str) -> object:
        self[name] = self.request.getfixturevalue(name)
        return self[name]

    def fill(self, text: str) -> str:
        return text.format_map(self)

    def arguments(self, function: Callable[..., None], **given: object) -> dict[str, object]:
        """What ``function(tmp, ...)`` asks for after the test's folder, by parameter name."""
        names = list(inspect.signature(function).parameters)[1:]
        return {name: given[name] if name in given else self[name] for name in names}


@pytest.mark.parametrize("row, device_type", _params(ROWS))
def test_one_line_error(row: Row, device_type: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    values = _Placeholders(request, tmp_path)
    for relative, content in row.files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(values.fill(content))
    if row.setup is not None:
        row.setup(tmp_path, **values.arguments(row.setup))
    args = [
        filled for arg in row.args for filled in (device_flags(device_type) if arg == DEVICE else [values.fill(arg)])
    ]
    env = {name: None if value is None else values.fill(value) for name, value in (row.env or {}).items()}
    proc = run_script(args, env=env, file_permissions_apply=row.as_user)
    line = assert_one_line_error(proc, row.code, *(values.fill(fragment) for fragment in row.fragments))
    for check in row.checks:
        check(tmp_path, **values.arguments(check, line=line))

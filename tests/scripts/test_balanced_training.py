"""--balanced-sampler end to end: the start line names the rare class, and a run SIGKILLed mid-epoch
resumes from its recovery checkpoint to the weights of a run never killed (the epoch's draw is the same
after the resume, the samples already trained on skipped)."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from tests.conftest import DEVICE_TYPES, ONE_THREAD, assert_same_weights, device_flags, run_script, train_args, weights
from tests.scripts.test_recovery import COMMON, INTERVAL, MOST_REDONE, RECOVERY, launch, redone_updates, wait_for_step
from tests.train.test_class_weights import imbalanced_set


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_balanced_sampler_resumes_mid_epoch_exactly(device_type: str, tmp_path: Path) -> None:
    """6 trousers against 60 of each other class (186 images, 23 steps of 8): SIGKILL at a random step of
    epoch 0, --resume auto, and the final weights equal an uninterrupted run's."""
    data = imbalanced_set(tmp_path / "data", rare=6)
    step = random.Random().randint(INTERVAL + 1, 20)
    print(f"killed after the log line of step {step}")  # shown when the test fails
    flags = [*device_flags(device_type), *COMMON, "--balanced-sampler"]
    killed = launch(train_args(data, tmp_path, "killed", *flags, *RECOVERY))
    try:
        head = wait_for_step(killed, 0, step)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=60)
    finally:
        if killed.poll() is None:
            os.killpg(killed.pid, signal.SIGKILL)
    assert "balanced sampler: rare classes trouser (6) (largest class: 60 images)\n" in head[:3]
    resumed = run_script(train_args(data, tmp_path, "killed", *flags, *RECOVERY), env=ONE_THREAD, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 0 <= redone_updates(resumed.stdout) <= MOST_REDONE
    reference = run_script(train_args(data, tmp_path, "reference", *flags), env=ONE_THREAD, timeout=300)
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert_same_weights(weights(tmp_path / "reference" / "last.pth.tar"), weights(tmp_path / "killed" / "last.pth.tar"))

"""vtools' collectives across two real processes (gloo, started by torch.multiprocessing): gather_rows
returns every rank's rows, uneven counts and an empty rank included, in rank order on every rank;
all_reduce_sum sums and leaves its argument as it was. Single-process tests never reach these branches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.cpu_only(reason="two gloo processes on the host; npu collectives: tests/scripts/test_train.py")


def rows_of(rank: int, count: int) -> torch.Tensor:
    return torch.stack([torch.arange(count), torch.full((count,), rank)], dim=1) + 100 * rank


def _rank(rank: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from vtools.runtime.distributed import all_reduce_sum, gather_rows

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        value = torch.tensor([rank + 1.0, 10.0 * rank])
        results = {
            "uneven": gather_rows(rows_of(rank, 3 + 2 * rank)),
            "one_empty": gather_rows(rows_of(rank, 4 * rank)),
            "sum": all_reduce_sum(value),
            "argument": value,
        }
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_gather_rows_and_sums_across_two_processes(tmp_path: Path) -> None:
    from vtools.runtime.distributed import all_reduce_sum, gather_rows

    # without a process group both are the identity; calling them here also shows mutmut (which records
    # only this process's calls) that this test reaches them, so their mutants run it: the spawned
    # ranks inherit the mutant's name and import the same (mutated) package
    alone = rows_of(0, 3)
    assert gather_rows(alone) is alone
    assert torch.equal(all_reduce_sum(torch.tensor([2.0])), torch.tensor([2.0]))
    mp.start_processes(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert torch.equal(got["uneven"], torch.cat([rows_of(0, 3), rows_of(1, 5)]))
        assert torch.equal(got["one_empty"], rows_of(1, 4))
        assert torch.equal(got["sum"], torch.tensor([3.0, 10.0]))
        assert torch.equal(got["argument"], torch.tensor([rank + 1.0, 10.0 * rank]))


@pytest.mark.npu_only(reason="the collective range of each emulated Ascend chip family (the chip table)")
@pytest.mark.parametrize(("chip", "refused"), [("910A", True), ("910B", False), ("910_93", False), ("950", False)])
def test_a_dist_timeout_past_the_chips_collective_range_is_refused(
    chip: str, refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20000 s is past an Atlas training chip's HCCL_EXEC_TIMEOUT (at most 17340 s, CANN 8.5.0); A2/A3 take it,
    Ascend950's range is undocumented; a variable the user set is theirs."""
    from tests.conftest import load_emulated_npu
    from vtools.errors import UsageError
    from vtools.runtime.distributed import check_collective_timeout

    load_emulated_npu()
    from tests.emulated_npu.chips import posing_as

    monkeypatch.delenv("HCCL_EXEC_TIMEOUT", raising=False)
    npu = torch.device("npu:0")
    with posing_as(chip):
        check_collective_timeout(npu, 17300)
        if refused:
            with pytest.raises(UsageError, match=r"give --dist-timeout 17300 or less$"):
                check_collective_timeout(npu, 20000)
            monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "600")
        check_collective_timeout(npu, 20000)

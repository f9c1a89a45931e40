"""An emulated "hccl" collective backend for the emulated npu, staged through gloo on host copies.

torch_npu registers the c10d backend "hccl" for the device type "npu"; without one,
``init_process_group("hccl")`` fails and a torchrun run can only be tested on cpu/gloo. This
module registers a c10d ``Backend`` (the Python subclass torch binds through its ``PyBackend``
trampoline) under that name, for the device type "npu" only, as torch_npu does. Every
collective copies its npu operands to host memory, runs the same collective on a private gloo
group (same ranks, its own store prefix), waits, and copies the results back into the npu
tensors with ``copy_``; the returned work is already complete.

What it proves: multi-process code that joins a process group by the device's backend name
(``init_process_group("hccl", device_id=npu:N)``), DDP (parameter broadcast, shape checks,
gradient buckets, coalesced all-reduces), ``all_gather_object`` / ``broadcast_object_list``
(which stage objects on the default group's device, here npu), ``barrier`` and reductions of
npu tensors produce the values they produce on cpu/gloo. Like HCCL, it serves npu tensors only:
a collective issued on host tensors fails ("No backend type associated with device type cpu").

What it cannot prove: anything about HCCL itself (its rendezvous, ranktables, timeouts,
overlap of communication with compute, stream semantics of collectives: here each collective is
synchronous and ordered with the current stream by the host copies), or multi-node behaviour.
ReduceOp.AVG is a sum divided on the host (gloo has no AVG); PREMUL_SUM and point-to-point ops
are not served.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    Backend,
    BarrierOptions,
    BroadcastOptions,
    ProcessGroupGloo,
    ReduceOp,
    ReduceScatterOptions,
    Store,
    _create_work_from_future,
)

BACKEND_NAME = "hccl"
DEVICE_TYPE = "npu"

__all__ = ["BACKEND_NAME", "EmulatedHccl", "register"]


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu").contiguous()


def _copy_back(targets: list[torch.Tensor], hosts: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for target, host in zip(targets, hosts, strict=True):
            target.detach().copy_(host)


def _reduced(results: list[torch.Tensor]) -> None:
    """A reduction computes on the device: where the chip saturates, a sum past the dtype's range is its largest
    value and raises the float-status flag, as every other result does (npu_overflow.cpp)."""
    from ._build import load_extension

    for result in results:
        load_extension().note_result(result)


def _done(result: object) -> dist.Work:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _op(opts: object) -> ReduceOp:
    return opts.reduceOp if opts is not None else ReduceOp.SUM


def _sum_op(reduce_op: ReduceOp) -> tuple[ReduceOp, bool]:
    """gloo's op for ``reduce_op`` and whether the result must be divided by the world size."""
    if reduce_op == ReduceOp.AVG:
        return ReduceOp.SUM, True
    if reduce_op == ReduceOp.PREMUL_SUM:
        raise NotImplementedError("the emulated hccl backend does not serve ReduceOp.PREMUL_SUM")
    return reduce_op, False


class EmulatedHccl(Backend):
    """c10d backend for "npu" tensors: each collective runs on gloo over host copies, then ``copy_`` back."""

    def __init__(self, store: Store, rank: int, world_size: int, timeout: timedelta) -> None:
        super().__init__(rank, world_size)
        self._rank = rank
        self._world_size = world_size
        self._gloo = ProcessGroupGloo(dist.PrefixStore("emulated_hccl_host/", store), rank, world_size, timeout)

    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return BACKEND_NAME

    # c10d's trampoline reads these capability properties by attribute; inherited, they would call
    # back into it without end, so a Python backend states each one.
    supports_splitting = property(lambda self: False)
    supports_coalescing = property(lambda self: False)
    supports_time_estimate = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)

    # -- helpers ---------------------------------------------------------------------------------

    def _reduce(self, tensors: list[torch.Tensor], reduce_op: ReduceOp, run) -> list[torch.Tensor]:
        """Run ``run(hosts, gloo_op)`` on host copies of ``tensors``, copy the results back."""
        op, divide = _sum_op(reduce_op)
        hosts = [_to_host(t) for t in tensors]
        run(hosts, op).wait()
        if divide:
            hosts = [
                h.div_(self._world_size) if h.is_floating_point() else h.div_(self._world_size, rounding_mode="floor")
                for h in hosts
            ]
        _copy_back(tensors, hosts)
        _reduced(tensors)
        return tensors

    # -- collectives -----------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions | None = None) -> dist.Work:
        def run(hosts, op):
            host_opts = AllreduceOptions()
            host_opts.reduceOp = op
            return self._gloo.allreduce(hosts, host_opts)

        return _done(self._reduce(tensors, _op(opts), run))

    def allreduce_coalesced(
        self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions | None = None
    ) -> dist.Work:
        def run(hosts, op):
            host_opts = AllreduceCoalescedOptions()
            host_opts.reduceOp = op
            return self._gloo.allreduce_coalesced(hosts, host_opts)

        return _done(self._reduce(tensors, _op(opts), run))

    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions | None = None) -> dist.Work:
        hosts = [_to_host(t) for t in tensors]
        host_opts = BroadcastOptions()
        host_opts.rootRank, host_opts.rootTensor = (opts.rootRank, opts.rootTensor) if opts is not None else (0, 0)
        self._gloo.broadcast(hosts, host_opts).wait()
        _copy_back(tensors, hosts)
        return _done(tensors)

    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> dist.Work:
        host_outputs = [[_to_host(t) for t in outputs] for outputs in output_tensors]
        self._gloo.allgather(host_outputs, [_to_host(t) for t in input_tensors], AllgatherOptions()).wait()
        for outputs, hosts in zip(output_tensors, host_outputs, strict=True):
            _copy_back(outputs, hosts)
        return _done(output_tensors)

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions | None = None
    ) -> dist.Work:
        """``all_gather_into_tensor`` (``_allgather_base`` forwards here)."""
        host_output = _to_host(output)
        self._gloo._allgather_base(host_output, _to_host(input), AllgatherOptions()).wait()
        _copy_back([output], [host_output])
        return _done([output])

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllgatherOptions | None = None
    ) -> dist.Work:
        for output, input in zip(outputs, inputs, strict=True):
            self.all_gather_single(output, input, opts).wait()
        return _done(outputs)

    def allgather_coalesced(
        self,
        output_lists: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> dist.Work:
        host_outputs = [[_to_host(t) for t in outputs] for outputs in output_lists]
        self._gloo.allgather_coalesced(host_outputs, [_to_host(t) for t in inputs], AllgatherOptions()).wait()
        for outputs, hosts in zip(output_lists, host_outputs, strict=True):
            _copy_back(outputs, hosts)
        return _done(output_lists)

    def reduce_scatter(
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: ReduceScatterOptions | None = None,
    ) -> dist.Work:
        # gloo has no list reduce_scatter: reduce every rank's list, keep this rank's entry
        op, divide = _sum_op(_op(opts))
        for output, inputs in zip(outputs, input_lists, strict=True):
            hosts = [_to_host(t) for t in inputs]
            host_opts = AllreduceCoalescedOptions()
            host_opts.reduceOp = op
            self._gloo.allreduce_coalesced(hosts, host_opts).wait()
            mine = hosts[self._rank]
            if divide:
                mine = mine / self._world_size
            _copy_back([output], [mine])
        _reduced(outputs)
        return _done(outputs)

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: ReduceScatterOptions | None = None
    ) -> dist.Work:
        """``reduce_scatter_tensor`` (``_reduce_scatter_base`` forwards here)."""
        return self.reduce_scatter([output], [list(input.chunk(self._world_size))], opts)

    def reduce_scatter_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: ReduceScatterOptions | None = None,
    ) -> dist.Work:
        for output, input in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(output, input, opts).wait()
        return _done(outputs)

    def barrier(self, opts: BarrierOptions | None = None) -> dist.Work:
        self._gloo.barrier(BarrierOptions()).wait()
        return _done(None)


def _create(store: Store, rank: int, world_size: int, timeout: timedelta) -> EmulatedHccl:
    return EmulatedHccl(store, rank, world_size, timeout)


def register() -> None:
    """Register "hccl" for the npu device type (as torch_npu does); harmless when already registered."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=[DEVICE_TYPE])

"""vtools/runtime/host_network.py and the multi-node preflight: which interface a collective library's
connections leave from, and whether it reaches MASTER_ADDR.

On loopback in this process; on a second interface in a network namespace the test makes itself (``unshare
-n`` with a veth pair), where the host allows it, skipped with the reason where it does not.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO
from vtools.runtime import host_network, preflight
from vtools.runtime.device_kinds import DeviceKind

pytestmark = pytest.mark.cpu_only(reason="the host's network, read before any device is resolved")

HCCL = DeviceKind("npu", socket_interface_env="HCCL_SOCKET_IFNAME", socket_address_env="HCCL_IF_IP")
NODES_APART = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


def test_the_loopback_is_listed_and_a_name_spec_picks_as_the_libraries_do() -> None:
    assert host_network.interfaces().get("lo") == "127.0.0.1"
    available = {"lo": "127.0.0.1", "eth0": "10.0.0.2", "eth1": "10.1.0.2", "ib0": "10.2.0.2"}
    assert host_network.named_interface("eth", available) == "eth0"
    assert host_network.named_interface("=eth1", available) == "eth1"
    assert host_network.named_interface("=eth", available) is None
    assert host_network.named_interface("^eth,ib", available) is None
    assert host_network.named_interface("^eth0", available) == "eth1"


def test_a_pinned_loopback_reaches_a_listening_master(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as master:
        master.bind(("127.0.0.1", 0))
        master.listen()
        for name, value in {
            **NODES_APART,
            "MASTER_PORT": str(master.getsockname()[1]),
            "HCCL_IF_IP": "127.0.0.1",
        }.items():
            monkeypatch.setenv(name, value)
        [finding] = preflight.collective_interface(HCCL)
    assert finding.severity == "note" and finding.text.startswith("collectives leave from lo (127.0.0.1, pinned)")


def test_a_pin_that_names_nothing_here_stops_and_a_single_node_is_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**NODES_APART, "HCCL_SOCKET_IFNAME": "=nosuch0"}.items():
        monkeypatch.setenv(name, value)
    [finding] = preflight.collective_interface(HCCL)
    assert finding.severity == "error" and finding.text.startswith("HCCL_SOCKET_IFNAME==nosuch0 names no interface")
    monkeypatch.setenv("HCCL_IF_IP", "192.0.2.7")
    [finding] = preflight.collective_interface(HCCL)
    assert finding.text.startswith("HCCL_IF_IP=192.0.2.7 is not an address of this host (it has: ")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # every rank on this host: no connection leaves it
    assert preflight.collective_interface(HCCL) == []


NAMESPACE_PROBE = textwrap.dedent(
    """
    import os, socket, sys
    from vtools.runtime import preflight
    from vtools.runtime.device_kinds import DeviceKind
    kind = DeviceKind("npu", socket_interface_env="HCCL_SOCKET_IFNAME", socket_address_env="HCCL_IF_IP")
    os.environ.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="1", MASTER_PORT="29500", HCCL_SOCKET_IFNAME="va")
    for master in ("10.88.0.1", "10.77.0.1"):
        os.environ["MASTER_ADDR"] = master
        with socket.socket() as listener:
            listener.bind(("10.77.0.1", 29500)); listener.listen()
            for finding in preflight.collective_interface(kind):
                print(finding.severity, finding.text)
    """
)


NAMESPACE_SETUP = (
    "ip link set lo up && ip link add va type veth peer name vb && ip addr add 10.77.0.1/24 dev va && "
    "ip link set va up && ip link set vb up"
)


def _namespaces_allowed() -> bool:
    """Whether this host lets a process make a network namespace with a veth pair (root, or user namespaces)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "-n", "sh", "-c", NAMESPACE_SETUP], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not _namespaces_allowed(), reason="this host allows no network namespace with a veth pair (unshare -n, ip link)"
)
def test_a_second_interface_that_cannot_reach_the_master_stops_the_run() -> None:
    """In a network namespace of the test's own: veth ``va`` with 10.77.0.1/24 beside the loopback. Pinned to
    ``va``, a MASTER_ADDR no route leads to (10.88.0.1) is an error naming both; one on ``va``'s network is
    reached."""
    setup = NAMESPACE_SETUP
    command = f"{setup} && {sys.executable} -c {shlex.quote(NAMESPACE_PROBE)}"
    proc = subprocess.run(
        ["unshare", "-n", "sh", "-c", command],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("error collectives would leave from va (10.77.0.1, pinned), which cannot reach "), lines
    assert "MASTER_ADDR 10.88.0.1:29500 (Network is unreachable)" in lines[0]
    assert lines[1] == "note collectives leave from va (10.77.0.1, pinned), which reaches MASTER_ADDR 10.77.0.1"

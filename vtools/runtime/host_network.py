"""This host's network interfaces, as a collective library picks one, and whether one reaches an address.

A multi-node run's collective library (HCCL, NCCL) opens its own connections, from an interface of its choosing:
the one its variable names (HCCL_SOCKET_IFNAME, HCCL_IF_IP, NCCL_SOCKET_IFNAME), else one of its own rules. On a
host with several interfaces the choice may be one that cannot reach the root node, and the job then hangs at
connection set-up for the library's connect timeout. The preflight (vtools/runtime/preflight.py) says which
interface the library would use and whether it reaches MASTER_ADDR, from here: the standard library has no
``getifaddrs``, so addresses come from the kernel's ``SIOCGIFADDR`` (Linux).
"""

from __future__ import annotations

import errno
import fcntl
import socket
import struct

_SIOCGIFADDR = 0x8915  # linux/sockios.h


def interfaces() -> dict[str, str]:
    """Every interface with an IPv4 address: name -> address (Linux; empty elsewhere)."""
    found = {}
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address (down, or IPv6 only)
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    return found


def named_interface(spec: str, available: dict[str, str]) -> str | None:
    """The interface a ``*_SOCKET_IFNAME`` value picks among ``available``: a comma list of name prefixes,
    ``=`` before exact names, ``^`` before names to leave out (the loopback left out too); the first by name."""
    exact, exclude = spec.startswith("="), spec.startswith("^")
    items = [item for item in spec.lstrip("=^").split(",") if item]

    def matches(name: str) -> bool:
        return any(name == item if exact else name.startswith(item) for item in items)

    for name in sorted(available):
        if (not exclude and matches(name)) or (exclude and not matches(name) and name != "lo"):
            return name
    return None


def route_source(address: str, port: int) -> str | None:
    """The local address this host routes ``address`` through (a UDP connect sends nothing); None without a
    route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, port))
        except OSError:
            return None
        return probe.getsockname()[0]


def unreachable(source: str, address: str, port: int, timeout: float = 3.0) -> str | None:
    """Why ``address:port`` cannot be reached from local address ``source`` (a TCP connect); None when it can.
    A refused connection reached the host: only no route, no answer or a bad source count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.bind((source, 0))
            probe.connect((address, port))
        except ConnectionRefusedError:
            return None
        except TimeoutError:
            return f"no answer in {timeout:g} s"
        except OSError as err:
            if err.errno == errno.ECONNREFUSED:
                return None
            return err.strerror or str(err)
    return None

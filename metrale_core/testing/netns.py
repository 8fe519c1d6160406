"""Two test hosts on one machine: network namespaces joined by a veth pair (``ip netns``).

Owner: the two-host tests (``tests/parallel/test_two_hosts.py``, metrale-ray's
``test_ray_two_hosts.py``).  :func:`two_hosts` makes hosts ``a`` (198.18.0.1) and ``b``
(198.18.0.2); a test runs processes in them (:meth:`Host.popen`), talks to host ``a``'s
loopback from threads that entered its namespace (:meth:`Host.threads`), and takes a host's link
down (:meth:`Host.link`) to lose it without killing anything.

Invariants:
- Only addresses of 198.18.0.0/15 (RFC 2544's benchmarking range) are used, and only inside the
  two namespaces: the machine's own network (the root namespace) is never touched.
- Namespace names carry this process's pid, so concurrent runs do not collide.
- Where namespaces cannot be made (not root, no ``ip``), :func:`two_hosts` calls
  ``requires.missing``: the test skips locally and fails under ``CI=true``.
- :meth:`TwoHosts.close` (idempotent) kills whatever still runs in either namespace, returns
  those pids (a test asserts there were none) and deletes both namespaces.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from attrs import define

from metrale_core.testing.requires import missing

__all__ = ["Host", "TwoHosts", "two_hosts"]

_CLONE_NEWNET = 0x40000000


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True, timeout=30)


@define
class Host:
    """One namespace: its name, its address on the link and its end of the veth pair."""

    ns: str
    addr: str
    dev: str

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Run ``argv`` in this host (``ip netns exec`` execs it: the pid is the command's)."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], **kwargs)

    def run(self, argv: Sequence[str], timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns, *argv], timeout=timeout, **kwargs)

    def pids(self) -> list[int]:
        """The processes running in this host now."""
        out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True, timeout=30)
        return [int(p) for p in out.stdout.split()]

    def link(self, up: bool) -> None:
        """Bring this host's end of the link up or down (no process is touched)."""
        _ip("-n", self.ns, "link", "set", self.dev, "up" if up else "down")

    def threads(self, n: int = 4) -> ThreadPoolExecutor:
        """Worker threads in this host's network namespace (sockets they open live there)."""
        return ThreadPoolExecutor(n, initializer=_enter, initargs=(self.ns,))


def _enter(ns: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns} failed")
    finally:
        os.close(fd)


@define
class TwoHosts:
    a: Host
    b: Host
    closed: bool = False

    def close(self) -> list[int]:
        """Kill what is left in both hosts (returned), then delete the namespaces."""
        if self.closed:
            return []
        self.closed = True
        left = self.a.pids() + self.b.pids()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (self.a.pids() or self.b.pids()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for host in (self.a, self.b):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "delete", host.ns)
        return left


def two_hosts(tag: str = "met") -> TwoHosts:
    """Hosts ``a`` and ``b`` joined by a veth pair (see the module docstring)."""
    if shutil.which("ip") is None:
        missing("two-host tests need iproute2's 'ip' (network namespaces)")
    if os.geteuid() != 0:
        missing("two-host tests need root to make network namespaces (ip netns add)")
    pid = os.getpid()
    hosts = TwoHosts(Host(f"{tag}-a-{pid}", "198.18.0.1", "veth-a"), Host(f"{tag}-b-{pid}", "198.18.0.2", "veth-b"))
    try:
        for host in (hosts.a, hosts.b):
            _ip("netns", "add", host.ns)
        a, b = hosts.a, hosts.b
        _ip("-n", a.ns, "link", "add", a.dev, "type", "veth", "peer", "name", b.dev, "netns", b.ns)
        for host in (hosts.a, hosts.b):
            _ip("-n", host.ns, "addr", "add", f"{host.addr}/30", "dev", host.dev)
            _ip("-n", host.ns, "link", "set", host.dev, "up")
            _ip("-n", host.ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as exc:
        hosts.close()
        detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else str(exc)
        missing(f"network namespaces cannot be made here: {detail}")
    return hosts

"""Remote replicas: data-parallel replicas on other hosts, speaking the replica protocol over TCP.

Owner: ``ReplicaPool`` (the front) listens with :class:`ReplicaListener` for its remote slots;
``met replica --connect HOST:PORT`` (``metrale_core.cli.replica``) runs :func:`run_remote_replica`
on the other host.

The protocol is ``replica``'s, unchanged: after ``multiprocessing.connection``'s mutual HMAC
challenge with the shared key, the front sends ``("build", index, factory, threads, timeout_s)``
and the replica runs ``replica_main`` on the connection (wrapped in a :class:`~.link.Link` on both
ends), exactly as a local replica process does on its pipe.

Invariants:
- Nothing is unpickled before both ends proved they hold the key (``METRALE_REPLICA_KEY``).
- A remote replica whose link ends (closed, or silent for the timeout) is, for the pool, a
  replica process that died: :class:`RemoteProcess` answers ``ReplicaClient``'s process calls
  and names the host and the reason.
- ``met replica`` exits when the front stops it (0) or when the front is lost (1): a replica never
  outlives its front by more than the timeout.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge

from loguru import logger

from metrale_core.dataparallel.link import Link
from metrale_core.errors import ConfigError

__all__ = ["KEY_ENV", "RemoteProcess", "ReplicaListener", "parse_address", "replica_key", "run_remote_replica"]

#: The environment variable holding the key front and remote replicas share (never a flag: a
#: flag shows in ``ps``).
KEY_ENV = "METRALE_REPLICA_KEY"
_AUTH_TIMEOUT_S = 10


def replica_key() -> bytes:
    key = os.environ.get(KEY_ENV, "")
    if not key:
        raise ConfigError(f"remote data-parallel replicas need a shared key: set {KEY_ENV} on both hosts")
    return key.encode()


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> ``(host, port)``; a ``ConfigError`` naming the text otherwise."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _recv_timeout(sock: socket.socket, seconds: float) -> None:
    secs = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", secs, int((seconds - secs) * 1e6)))


class RemoteProcess:
    """What ``ReplicaClient`` asks of a replica's process, for a replica on another host."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.pid: int | None = None  # from the replica's ready message
        self.exitcode: int | None = None

    @property
    def where(self) -> str:
        return f"pid {self.pid} on {self.link.peer.rpartition(':')[0]}"

    @property
    def lost(self) -> str | None:
        return self.link.why

    def is_alive(self) -> bool:
        return not self.link.ended.is_set()

    def join(self, timeout: float | None = None) -> None:
        self.link.ended.wait(timeout)

    def kill(self) -> None:
        self.link.shut()


class ReplicaListener:
    """Accepts remote replicas at ``address``; :meth:`take` hands out authenticated links."""

    def __init__(self, address: tuple[str, int], authkey: bytes, timeout_s: float) -> None:
        self.authkey = authkey
        self.timeout_s = timeout_s
        self.sock = socket.create_server(address)
        self.sock.settimeout(0.5)
        self.address = self.sock.getsockname()[:2]
        self._links: queue.Queue[Link] = queue.Queue()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="metrale-replica-listener", daemon=True).start()
        logger.info("data parallel: waiting for remote replicas on {}:{}", *self.address)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, peer = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.setblocking(True)
            _recv_timeout(sock, _AUTH_TIMEOUT_S)  # a peer that says nothing cannot hold us
            conn = Connection(sock.detach())
            try:
                deliver_challenge(conn, self.authkey)
                answer_challenge(conn, self.authkey)
            except (AuthenticationError, OSError, EOFError) as exc:
                logger.warning("data parallel: refused a replica from {}:{} ({})", *peer[:2], exc or type(exc).__name__)
                conn.close()
                continue
            self._links.put(Link(conn, self.timeout_s, f"{peer[0]}:{peer[1]}"))

    def take(self, deadline: float | None, stopping: Callable[[], bool]) -> Link | None:
        """The next replica that connected; None when ``stopping()`` or past ``deadline``."""
        while not stopping() and (deadline is None or time.monotonic() < deadline):
            try:
                return self._links.get(timeout=0.2)
            except queue.Empty:
                continue
        return None

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        while not self._links.empty():
            self._links.get_nowait().close()


def run_remote_replica(address: tuple[str, int], connect_timeout_s: float = 600.0) -> int:
    """``met replica``: connect to the front at ``address`` (retrying while it starts), build the
    engine it sends, serve it until stopped (0) or until the front is lost (1)."""
    from metrale_core.dataparallel.replica import replica_main

    key = replica_key()
    deadline = time.monotonic() + connect_timeout_s
    while True:
        try:
            conn = Client(address, family="AF_INET", authkey=key)
            break
        except AuthenticationError as exc:
            raise ConfigError(f"the front at {address[0]}:{address[1]} refused {KEY_ENV}: {exc}") from None
        except OSError as exc:
            if time.monotonic() > deadline:
                raise ConfigError(f"cannot join the data-parallel front at {address[0]}:{address[1]}: {exc}") from None
            time.sleep(1.0)
    link = Link(conn, 60.0, f"{address[0]}:{address[1]}")
    try:
        kind, index, factory, threads, timeout_s = link.recv()
        assert kind == "build", kind
        link.set_timeout(timeout_s)
        logger.info("data parallel: replica {} of the front at {}:{}", index, *address)
        replica_main(link, index, factory, threads)
    except EOFError:
        pass
    finally:
        lost = link.why if link.ended.is_set() else None
        link.close()
    if lost is not None:
        logger.error("data parallel: lost the front at {}:{}: {}; exiting", address[0], address[1], lost)
        return 1
    return 0

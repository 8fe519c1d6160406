"""``dataparallel.link.Link`` over a socket pair: heartbeats keep an idle link up even for a reader
that comes late, a silent peer is lost within the bound, and a closed peer is end of file."""

from __future__ import annotations

import socket
import time
from multiprocessing.connection import Connection

import pytest

from metrale_core.dataparallel.link import Link


def _pair(timeout_s: float):
    a, b = socket.socketpair()
    return Link(Connection(a.detach()), timeout_s, "a:1"), Connection(b.detach())


def test_a_late_reader_reads_the_queued_pings_before_judging_silence():
    a, raw_b = _pair(0.4)
    b = Link(raw_b, 0.4, "b:1")
    try:
        time.sleep(1.2)  # nobody reads for three timeouts; both ends ping meanwhile
        assert not a.poll(0) and not a.ended.is_set()
        b.send(("out", 1))
        assert a.poll(5) and a.recv() == ("out", 1)  # pings never reach the caller
    finally:
        a.close()
        b.close()


def test_a_silent_peer_is_lost_within_the_bound_and_recv_is_end_of_file():
    a, raw_b = _pair(0.4)  # raw_b never sends, not even a ping
    try:
        start = time.monotonic()
        assert a.poll(60)  # a generous deadline: the outcome (lost, ended) is what is checked
        assert time.monotonic() - start > 0.3  # not declared lost before its 0.4 s timeout
        with pytest.raises(EOFError):
            a.recv()
        assert a.ended.is_set() and "no message for 0.4s" in (a.why or "")
    finally:
        a.close()
        raw_b.close()


def test_a_closed_peer_is_end_of_file_at_once():
    a, raw_b = _pair(30)
    raw_b.close()
    assert a.poll(5)
    with pytest.raises(EOFError):
        a.recv()
    assert a.why == "the connection was closed"
    a.close()

"""Hostile round 16: a tool author against the re-send of a call its dead worker never
read (``OpenCall.may_have_begun``). Bytes left unread in a worker's pipe prove it never
began the call only in a worker no tool's code ran in before: code that ran there can
read its next ``CALL`` frame with ``MSG_PEEK`` (leaving it unread), run the call and die,
and the call was sent to a fresh worker and run again (a non-idempotent tool ran 2-3
times for one call id, once answered ``ok`` after a double effect)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rho_actors import ActorSystem, ErrorKind, ToolCall, tool
from tests.conftest import WAIT_S

pytestmark = pytest.mark.timeout(240)

_ARM = r'''
import os, select, socket, struct
from rho_actors.sandbox.channel import Channel
_HEAD = struct.Struct("!cQ")
_plain = Channel.recv
_skip = [0]
def _peeking(self, deadline=None, max_bytes=None):
    if self._sentinel is not None or self._buf:
        return _plain(self, deadline, max_bytes)
    sock = socket.socket(fileno=os.dup(self._fd))
    try:
        while _skip[0]:
            select.select([sock], [], [], 60)
            _skip[0] -= len(sock.recv(_skip[0]))
        while True:
            select.select([sock], [], [], 60)
            data = sock.recv(1 << 24, socket.MSG_PEEK)
            if not data:
                raise EOFError("closed")
            if len(data) >= _HEAD.size:
                tag, size = _HEAD.unpack_from(data)
                if len(data) >= _HEAD.size + size:
                    if tag != b"C":
                        break
                    _skip[0] = _HEAD.size + size  # read for real before the next frame: this one is left unread
                    return tag, bytes(data[_HEAD.size:_HEAD.size + size])
    finally:
        sock.close()
    return _plain(self, deadline, max_bytes)
Channel.recv = _peeking
'''


@tool
def peeking_marker(marks: str, arm: bool = False) -> str:
    """Armed: its worker peeks at its next call frames from now on. Else: a mark appended
    (an effect that must happen once), then its own worker killed."""
    import signal

    if arm:
        exec(_ARM, {})
        return "armed"
    with open(marks, "a") as out:
        out.write(f"ran in {os.getpid()}\n")
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def test_a_call_peeked_at_by_code_that_ran_in_its_worker_is_never_run_again(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    with ActorSystem(tmp_path / "data", max_workers=1, warm_workers=0) as system:
        system.register(peeking_marker, isolation="process")
        loop = system.start_loop("s")
        [armed] = loop.run_turn([ToolCall("c0", "peeking_marker", json.dumps({"marks": str(marks), "arm": True}))],
                                timeout_s=WAIT_S)
        assert armed.ok and armed.content == "armed", armed
        [hit] = loop.run_turn([ToolCall("c1", "peeking_marker", json.dumps({"marks": str(marks)}))],
                              timeout_s=WAIT_S)
    assert marks.read_text().count("ran in") == 1, marks.read_text()  # before: 3 runs (every delivery attempt)
    assert hit.error_kind is ErrorKind.CRASHED, hit  # before: unavailable, "did not run"

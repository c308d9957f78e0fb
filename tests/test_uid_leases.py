"""Each confined child's own uid (DESIGN §5 "Confinement"): leased from a reserved range,
never twice at once (in this host or another), never one that runs a process or owns a
shared file, and a range the password database uses is refused with a warning."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rho_actors import ActorSystem, IsolationEvent, ToolCall
from rho_actors.sandbox.confine.confinement import Confinement
from rho_actors.sandbox.confine.uids import UidRange, UidRangeExhausted, lease, unavailable
from tests.conftest import WAIT_S
from tests.helpers import make_tool

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="leasing uids needs a root host")


def _range(count: int, part: int = 0) -> UidRange:
    """A range of this test process alone (tests on one machine run at once)."""
    return UidRange(0x7E000000 + (os.getpid() % 100_000) * 64 + part * 8, count)


def _whoami(args: object, ctx: object) -> str:
    return str(os.getuid())


def test_a_range_must_be_a_real_one() -> None:
    for first, count in ((0, 5), (5, 0), (65530, 10), (2**32 - 3, 5), ("1", 2)):
        with pytest.raises(ValueError, match="UidRange"):
            UidRange(first, count)  # type: ignore[arg-type]
    assert str(UidRange(100_000, 10)) == "100000-100009" and 100_009 in UidRange(100_000, 10)


@needs_root
def test_a_range_holding_a_users_uid_is_refused() -> None:
    reason = unavailable(UidRange(1, 10))
    assert reason is not None and "uid 1 of the password database" in reason, reason
    assert unavailable(_range(4)) is None


@needs_root
def test_leases_are_apart_and_given_back() -> None:
    uids = _range(2)
    first, second = lease(uids), lease(uids)
    try:
        assert {first.uid, second.uid} == {uids.first, uids.last}
        with pytest.raises(UidRangeExhausted, match=f"every uid of the range {uids}"):
            lease(uids)
        # another host on this machine: it sees the same leases
        code = ("import sys; from rho_actors.sandbox.confine.uids import UidRange, lease; "
                f"lease(UidRange({uids.first}, {uids.count}))")
        other = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                               timeout=WAIT_S)
        assert other.returncode == 1 and "UidRangeExhausted" in other.stderr, other.stderr
        first.release()
        first.release()  # idempotent
        again = lease(uids)
        assert again.uid == first.uid
        again.release()
    finally:
        first.release()
        second.release()


@needs_root
def test_a_uid_that_runs_a_process_is_not_leased() -> None:
    uids = _range(2, part=3)  # a range not leased from before in this process (processes are read once a minute)
    squatter = subprocess.Popen(
        [sys.executable, "-c", f"import os, sys; os.setgid({uids.first}); os.setuid({uids.first}); "
                               "print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert squatter.stdout is not None and squatter.stdout.readline() == "ready\n"
        got = lease(uids)
        assert got.uid == uids.last, got
        got.release()
    finally:
        squatter.kill()
        squatter.wait(WAIT_S)


@needs_root
def test_a_uid_that_owns_a_shared_file_is_not_leased() -> None:
    uids = _range(2, part=1)  # a range not leased from before in this process (shared folders are read once a minute)
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="someone-else-") as owned:
        os.chown(owned.name, uids.first, uids.first)
        got = lease(uids)
        assert got.uid == uids.last, got
        got.release()


@needs_root
def test_a_system_whose_range_is_taken_warns_and_shares_nobody(tmp_path: Path) -> None:
    events: list[IsolationEvent] = []
    spec = Confinement(uid_range=UidRange(1, 10))
    with ActorSystem(data_dir=tmp_path, shutdown_ms=2_000, confinement=spec) as system:
        system.subscribe(lambda e: events.append(e) if isinstance(e, IsolationEvent) else None)
        assert system.register(make_tool("whoami", _whoami), untrusted=True).info
        [result] = system.start_loop().run_turn([ToolCall("c", "whoami", "{}")])
        missing = system.stats()["confinement"]["missing"]
    assert result.ok and result.content == "65534", result
    [gap] = [m for m in missing if "per-uid kernel counters" in m]
    assert "uid 1 of the password database" in gap and any(e.detail == gap for e in events), (missing, events)


@needs_root
def test_a_worker_with_no_uid_left_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    uids = _range(1, part=2)
    spec = Confinement(uid_range=uids)
    with ActorSystem(data_dir=tmp_path, shutdown_ms=2_000, confinement=spec, warm_workers=0) as system:
        assert system.register(make_tool("whoami", _whoami), untrusted=True).info
        first = system.start_loop("alice").run_turn([ToolCall("c", "whoami", "{}")])[0]  # its worker stays, warm
        refused = system.start_loop("bob").run_turn([ToolCall("c", "whoami", "{}")])[0]
    assert first.ok and first.content == str(uids.first), first
    assert not refused.ok and f"every uid of the range {uids} is leased" in refused.content, refused

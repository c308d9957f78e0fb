"""What ``mcp serve`` records of a call in its session's transcript, and when (DESIGN §6b
"The served transcript"): the call's record is written before its tool runs (so a host
killed with ``kill -9`` while it runs keeps it), and it and the result are synced by one
``fdatasync`` before the client gets the result, never on the serving event loop; with
``synchronous_commit`` off, written before the client gets it and synced by the group
commit's thread after. The
SDK's own client against :func:`rho_actors.mcp.aserve` over HTTP on loopback, in both
protocol eras, with a sync and an ``async`` tool."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from rho_actors import ActorSystem, ToolCall, tool
from rho_actors.agent.group_commit import GroupCommit
from rho_actors.agent.model import Reply
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, load
from rho_actors.mcp import HTTPGuard, aserve
from rho_actors.mcp.sessions import SESSION_META_KEY, Session
from tests.conftest import WAIT_S, slack, wait_for
from tests.helpers import listening
from tests.mcp_fixtures import served_tools

TOKEN = "a-test-token-of-32-characters-xx"
GROUP_COMMIT_THREAD = "rho-group-commit"
CALLS = 5


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _recorded_before_it_ran(ctx: dict[str, Any]) -> bool:
    """Whether the transcript's last record is the call's own, as its tool starts."""
    records = _records(Path(ctx["data_dir"]) / TRANSCRIPT_NAME)
    return records[-1]["type"] == "reply" and [c["id"] for c in records[-1]["tool_calls"]] == [ctx["call_id"]]


@tool
def seen_sync(ctx: dict[str, Any]) -> bool:
    """Whether this call was recorded before it ran (a sync tool, on a call thread)."""
    return _recorded_before_it_ran(ctx)


@tool
async def seen_async(ctx: dict[str, Any]) -> bool:
    """Whether this call was recorded before it ran (an async tool, on the event loop)."""
    return _recorded_before_it_ran(ctx)


class _Syncs:
    """``os.fdatasync`` of transcripts counted, with the threads that made them."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self._real = os.fdatasync

    def __call__(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(TRANSCRIPT_NAME):
            self.threads.append(threading.current_thread())
        self._real(fd)


@contextlib.contextmanager
def _served(system: ActorSystem, **options: Any) -> Iterator[tuple[str, threading.Thread]]:
    """``system`` served over HTTP from a thread of its own (``options``: :func:`aserve`'s):
    its URL and that thread."""
    ready = threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])

    async def run() -> None:
        loops.append(asyncio.get_running_loop())
        ready.set()
        await aserve(system, http=("127.0.0.1", port), guard=HTTPGuard(TOKEN), **options)

    def target() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            asyncio.run(run())

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    assert ready.wait(WAIT_S)
    assert wait_for(lambda: listening(port))
    try:
        yield f"http://127.0.0.1:{port}/mcp", thread
    finally:
        loops[0].call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loops[0])])
        thread.join(WAIT_S)



@contextlib.asynccontextmanager
async def _client(url: str, mode: str) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
    async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        yield client


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("name", ["seen_sync", "seen_async"])
def test_a_served_call_is_recorded_before_it_runs_and_synced_once_with_its_result_before_the_client_has_it(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch, mode: str, name: str) -> None:
    system.register(seen_sync)
    system.register(seen_async)
    syncs = _Syncs()
    monkeypatch.setattr(os, "fdatasync", syncs)
    with _served(system) as (url, serving):
        async def main() -> None:
            async with _client(url, mode) as client:
                meta: Any = None
                for i in range(CALLS):
                    with anyio.fail_after(WAIT_S):
                        result = await client.call_tool(name, {}, meta=meta)
                    assert not result.is_error and [b.text for b in result.content] == ["true"], result  # type: ignore[union-attr]
                    handle = (result.meta or {}).get(SESSION_META_KEY)
                    meta = {SESSION_META_KEY: handle} if handle is not None else None
                    # the client has the result: the call and its result are on disk, synced
                    [folder] = (system.data_dir / "sessions").iterdir()
                    records = _records(folder / TRANSCRIPT_NAME)
                    assert [r["type"] for r in records] == ["reply", "result"] * (i + 1)
                    assert records[-1]["call_id"] == records[-2]["tool_calls"][0]["id"] and records[-1]["ok"]
                    assert len(syncs.threads) == i + 1  # one fdatasync a call

        anyio.run(main)
    assert serving not in syncs.threads  # no file work on the serving event loop's thread


@tool
def own_thread() -> int:
    """The thread running this (sync) call."""
    return threading.get_ident()


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_sync_calls_record_is_written_by_its_own_thread_and_a_refused_calls_before_its_result(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """No worker thread is crossed to record a sync tool's call: its call thread writes it
    as the tool starts (the turn's ``on_start``); a call refused before it runs (an unknown
    tool) still gets both records, in order."""
    system.register(own_thread)
    writers: list[int] = []
    replied = Transcript.reply

    def reply(self: Transcript, *args: Any, **kwargs: Any) -> Any:
        writers.append(threading.get_ident())
        return replied(self, *args, **kwargs)

    monkeypatch.setattr(Transcript, "reply", reply)
    with _served(system) as (url, serving):
        async def main() -> list[int]:
            ran: list[int] = []
            async with _client(url, mode) as client:
                meta: Any = None
                for name in ("own_thread", "nope", "own_thread"):
                    with anyio.fail_after(WAIT_S):
                        result = await client.call_tool(name, {}, meta=meta)
                    assert result.is_error == (name == "nope"), result
                    if name == "own_thread":
                        ran.append(int(result.content[0].text))  # type: ignore[union-attr]
                    handle = (result.meta or {}).get(SESSION_META_KEY)
                    meta = {SESSION_META_KEY: handle} if handle is not None else None
            return ran

        ran = anyio.run(main)
    assert writers[0] == ran[0] and writers[2] == ran[1]  # each by the thread that ran the tool
    assert serving.ident not in writers
    [folder] = (system.data_dir / "sessions").iterdir()
    records = _records(folder / TRANSCRIPT_NAME)
    assert [r["type"] for r in records] == ["reply", "result"] * 3
    assert [r["tool_calls"][0]["name"] for r in records[::2]] == ["own_thread", "nope", "own_thread"]
    assert [r["ok"] for r in records[1::2]] == [True, False, True]


def test_a_call_running_when_its_host_is_killed_with_kill_9_stays_in_the_transcript_as_interrupted(
        tmp_path: Path) -> None:
    """``rho-actors mcp serve`` killed with SIGKILL while a call runs: the transcript
    keeps the call's record (written before it ran; the kernel has it), read back as an
    interrupted call (``cancelled``, never run again)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {**os.environ, "RHO_MCP_TOKEN": TOKEN}
    server = subprocess.Popen(
        [sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--tools", served_tools.__file__, "--http",
         f"127.0.0.1:{port}", "--data-dir", str(tmp_path), "--unconfined"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: listening(port) or server.poll() is not None) and server.poll() is None

        async def main() -> None:
            running = anyio.Event()

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                running.set()

            async with _client(f"http://127.0.0.1:{port}/mcp", "legacy") as client, \
                    anyio.create_task_group() as tasks:
                async def call() -> None:
                    with contextlib.suppress(Exception):  # its connection dies with the server
                        await client.call_tool("wait_for_cancel", {"hold_s": 15}, progress_callback=on_progress)

                tasks.start_soon(call)
                with anyio.fail_after(WAIT_S):
                    await running.wait()  # the tool runs
                server.send_signal(signal.SIGKILL)
                await anyio.to_thread.run_sync(server.wait, WAIT_S)
                tasks.cancel_scope.cancel()

        anyio.run(main)
    finally:
        server.kill()
        server.wait(WAIT_S)
    [folder] = (tmp_path / "sessions").iterdir()
    history = load(folder / TRANSCRIPT_NAME)
    assert [(r.name, r.error_kind) for _, _, r in history.pending] == [("wait_for_cancel", "cancelled")]
    assert not (folder / "finished").exists()


class _SyncedSizes:
    """Each transcript ``os.fdatasync``: its thread's name and the file's size it made durable."""

    def __init__(self) -> None:
        self.synced: list[tuple[str, int]] = []
        self._real = os.fdatasync

    def __call__(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(TRANSCRIPT_NAME):
            size = os.fstat(fd).st_size
            self._real(fd)
            self.synced.append((threading.current_thread().name, size))
            return
        self._real(fd)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_with_synchronous_commit_off_a_result_is_written_before_it_is_sent_and_synced_by_the_group_commit(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """``synchronous_commit=False``: the client's result is in the file when it gets it
    (written to the OS: a crash of the process loses nothing), no call's thread and not
    the serving loop syncs it, and the group commit's thread makes every record durable."""
    system.register(own_thread)
    sizes = _SyncedSizes()
    monkeypatch.setattr(os, "fdatasync", sizes)
    with _served(system, synchronous_commit=False) as (url, serving):
        async def main() -> None:
            async with _client(url, mode) as client:
                meta: Any = None
                for i in range(CALLS):
                    with anyio.fail_after(WAIT_S):
                        result = await client.call_tool("own_thread", {}, meta=meta)
                    assert not result.is_error, result
                    handle = (result.meta or {}).get(SESSION_META_KEY)
                    meta = {SESSION_META_KEY: handle} if handle is not None else None
                    [folder] = (system.data_dir / "sessions").iterdir()
                    records = _records(folder / TRANSCRIPT_NAME)  # read as another process would
                    assert [r["type"] for r in records] == ["reply", "result"] * (i + 1)
                    assert records[-1]["ok"] and records[-1]["call_id"] == records[-2]["tool_calls"][0]["id"]
                [folder] = (system.data_dir / "sessions").iterdir()
                size = (folder / TRANSCRIPT_NAME).stat().st_size
                # within the group commit's delay, all of it is durable, synced by its thread alone
                assert wait_for(lambda: (GROUP_COMMIT_THREAD, size) in sizes.synced)

        anyio.run(main)
    assert sizes.synced and {name for name, _ in sizes.synced} == {GROUP_COMMIT_THREAD}
    assert serving.name not in {name for name, _ in sizes.synced}


def test_with_synchronous_commit_off_a_host_killed_with_kill_9_keeps_every_result_its_client_got(
        tmp_path: Path) -> None:
    """``rho-actors mcp serve --synchronous-commit off`` killed with SIGKILL right after
    its calls were answered: the transcript, opened again, has every call and its result
    (written to the OS before it was sent), whole."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen(
        [sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--tools", served_tools.__file__, "--http",
         f"127.0.0.1:{port}", "--data-dir", str(tmp_path), "--unconfined", "--synchronous-commit", "off"],
        env={**os.environ, "RHO_MCP_TOKEN": TOKEN}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: listening(port) or server.poll() is not None) and server.poll() is None

        async def main() -> None:
            async with _client(f"http://127.0.0.1:{port}/mcp", "legacy") as client:
                for i in range(CALLS):
                    with anyio.fail_after(WAIT_S):
                        result = await client.call_tool("add", {"a": i, "b": 1})
                    assert not result.is_error and result.content[0].text == str(i + 1), result  # type: ignore[union-attr]
                server.send_signal(signal.SIGKILL)  # at once: the last results are not synced yet
                await anyio.to_thread.run_sync(server.wait, WAIT_S)

        anyio.run(main)
    finally:
        server.kill()
        server.wait(WAIT_S)
    [folder] = (tmp_path / "sessions").iterdir()
    transcript = Transcript(folder / TRANSCRIPT_NAME)
    history = transcript.open()
    transcript.close()
    assert not history.torn and not history.pending
    records = _records(folder / TRANSCRIPT_NAME)
    assert [r["type"] for r in records] == ["reply", "result"] * CALLS
    assert [r["ok"] for r in records[1::2]] == [True] * CALLS


class _SyncTimes:
    """Each ``os.fdatasync`` of a transcript: (thread name, size made durable, when: monotonic s)."""

    def __init__(self) -> None:
        self.made: list[tuple[str, int, float]] = []
        self._real = os.fdatasync

    def __call__(self, fd: int) -> None:
        self._real(fd)
        if os.readlink(f"/proc/self/fd/{fd}").endswith(TRANSCRIPT_NAME):
            self.made.append((threading.current_thread().name, os.fstat(fd).st_size, time.monotonic()))


@pytest.mark.parametrize("delay_ms", [None, 400])
def test_wal_writer_delay_bounds_when_a_result_sent_unsynced_is_synced(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch, delay_ms: int | None) -> None:
    """``synchronous_commit=False``: the group commit syncs a result no sooner than
    ``wal_writer_delay_ms`` after it was written (PostgreSQL's default, 200 ms, when not
    given) and within it of its client having it (the machine's slack added)."""
    system.register(own_thread)
    syncs = _SyncTimes()
    monkeypatch.setattr(os, "fdatasync", syncs)
    delay_s = (delay_ms or 200) / 1000
    options: dict[str, Any] = {} if delay_ms is None else {"wal_writer_delay_ms": delay_ms}
    with _served(system, synchronous_commit=False, **options) as (url, _):
        async def main() -> None:
            async with _client(url, "legacy") as client:
                await client.call_tool("own_thread", {})  # the session started, its first records synced
                [folder] = (system.data_dir / "sessions").iterdir()
                assert wait_for(lambda: (folder / TRANSCRIPT_NAME).stat().st_size in {s for _, s, _ in syncs.made})
                asked = time.monotonic()
                with anyio.fail_after(WAIT_S):
                    result = await client.call_tool("own_thread", {})
                got = time.monotonic()
                assert not result.is_error, result
                size = (folder / TRANSCRIPT_NAME).stat().st_size
                assert wait_for(lambda: any(s == size for _, s, _ in syncs.made))
                [when] = [when for _, s, when in syncs.made if s == size]
                assert asked + delay_s <= when <= got + delay_s + slack(0.5)

        anyio.run(main)
    assert {name for name, _, _ in syncs.made} == {GROUP_COMMIT_THREAD}


def test_wal_writer_delay_takes_milliseconds_from_1_to_10000_and_names_a_bad_value(
        system: ActorSystem, capsys: pytest.CaptureFixture[str]) -> None:
    from rho_actors.cli import main as cli_main
    from rho_actors.mcp import build_server

    for bad in ("0", "10001", "soon", "nan"):
        assert cli_main(["mcp", "serve", "--tools", served_tools.__file__, "--synchronous-commit", "off",
                         "--wal-writer-delay", bad]) == 2
        err = capsys.readouterr().err
        assert "--wal-writer-delay" in err and "from 1 to 10000" in err and repr(bad) in err, err
    for bad_ms in (0, 10_001, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"wal_writer_delay_ms must be a number of milliseconds from 1 to 10000"):
            build_server(system, synchronous_commit=False, wal_writer_delay_ms=bad_ms)


def test_synchronous_commit_takes_on_or_off_and_names_a_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    from rho_actors.cli import main as cli_main

    assert cli_main(["mcp", "serve", "--tools", served_tools.__file__, "--synchronous-commit", "later"]) == 2
    err = capsys.readouterr().err
    assert "argument --synchronous-commit: invalid choice: 'later'" in err and "on" in err and "off" in err


class _HeldFlush(GroupCommit):
    """A group commit whose :meth:`flush` waits for ``release`` once it has begun (``begun``)."""

    def __init__(self) -> None:
        super().__init__()
        self.begun = threading.Event()
        self.release = threading.Event()

    def flush(self, transcript: Any) -> None:
        self.begun.set()
        assert self.release.wait(WAIT_S)
        super().flush(transcript)


def _open_fds_of(path: Path) -> int:
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve()))


def test_a_session_closed_as_its_server_is_cancelled_syncs_and_closes_its_transcript(system: ActorSystem) -> None:
    """``--synchronous-commit off``: a server stopping cancels its sessions' closing; the
    group commit's flush is shielded with the loop's stop, so the transcript is still
    synced and closed (its file no longer held open by the host)."""
    loop = system.start_loop("closing")
    transcript = Transcript(Path(loop.data_dir) / TRANSCRIPT_NAME)
    transcript.open(per_record=True)  # as mcp serve opens its sessions'
    commits = _HeldFlush()
    call = ToolCall("c1", "noop", {})
    transcript.reply(1, Reply(tool_calls=(call,)), sync=False)
    commits.written(transcript)
    session = Session(loop, transcript=transcript, commits=commits)
    assert _open_fds_of(transcript.path) == 1

    async def main() -> None:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(session.close, set(), "session")
                assert await anyio.to_thread.run_sync(commits.begun.wait, WAIT_S)
                scope.cancel()  # the server stops while the session is closing
                commits.release.set()

    try:
        anyio.run(main)
        assert _open_fds_of(transcript.path) == 0
        assert commits.syncs == 1 and not loop.alive
    finally:
        commits.close()

"""What durability costs and what it keeps (DESIGN §4 "Approvals", "What a record costs"):
a decision is one ``fsync`` (its records before the call starts), an approved call's
result is appended without one and still survives ``kill -9`` of its host (the kernel
keeps what was written: ``fsync`` is for the machine's crash, where the call then reads
as interrupted, never run twice), and a decision reads only what the transcript gained
since the host's last look."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ErrorKind, Reply, ScriptedModel
from rho_actors.agent.transcript import TRANSCRIPT_NAME, load
from tests.approval_host import REPLY
from tests.approval_tools import Put, delete, look
from tests.conftest import WAIT_S, read_line

ROOT = Path(__file__).resolve().parent.parent


def _system(data: Path) -> ActorSystem:
    system = ActorSystem(data_dir=data, shutdown_ms=2_000)
    for tool in (delete, look, Put):
        system.register(tool)
    return system


def _host(data: Path, *action: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "tests.approval_host", str(data), *action], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)


def _kill(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(WAIT_S)
    assert proc.stdout is not None
    proc.stdout.close()


def test_an_approve_is_one_fsync_and_reads_only_the_transcripts_tail(tmp_path: Path, runs: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    transcript = str(tmp_path / "data" / "sessions" / "s1" / TRANSCRIPT_NAME)
    whole: list[str] = []  # the threads that read the transcript from its start (once it holds records)
    tail: list[int] = []  # where each other read of it began
    synced: list[int] = []
    fdatasync, pread = os.fdatasync, os.pread

    def pread_at(fd: int, n: int, at: int) -> bytes:
        data = pread(fd, n, at)
        if os.readlink(f"/proc/self/fd/{fd}") == transcript:
            if at == 0 and data:
                whole.append(threading.current_thread().name)
            else:
                tail.append(at)
        return data

    monkeypatch.setattr(os, "pread", pread_at)  # every read of it, whoever reads (a decision, the look for them)
    with _system(tmp_path / "data") as system:
        loop = system.start_loop("s1")
        assert [p.call_id for p in loop.prompt("clean up", model=ScriptedModel([REPLY])).pending] == ["c1", "c2"]

        def counted(fd: int) -> None:
            if os.readlink(f"/proc/self/fd/{fd}") == transcript:
                synced.append(fd)
            fdatasync(fd)

        monkeypatch.setattr(os, "fsync", lambda fd: pytest.fail("a transcript record is fdatasync-ed, not fsync-ed")
                            if os.readlink(f"/proc/self/fd/{fd}") == transcript else None)
        monkeypatch.setattr(os, "fdatasync", counted)
        assert loop.approve("c1").content == "deleted /a"
        assert len(synced) == 1  # decided + running, before the call starts; the result rides on the next one
        assert len(whole) == 1, whole  # read whole once by this host (its first decision or first look for
        tail.clear()  # decisions, whichever came first), then only its tail, whoever reads
        assert loop.reject("c2", "keep it").error_kind is ErrorKind.REJECTED
        assert len(synced) == 2 and len(whole) == 1 and all(at > 0 for at in tail), (whole, tail)  # its tail only
        monkeypatch.undo()
    history = load(tmp_path / "data" / "sessions" / "s1" / TRANSCRIPT_NAME)
    assert [history.calls[c].state for c in ("c1", "c2")] == ["settled", "settled"]
    assert [m.text for m in history.messages if m.role == "tool"] == ["deleted /a", "keep it", "looked at /"]


def test_an_approved_calls_result_written_without_fsync_survives_kill_9(tmp_path: Path, runs: Path) -> None:
    data = tmp_path / "data"
    first = _host(data, "prompt")
    try:
        assert first.stdout is not None and read_line(first.stdout, WAIT_S * 3).strip() == "PENDING c1 c2"
    finally:
        _kill(first)
    second = _host(data, "approve", "c1")
    try:
        assert second.stdout is not None
        assert [read_line(second.stdout, WAIT_S * 3).strip() for _ in range(2)] == ["APPROVING", "APPROVED"]
    finally:
        _kill(second)  # at once: its result record was never fsync-ed
    with _system(data) as system:
        loop = system.start_loop("s1")
        assert [p.call_id for p in loop.pending()] == ["c2"]
        loop.reject("c2", "no")
        final = loop.prompt(None, model=ScriptedModel([Reply(text="done")]))
        assert final.error is None and final.recovered == ()
    tool_texts = [m.text for m in load(data / "sessions" / "s1" / TRANSCRIPT_NAME).messages if m.role == "tool"]
    assert tool_texts == ["deleted /a", "no", "looked at /"]
    assert runs.read_text().splitlines() == ["delete /a"]


def test_a_task_record_syncs_its_folder_once_at_the_tasks_start(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from rho_actors.tasks import records

    synced: list[str] = []
    fsync, fdatasync = os.fsync, os.fdatasync

    def counted(real: Any, what: str) -> Any:
        def sync(fd: int) -> None:
            synced.append(f"{what} {'folder' if os.path.isdir(f'/proc/self/fd/{fd}') else 'file'}")
            real(fd)
        return sync

    monkeypatch.setattr(os, "fsync", counted(fsync, "fsync"))
    monkeypatch.setattr(os, "fdatasync", counted(fdatasync, "fdatasync"))
    record = {"task_id": "t_" + "5" * 32, "call_id": "c1", "name": "crawl", "session_id": "s1",
              "status": "working", "started": 1.0, "finished": None, "delivered": False, "result": None}
    records.write(tmp_path, record, new=True)
    assert synced == ["fdatasync file", "fsync folder"]
    synced.clear()
    ended = {**record, "status": "completed", "finished": 2.0,
             "result": {"ok": True, "content": "done", "error_kind": None, "duration_ms": 1.0}}
    records.write(tmp_path, ended)
    assert synced == ["fdatasync file"]
    monkeypatch.undo()
    assert records.read_all(tmp_path) == [{"v": 1, **ended}]

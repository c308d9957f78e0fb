"""Approvals through the agent loop and across processes (DESIGN §4 "Approvals"): a
prompt returns with its pending calls, decisions are recorded in the session's
transcript, a host killed with ``kill -9`` (mid-wait, mid-approved-call) and a new host
on the same data folder never lose a pending call and never run a call twice, and
``rho-actors approve/reject`` decides from another process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ApprovalError, ErrorKind, Reply, ScriptedModel
from rho_actors.agent.transcript import TRANSCRIPT_NAME, load
from tests.approval_host import REPLY
from tests.approval_tools import Put, delete, look
from tests.conftest import WAIT_S, read_line, wait_for

ROOT = Path(__file__).resolve().parent.parent


def _runs(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _system(data: Path) -> ActorSystem:
    system = ActorSystem(data_dir=data, shutdown_ms=2_000)
    system.register(delete)
    system.register(look)
    system.register(Put)
    return system


@pytest.fixture
def host_env(runs: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


class _Host:
    def __init__(self, data: Path, env: dict[str, str], *action: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.approval_host", str(data), *action], cwd=ROOT,
                                     env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout

    def line(self) -> str:
        return read_line(self.stdout, WAIT_S * 3).strip()

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(WAIT_S)
        self.stdout.close()


@pytest.fixture
def hosts() -> Iterator[list[_Host]]:
    started: list[_Host] = []
    yield started
    for host in started:
        if host.proc.poll() is None:
            host.kill()


def _kill_9_after(hosts: list[_Host], data: Path, env: dict[str, str], *action: str, says: str) -> None:
    """A host running ``action`` on ``data``, killed with ``kill -9`` once it printed ``says``."""
    host = _Host(data, env, *action)
    hosts.append(host)
    assert host.line() == says
    host.kill()


def _kill_9_mid_call(hosts: list[_Host], data: Path, env: dict[str, str], runs: Path, call_id: str,
                     ran: list[str]) -> None:
    """A host approving ``call_id``, killed with ``kill -9`` while the call runs (held
    once ``runs`` shows ``ran``)."""
    hold = data.parent / "hold"
    hold.touch()
    host = _Host(data, {**env, "RHO_TEST_HOLD": str(hold)}, "approve", call_id)
    hosts.append(host)
    assert host.line() == "APPROVING"
    assert wait_for(lambda: _runs(runs) == ran, WAIT_S * 3)  # it runs, held
    host.kill()
    hold.unlink()


def test_a_prompt_returns_with_its_pending_calls_and_goes_on_once_they_are_decided(tmp_path: Path,
                                                                                    runs: Path) -> None:
    model = ScriptedModel([REPLY, Reply(text="one deleted, one kept")])
    with _system(tmp_path / "data") as system:
        loop = system.start_loop("s1")
        first = loop.prompt("clean up", model=model)
        assert first.error is None and [p.call_id for p in first.pending] == ["c1", "c2"]
        assert [r.error_kind for r in first.steps[0].results] == [ErrorKind.PENDING_APPROVAL] * 2 + [None]
        refused = loop.prompt("and the rest", model=model)
        assert refused.error is not None and "decide them first" in refused.error and "c1 (delete)" in refused.error
        assert loop.prompt(None, model=model).error is not None  # still pending: nothing sent
        assert len(model.requests) == 1
        assert loop.reject("c1", "keep /a", decided_by="ann").error_kind is ErrorKind.REJECTED
        assert loop.approve("c2", decided_by="ann").content == "deleted /b"
        final = loop.prompt(None, model=model)
        assert final.error is None and final.text == "one deleted, one kept"
    sent = [m for m in model.requests[1][0] if m.role == "tool"]
    assert [(m.tool_call_id, m.text) for m in sent] == [
        ("c1", "keep /a"), ("c2", "deleted /b"), ("c3", "looked at /")]
    assert _runs(runs) == ["delete /b"]
    records = [r for r in _records(tmp_path / "data") if r["type"] == "call"]
    assert [(r["call_id"], r["state"], r.get("decision")) for r in records] == [
        ("c1", "pending", None), ("c2", "pending", None), ("c1", "decided", "rejected"),
        ("c2", "decided", "approved"), ("c2", "running", None)]
    assert records[3]["decided_by"] == "ann" and len(records[3]["arguments_sha256"]) == 64


def _records(data: Path) -> list[dict[str, Any]]:
    import json

    path = data / "sessions" / "s1" / TRANSCRIPT_NAME
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_kill_9_mid_wait_then_a_new_host_still_has_the_pending_calls(tmp_path: Path, runs: Path,
                                                                     host_env: dict[str, str],
                                                                     hosts: list[_Host]) -> None:
    data = tmp_path / "data"
    _kill_9_after(hosts, data, host_env, "prompt", says="PENDING c1 c2")
    with _system(data) as system:
        loop = system.start_loop("s1")
        assert [p.call_id for p in loop.pending()] == ["c1", "c2"]
        assert loop.approve("c1").content == "deleted /a"
        loop.reject("c2", "no")
        final = loop.prompt(None, model=ScriptedModel([Reply(text="done")]))
        assert final.error is None and final.text == "done"
    assert _runs(runs) == ["delete /a"]


def test_kill_9_mid_approved_call_never_runs_it_again(tmp_path: Path, runs: Path, host_env: dict[str, str],
                                                      hosts: list[_Host]) -> None:
    data = tmp_path / "data"
    _kill_9_after(hosts, data, host_env, "prompt", says="PENDING c1 c2")
    _kill_9_mid_call(hosts, data, host_env, runs, "c1", ["delete /a"])
    with _system(data) as system:
        loop = system.start_loop("s1")
        assert [p.call_id for p in loop.pending()] == ["c2"]
        with pytest.raises(ApprovalError, match="no call 'c1' waits"):
            loop.approve("c1")
        loop.approve("c2")
        final = loop.prompt(None, model=ScriptedModel([Reply(text="done")]))
        assert final.error is None
        [recovered] = final.recovered
        assert recovered.call_id == "c1" and recovered.error_kind is ErrorKind.CANCELLED
    assert _runs(runs) == ["delete /a", "delete /b"]


def _cli(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "rho_actors.cli", *args[:1], str(data), *args[1:]], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=WAIT_S * 6, check=False)


def test_a_decision_from_another_process_is_acted_on_by_the_running_host(tmp_path: Path, runs: Path) -> None:
    data = tmp_path / "data"
    with _system(data) as system:
        loop = system.start_loop("s1")
        loop.prompt("clean up", model=ScriptedModel([REPLY]))
        approved = _cli(data, "approve", "s1", "c1", "--by", "bob")
        assert approved.returncode == 0, approved.stdout + approved.stderr
        assert "c1 of session s1 approved by bob" in approved.stdout
        rejected = _cli(data, "reject", "s1", "c2", "--message", "keep /b")
        assert rejected.returncode == 0, rejected.stdout + rejected.stderr
        transcript = data / "sessions" / "s1" / TRANSCRIPT_NAME
        assert wait_for(lambda: loop.pending() == [] and loop.running() == [] and all(
            load(transcript).calls[c].state == "settled" for c in ("c1", "c2")))
        again = _cli(data, "reject", "s1", "c1", "--message", "too late")
        assert again.returncode == 1 and "decided already: it was approved by bob at 20" in again.stdout
        final = loop.prompt(None, model=ScriptedModel([Reply(text="done")]))
        assert final.error is None
    assert _runs(runs) == ["delete /a"]


def test_an_approval_recorded_while_no_host_ran_runs_once_at_the_next_host(tmp_path: Path, runs: Path,
                                                                           host_env: dict[str, str],
                                                                           hosts: list[_Host]) -> None:
    data = tmp_path / "data"
    _kill_9_after(hosts, data, host_env, "prompt", says="PENDING c1 c2")
    assert _cli(data, "approve", "s1", "c1").returncode == 0
    unknown = _cli(data, "approve", "s1", "c9")
    assert unknown.returncode == 1 and "no call 'c9' waits" in unknown.stdout
    for _ in range(2):  # the second host finds it run: never again
        with _system(data) as system:
            loop = system.start_loop("s1")
            assert wait_for(lambda: load(data / "sessions" / "s1" / TRANSCRIPT_NAME).calls["c1"].state == "settled")
            assert [p.call_id for p in loop.pending()] == ["c2"]
    assert _runs(runs) == ["delete /a"]


def test_two_processes_racing_to_decide_one_call_exactly_one_wins(tmp_path: Path, runs: Path,
                                                                  host_env: dict[str, str],
                                                                  hosts: list[_Host]) -> None:
    data = tmp_path / "data"
    _kill_9_after(hosts, data, host_env, "prompt", says="PENDING c1 c2")
    env = {**host_env}
    racers = [subprocess.Popen([sys.executable, "-m", "rho_actors.cli", verb, str(data), "s1", "c1", *extra],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
              for verb, extra in (("approve", []), ("reject", ["--message", "no"]))]
    codes = sorted(p.wait(WAIT_S * 6) for p in racers)
    for p in racers:
        assert p.stdout is not None
        p.stdout.close()
    assert codes == [0, 1]
    decided = [r for r in _records(data) if r["type"] == "call" and r["state"] == "decided"]
    assert len(decided) == 1


def test_a_prompt_while_an_approved_call_runs_is_refused_not_answered_cancelled(
    tmp_path: Path, runs: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    monkeypatch.setenv("RHO_TEST_HOLD", str(hold))
    with _system(tmp_path / "data") as system:
        loop = system.start_loop("s1")
        loop.prompt("clean up", model=ScriptedModel([REPLY]))
        loop.reject("c2", "no")
        approving = threading.Thread(target=loop.approve, args=("c1",))
        approving.start()
        assert wait_for(lambda: _runs(runs) == ["delete /a"])
        busy = loop.prompt(None, model=ScriptedModel([Reply(text="done")]))
        assert busy.error is not None and "approved call(s) c1 are running now" in busy.error
        hold.unlink()
        approving.join(WAIT_S)
        final = loop.prompt(None, model=ScriptedModel([Reply(text="done")]))
        assert final.error is None and final.recovered == ()
    assert load(tmp_path / "data" / "sessions" / "s1" / TRANSCRIPT_NAME).calls["c1"].state == "settled"


def test_kill_9_mid_approved_call_of_an_idempotent_tool_runs_it_again_once(tmp_path: Path, runs: Path,
                                                                          host_env: dict[str, str],
                                                                          hosts: list[_Host]) -> None:
    data = tmp_path / "data"
    _kill_9_after(hosts, data, host_env, "prompt_put", says="PENDING p1")
    _kill_9_mid_call(hosts, data, host_env, runs, "p1", ["delete k"])
    transcript = data / "sessions" / "s1" / TRANSCRIPT_NAME
    with _system(data) as system:
        loop = system.start_loop("s1")
        # settled in the file, and finished in the host: its result's record written, the transcript let go
        assert wait_for(lambda: load(transcript).calls["p1"].state == "settled" and loop.running() == [])
        final = loop.prompt(None, model=ScriptedModel([Reply(text="done")]))
        assert final.error is None and final.recovered == ()
    assert _runs(runs) == ["delete k", "delete k"]
    attempts = [r["attempt"] for r in _records(data) if r["type"] == "call" and r["state"] == "running"]
    assert attempts == [1, 2]
    [result] = [r for r in _records(data) if r["type"] == "result"]
    assert result["ok"] and result["content"] == "stored k"


def test_a_host_with_pending_calls_reads_its_transcript_whole_only_for_decisions(
    tmp_path: Path, runs: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While calls wait, the host looks at the transcript every POLL_S seconds; records
    other than decisions appended meanwhile (an MCP session's calls, 1 MB of arguments
    each) are not read again whole at each look: before, each look loaded the whole
    transcript, so a session writing on grew the host by about 15 MiB a call and slowed
    its calls to seconds. A decision from another process is still acted on."""
    from rho_actors.agent import lines
    from rho_actors.agent.transcript import Transcript
    from rho_actors.tool import ToolCall, ToolResult

    loads: list[Path] = []  # the reads of the whole transcript (from its start) without its lock
    read_past = lines.read_past

    def counted(path: Path, mark: Any) -> Any:  # the real read, counted when it read the whole file
        read = read_past(path, mark)
        if read is not None and read[1]:
            loads.append(path)
        return read

    monkeypatch.setattr(lines, "read_past", counted)
    data = tmp_path / "data"
    with _system(data) as system:
        loop = system.start_loop("s1")
        loop.prompt("clean up", model=ScriptedModel([REPLY]))
        assert {p.call_id for p in loop.pending()} == {"c1", "c2"}
        assert wait_for(lambda: len(loads) >= 1)  # its first look reads it whole once
        read_whole = len(loads)
        transcript = Transcript(data / "sessions" / "s1" / TRANSCRIPT_NAME)
        transcript.open()
        try:
            step = transcript.history.next_step
            for i in range(6):
                call = ToolCall(f"m{i}", "look", {"path": "x" * 1_000_000})
                transcript.reply(step + i, Reply(tool_calls=(call,)))
                transcript.result(step + i, 0, ToolResult(call.id, "look", True, "looked"))
                size = os.stat(transcript.path).st_size
                assert wait_for(lambda: approvals_seen(loop) == size)  # noqa: B023 (waited for here)
        finally:
            transcript.close()
        assert len(loads) == read_whole
        approved = _cli(data, "approve", "s1", "c1", "--by", "bob")
        assert approved.returncode == 0, approved.stdout + approved.stderr
        assert wait_for(lambda: _runs(runs) == ["delete /a"] and [p.call_id for p in loop.pending()] == ["c2"])


def approvals_seen(loop: Any) -> int | None:
    """The transcript size the session's last look at it saw (a sync point, no more)."""
    seen = loop._approvals()._seen
    return None if seen is None else int(seen[0])


def test_kill_9_mid_wait_of_a_turn_run_directly_then_a_new_host_still_has_its_pending_calls(
    tmp_path: Path, runs: Path, host_env: dict[str, str], hosts: list[_Host],
) -> None:
    """A turn run directly (run_turn, no prompt) records its held calls in the session's
    transcript as a prompt does: a host killed with kill -9 loses none of them."""
    data = tmp_path / "data"
    _kill_9_after(hosts, data, host_env, "turn", says="PENDING c1 c2")
    with _system(data) as system:
        loop = system.start_loop("s1")
        assert [(p.call_id, dict(p.arguments)) for p in loop.pending()] == [("c1", {"path": "/a"}),
                                                                           ("c2", {"path": "/b"})]
        assert loop.approve("c1").content == "deleted /a"
        assert loop.reject("c2", "keep /b").error_kind is ErrorKind.REJECTED
        assert loop.pending() == []
    assert _runs(runs) == ["delete /a"]
    calls = load(data / "sessions" / "s1" / TRANSCRIPT_NAME).calls
    assert (calls["c1"].state, calls["c1"].decision, calls["c2"].state, calls["c2"].decision) == (
        "settled", "approved", "settled", "rejected")


def test_kill_9_mid_approved_call_of_a_turn_run_directly_never_runs_it_again(
    tmp_path: Path, runs: Path, host_env: dict[str, str], hosts: list[_Host],
) -> None:
    data = tmp_path / "data"
    _kill_9_after(hosts, data, host_env, "turn", says="PENDING c1 c2")
    _kill_9_mid_call(hosts, data, host_env, runs, "c1", ["delete /a"])
    with _system(data) as system:
        loop = system.start_loop("s1")
        assert [p.call_id for p in loop.pending()] == ["c2"]
        with pytest.raises(ApprovalError, match="no call 'c1' waits"):
            loop.approve("c1")
        assert loop.approve("c2").content == "deleted /b"
    [(_, _, interrupted)] = load(data / "sessions" / "s1" / TRANSCRIPT_NAME).pending  # outcome unknown
    assert interrupted.call_id == "c1" and interrupted.error_kind is ErrorKind.CANCELLED
    assert _runs(runs) == ["delete /a", "delete /b"]


def _forge(data: Path, call_id: str, **fields: Any) -> None:
    """Append a ``decided`` record for ``call_id`` as another process could (a valid
    line: its seq and checksum right), under the transcript's lock."""
    from rho_actors.loop.decisions import locked_transcript

    with locked_transcript(data / "sessions" / "s1" / TRANSCRIPT_NAME) as transcript:
        track = transcript.history.calls[call_id]
        transcript.call(track.step, track.index, "decided", call_id=call_id, name=track.name, decision="approved",
                        decided_by="mallory", **fields)


@pytest.mark.parametrize("forged", ["edited", "other_hash"])
def test_a_decision_in_the_transcript_never_runs_other_arguments_than_the_waiting_call_s(
    tmp_path: Path, runs: Path, forged: str,
) -> None:
    """A line another process appends to the transcript approving the waiting call with
    other arguments (edited ones hashed right, or a hash of other arguments) is refused:
    the call never runs and its result says why."""
    from rho_actors.lifecycle import arguments_sha256
    from rho_actors.tool import ToolCall

    data = tmp_path / "data"
    other = {"path": "/etc"}
    fields: dict[str, Any] = ({"arguments": other, "arguments_sha256": arguments_sha256(other)} if forged == "edited"
                              else {"arguments_sha256": arguments_sha256(other)})
    with _system(data) as system:
        loop = system.start_loop("s1")
        [held] = loop.run_turn([ToolCall("c1", "delete", '{"path": "/a"}')])
        assert held.error_kind is ErrorKind.PENDING_APPROVAL
        decided = loop.when_decided("c1")
        _forge(data, "c1", **fields)
        result = decided.result(WAIT_S)
        assert result.error_kind is ErrorKind.REJECTED and "bound to other arguments" in result.content
        assert loop.pending() == []
    assert _runs(runs) == []
    assert load(data / "sessions" / "s1" / TRANSCRIPT_NAME).calls["c1"].state == "settled"


def test_a_pending_call_whose_recorded_arguments_were_altered_is_not_taken_back(
    tmp_path: Path, runs: Path, host_env: dict[str, str], hosts: list[_Host],
) -> None:
    """The reply line of a waiting call rewritten with other arguments (its checksum made
    right) while no host runs: the next host does not list it and rho-actors approve
    refuses it, so what a person approves is what the pending record's hash binds."""
    import json

    from rho_actors.agent.transcript import checksum

    data = tmp_path / "data"
    _kill_9_after(hosts, data, host_env, "turn", says="PENDING c1 c2")
    path = data / "sessions" / "s1" / TRANSCRIPT_NAME
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    [at] = [i for i, r in enumerate(records) if r["type"] == "reply"]
    record = records[at]
    record["tool_calls"][0]["arguments"] = '{"path": "/etc"}'
    del record["sum"]
    record["sum"] = checksum(record)
    lines[at] = json.dumps(record, ensure_ascii=False)
    path.write_text("\n".join(lines) + "\n")
    refused = _cli(data, "approve", "s1", "c1")
    assert refused.returncode == 1 and "do not match the SHA-256" in refused.stdout
    with _system(data) as system:
        loop = system.start_loop("s1")
        assert [p.call_id for p in loop.pending()] == ["c2"]
        with pytest.raises(ApprovalError):
            loop.approve("c1")
    assert _runs(runs) == []

"""Calls that wait for a person (DESIGN §4 "Approvals"): declaring, holding (no thread,
never started), seeing, deciding once (approve with edited arguments, reject, expiry),
deferred results, and the clear errors of a wrong decision."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import (
    ActorSystem,
    ApprovalError,
    CallInfo,
    Deferred,
    ErrorKind,
    ToolCall,
    tool,
)
from rho_actors.lifecycle import arguments_sha256
from rho_actors.loop.approvals import SessionApprovals
from tests.conftest import WAIT_S, wait_for

RAN: list[dict[str, Any]] = []


@tool(requires_approval=True)
def delete(path: str) -> str:
    """Delete a file."""
    RAN.append({"path": path})
    return f"deleted {path}"


@tool
def look(path: str) -> str:
    """Look at a file."""
    return f"looked at {path}"


def _big_only(args: dict[str, Any], ctx: Mapping[str, Any]) -> bool:
    return bool(args["amount"] > 100)


@tool(requires_approval=_big_only)
def pay(amount: int) -> str:
    """Pay an amount."""
    return f"paid {amount}"


@tool
def wait_for_human(question: str) -> Deferred:
    """Ask a human; the answer comes later."""
    return Deferred(f"asked: {question}")


@pytest.fixture(autouse=True)
def _clean() -> None:
    RAN.clear()


def _system(system: ActorSystem) -> ActorSystem:
    for t in (delete, look, pay, wait_for_human):
        system.register(t)
    return system


def test_a_call_that_requires_approval_never_starts_and_its_siblings_run(system: ActorSystem) -> None:
    loop = _system(system).start_loop("s1")
    results = loop.run_turn([ToolCall("c1", "delete", '{"path": "/a"}'), ToolCall("c2", "look", '{"path": "/a"}')])
    assert results[0].error_kind is ErrorKind.PENDING_APPROVAL and "c1" in results[0].content
    assert "requires approval" in results[0].content
    assert results[1].ok and results[1].content == "looked at /a"
    assert RAN == []
    [pending] = loop.pending()
    assert (pending.call_id, pending.name, dict(pending.arguments), pending.kind) == ("c1", "delete", {"path": "/a"},
                                                                                        "approval")
    assert pending.arguments_sha256 == arguments_sha256({"path": "/a"})
    assert pending.expires_at is not None and pending.expires_at > pending.requested_at
    assert loop.running() == []


def test_two_pending_calls_of_one_turn_one_rejected_one_approved(system: ActorSystem) -> None:
    loop = _system(system).start_loop("s1")
    loop.run_turn([ToolCall("c1", "delete", '{"path": "/a"}'), ToolCall("c2", "delete", '{"path": "/b"}')])
    assert {p.call_id for p in loop.pending()} == {"c1", "c2"}
    rejected = loop.reject("c1", "not that one", decided_by="ann")
    assert (rejected.ok, rejected.error_kind, rejected.content) == (False, ErrorKind.REJECTED, "not that one")
    approved = loop.approve("c2", decided_by="ann")
    assert approved.ok and approved.content == "deleted /b"
    assert RAN == [{"path": "/b"}]
    assert loop.pending() == []


def test_an_approval_with_edited_arguments_runs_those_and_invalid_ones_leave_it_pending(
    system: ActorSystem,
) -> None:
    loop = _system(system).start_loop("s1")
    loop.run_turn([ToolCall("c1", "delete", '{"path": "/etc"}')])
    invalid = loop.approve("c1", arguments={"path": 5})
    assert invalid.error_kind is ErrorKind.INVALID_ARGUMENTS and "path" in invalid.content
    assert [p.call_id for p in loop.pending()] == ["c1"] and RAN == []
    result = loop.approve("c1", arguments={"path": "/tmp/x"})
    assert result.ok and RAN == [{"path": "/tmp/x"}]


def test_a_second_decision_an_unknown_id_and_another_sessions_call_are_refused(system: ActorSystem) -> None:
    _system(system)
    loop, other = system.start_loop("s1"), system.start_loop("s2")
    loop.run_turn([ToolCall("c1", "delete", '{"path": "/a"}')])
    loop.approve("c1", decided_by="ann")
    with pytest.raises(ApprovalError, match=r"call c1 of session 's1' is decided already: it was approved by ann"):
        loop.reject("c1", "no")
    with pytest.raises(ApprovalError, match="no call 'c9' waits"):
        loop.approve("c9")
    other.run_turn([ToolCall("x1", "delete", '{"path": "/b"}')])
    with pytest.raises(ApprovalError, match="no call 'x1' waits for a decision in session 's1'"):
        loop.approve("x1")
    with pytest.raises(ValueError, match="needs a message"):
        other.reject("x1", "  ")
    assert RAN == [{"path": "/a"}]


def test_two_threads_racing_to_decide_exactly_one_wins(system: ActorSystem) -> None:
    loop = _system(system).start_loop("s1")
    loop.run_turn([ToolCall("c1", "delete", '{"path": "/a"}')])
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def decide(how: str) -> None:
        barrier.wait(WAIT_S)
        try:
            if how == "approve":
                loop.approve("c1")
            else:
                loop.reject("c1", "no")
            outcomes.append("won")
        except ApprovalError:
            outcomes.append("refused")

    threads = [threading.Thread(target=decide, args=(h,)) for h in ("approve", "reject")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert sorted(outcomes) == ["refused", "won"]
    assert len(RAN) <= 1


def test_a_pending_call_expires(tmp_path: Any) -> None:
    with ActorSystem(data_dir=tmp_path / "data") as system:
        loop = _system(system).start_loop("s1", approval_timeout_s=0.05)
        loop.run_turn([ToolCall("c1", "delete", '{"path": "/a"}')])
        assert wait_for(lambda: loop.pending() == [])
        with pytest.raises(ApprovalError, match="it was expired"):
            loop.approve("c1")
        assert RAN == []


def test_a_policy_over_the_call_and_the_loops_policy(system: ActorSystem) -> None:
    seen: list[CallInfo] = []

    def destructive(info: CallInfo) -> bool:
        seen.append(info)
        return info.name == "look" and info.arguments["path"] == "/secret"

    loop = _system(system).start_loop("s1", approval=destructive)
    results = loop.run_turn([
        ToolCall("c1", "pay", '{"amount": 5}'), ToolCall("c2", "pay", '{"amount": 500}'),
        ToolCall("c3", "look", '{"path": "/secret"}'), ToolCall("c4", "look", '{"path": "/"}'),
    ])
    assert [r.error_kind for r in results] == [None, ErrorKind.PENDING_APPROVAL, ErrorKind.PENDING_APPROVAL, None]
    assert {i.call_id for i in seen} == {"c1", "c3", "c4"}  # c2 was held by its tool's own policy
    assert seen[0].tool.name == "pay"


def test_a_policy_that_raises_requires_approval(system: ActorSystem) -> None:
    def broken(info: CallInfo) -> bool:
        raise RuntimeError("policy down")

    loop = _system(system).start_loop("s1", approval=broken)
    [result] = loop.run_turn([ToolCall("c1", "look", '{"path": "/"}')])
    assert result.error_kind is ErrorKind.PENDING_APPROVAL


def test_an_untrusted_tools_own_code_cannot_lift_the_loops_requirement(tmp_path: Any) -> None:
    from rho_actors import untrusted

    @untrusted
    class Lax:
        @staticmethod
        def name() -> str:
            return "lax"

        @staticmethod
        def description() -> str:
            return "A tool that says no approval is needed."

        @staticmethod
        def parameter_schema() -> dict[str, Any]:
            return {"type": "object"}

        @staticmethod
        def requires_approval() -> bool:
            return False

        @staticmethod
        def run(args: dict[str, Any], ctx: Any) -> str:
            return "ran"

    with ActorSystem(data_dir=tmp_path / "data", confinement=False) as system:
        system.register(Lax)
        loop = system.start_loop("s1", approval=lambda info: True)
        [result] = loop.run_turn([ToolCall("c1", "lax", "{}")], timeout_s=WAIT_S)
        assert result.error_kind is ErrorKind.PENDING_APPROVAL, result.content
        assert loop.approve("c1").content == "ran"


class AsksForApproval:
    """An untrusted tool whose declaration asks that its calls be approved."""

    @staticmethod
    def name() -> str:
        return "asks"

    @staticmethod
    def description() -> str:
        return "A tool that asks for approval."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object"}

    @staticmethod
    def requires_approval() -> bool:
        return True

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        return "ran"


def test_an_untrusted_tools_declaration_can_ask_for_approval(tmp_path: Any) -> None:
    from rho_actors import untrusted

    with ActorSystem(data_dir=tmp_path / "data", confinement=False) as system:
        system.register(untrusted(AsksForApproval))
        loop = system.start_loop("s1")
        [result] = loop.run_turn([ToolCall("c1", "asks", "{}")], timeout_s=WAIT_S)
        assert result.error_kind is ErrorKind.PENDING_APPROVAL, result.content
        assert [info.requires_approval for info in loop.offered()] == [True]
        assert loop.approve("c1").content == "ran"


def test_a_declaration_says_whether_calls_may_need_approval(system: ActorSystem) -> None:
    _system(system)
    assert {i.name: i.requires_approval for i in system.tools()} == {
        "delete": True, "look": False, "pay": True, "wait_for_human": False}


def test_an_exclusive_turn_holds_the_calls_after_a_pending_one_in_order(system: ActorSystem) -> None:
    @tool(concurrency="exclusive")
    def step(n: int) -> str:
        """One step."""
        RAN.append({"step": n})
        return f"step {n}"

    _system(system).register(step)
    loop = system.start_loop("s1")
    results = loop.run_turn([ToolCall("c1", "step", '{"n": 1}'), ToolCall("c2", "delete", '{"path": "/a"}'),
                             ToolCall("c3", "step", '{"n": 3}')])
    assert [r.error_kind for r in results] == [None, ErrorKind.PENDING_APPROVAL, ErrorKind.PENDING_APPROVAL]
    assert "runs after call c2" in results[2].content
    with pytest.raises(ApprovalError, match="decide c2 first"):
        loop.approve("c3")
    loop.approve("c2")
    assert loop.approve("c3").content == "step 3"
    assert RAN == [{"step": 1}, {"path": "/a"}, {"step": 3}]


def test_a_deferred_result_is_resolved_later(system: ActorSystem) -> None:
    loop = _system(system).start_loop("s1")
    [result] = loop.run_turn([ToolCall("c1", "wait_for_human", '{"question": "colour?"}')])
    assert result.error_kind is ErrorKind.DEFERRED and "asked: colour?" in result.content
    [pending] = loop.pending()
    assert pending.kind == "external" and pending.expires_at is None
    with pytest.raises(ApprovalError, match="resolve it"):
        loop.approve("c1")
    resolved = loop.resolve("c1", "blue")
    assert resolved.ok and resolved.content == "blue"
    with pytest.raises(ApprovalError, match="decided already"):
        loop.resolve("c1", "red")


def test_a_deferred_call_of_a_turn_run_directly_is_resolved_by_the_next_host(tmp_path: Path) -> None:
    """A turn run directly records the call its tool deferred (in a pool thread, before
    its result is given): a new system on the same data folder lists it and resolves it."""
    from rho_actors.agent.transcript import TRANSCRIPT_NAME, load

    transcript = tmp_path / "sessions" / "s1" / TRANSCRIPT_NAME
    with _system(ActorSystem(data_dir=tmp_path)) as first:
        [result] = first.start_loop("s1").run_turn([ToolCall("c1", "wait_for_human", '{"question": "colour?"}')])
        assert result.error_kind is ErrorKind.DEFERRED
        assert "c1" in load(transcript).open_calls
    with _system(ActorSystem(data_dir=tmp_path)) as second:
        loop = second.start_loop("s1")
        assert [(p.call_id, p.kind, dict(p.arguments)) for p in loop.pending()] == [
            ("c1", "external", {"question": "colour?"})]
        assert loop.resolve("c1", "blue").content == "blue"
    assert load(transcript).calls["c1"].state == "settled"


def test_each_decision_is_an_event_and_a_line_in_the_tree(system: ActorSystem) -> None:
    from rho_actors import CallEvent

    seen: list[tuple[str, str, str | None]] = []
    system.subscribe(lambda e: seen.append((e.kind, e.call_id, e.outcome)) if isinstance(e, CallEvent) else None)
    loop = _system(system).start_loop("s1")
    loop.run_turn([ToolCall("c1", "delete", '{"path": "/a"}'), ToolCall("c2", "delete", '{"path": "/b"}')])
    [sessions] = [c for c in system.tree()["children"] if c["id"] == "sessions"]
    [session] = sessions["children"]
    [node] = session["children"]
    assert [p["call_id"] for p in node["pending"]] == ["c1", "c2"]
    loop.approve("c1", decided_by="ann")
    loop.reject("c2", "no")
    assert ("pending", "c1", "approval") in seen
    assert ("decided", "c1", "approved by ann") in seen and ("decided", "c2", "rejected") in seen


class Lookup:
    """A tool that declares an output schema (as an MCP tool does) and defers its result."""

    @staticmethod
    def name() -> str:
        return "lookup"

    @staticmethod
    def description() -> str:
        return "Look a record up; the answer comes later."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object"}

    @staticmethod
    def output_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Deferred:
        return Deferred("asked the records office")


def test_a_resolved_output_is_checked_against_the_tools_output_schema(system: ActorSystem) -> None:
    system.register(Lookup)
    loop = system.start_loop("s1")
    loop.run_turn([ToolCall("c1", "lookup", "{}")])
    with pytest.raises(ValueError, match=r"does not match tool 'lookup'.s output schema: \$\['id'\]: 'x' is not"):
        loop.resolve("c1", {"id": "x"})
    assert [p.call_id for p in loop.pending()] == ["c1"]
    assert loop.resolve("c1", {"id": 7}).content == '{"id": 7}'


def test_a_turn_whose_loop_stops_while_it_is_prepared_leaves_no_call_waiting(system: ActorSystem) -> None:
    loops: list[Any] = []

    def stop_then_require(info: CallInfo) -> bool:
        loops[0].stop()  # the loop stops while this turn is prepared: it is not started
        return True

    loop = _system(system).start_loop("s1", approval=stop_then_require)
    loops.append(loop)
    approvals = loop._turns().approvals
    [result] = loop.run_turn([ToolCall("c1", "look", '{"path": "/"}')])
    assert result.error_kind is ErrorKind.CANCELLED and "stopped before this turn started" in result.content
    assert approvals is not None and approvals.pending() == []


@pytest.mark.parametrize("later_turn", [True, False], ids=["a-later-turn", "the-same-turn"])
def test_a_call_id_that_names_a_pending_call_never_replaces_its_arguments(system: ActorSystem,
                                                                         later_turn: bool) -> None:
    """A person sees call c1 with its arguments and approves c1: what runs is what was seen.
    A second call reusing the id of a call that waits (an adapter's framework or a caller
    repeating the model's id) is refused and never replaces the waiting one."""
    loop = _system(system).start_loop("s1")
    first, second = ToolCall("c1", "delete", '{"path": "/tmp/a.txt"}'), ToolCall("c1", "delete", '{"path": "/etc"}')
    if later_turn:
        [held] = loop.run_turn([first])
        [again] = loop.run_turn([second])
    else:
        held, again = loop.run_turn([first, second])
    assert held.error_kind is ErrorKind.PENDING_APPROVAL
    assert (again.call_id, again.error_kind) == ("c1", ErrorKind.INVALID_ARGUMENTS)
    assert "call id 'c1' names a call of this session that waits for a decision" in again.content
    assert [(p.call_id, dict(p.arguments)) for p in loop.pending()] == [("c1", {"path": "/tmp/a.txt"})]
    assert loop.approve("c1", decided_by="ann").content == "deleted /tmp/a.txt"
    assert RAN == [{"path": "/tmp/a.txt"}] and loop.pending() == []


def test_a_deferred_call_reusing_a_pending_calls_id_does_not_replace_it(system: ActorSystem) -> None:
    loop = _system(system).start_loop("s1")
    loop.run_turn([ToolCall("c1", "delete", '{"path": "/tmp/a.txt"}')])
    [deferred] = loop.run_turn([ToolCall("c1", "wait_for_human", '{"question": "which?"}')])
    assert deferred.error_kind is ErrorKind.INVALID_ARGUMENTS and "waits for a decision" in deferred.content
    [pending] = loop.pending()
    assert (pending.name, pending.kind, dict(pending.arguments)) == ("delete", "approval", {"path": "/tmp/a.txt"})


def test_one_session_holds_a_bounded_number_and_size_of_waiting_calls(system: ActorSystem) -> None:
    """Calls nobody decides (a client calling a tool that requires approval in a loop,
    1 MB of arguments each) cost the host memory until they expire: a session holds at
    most MAX_PENDING_CALLS of them and MAX_PENDING_ARGUMENT_BYTES of their arguments;
    past either a call that would wait is refused ``unavailable``, never runs, and other
    sessions keep theirs."""
    from rho_actors.loop.approvals import MAX_PENDING_ARGUMENT_BYTES, MAX_PENDING_CALLS

    loop, other = _system(system).start_loop("s1"), system.start_loop("s2")
    calls = [ToolCall(f"c{i}", "delete", f'{{"path": "/{i}"}}') for i in range(MAX_PENDING_CALLS + 1)]
    results = loop.run_turn(calls)
    assert all(r.error_kind is ErrorKind.PENDING_APPROVAL for r in results[:-1])
    assert results[-1].error_kind is ErrorKind.UNAVAILABLE
    held_bytes = sum(len(str(c.arguments)) for c in calls[:-1])
    assert results[-1].content == (f"tool 'delete' did not run: {MAX_PENDING_CALLS} calls of this session wait for a "
                                   f"decision, holding {held_bytes} bytes of arguments; the bound is "
                                   f"{MAX_PENDING_CALLS} calls and {MAX_PENDING_ARGUMENT_BYTES} bytes")
    assert len(loop.pending()) == MAX_PENDING_CALLS and RAN == []
    assert other.run_turn([ToolCall("x1", "delete", '{"path": "/x"}')])[0].error_kind is ErrorKind.PENDING_APPROVAL
    loop.reject("c0", "no")
    assert loop.run_turn([ToolCall("again", "delete", '{"path": "/again"}')])[0].error_kind is \
        ErrorKind.PENDING_APPROVAL
    for pending in loop.pending():
        loop.reject(pending.call_id, "no")
    big = "x" * (MAX_PENDING_ARGUMENT_BYTES // 2)
    first, second = loop.run_turn([ToolCall("b1", "delete", {"path": big}), ToolCall("b2", "delete", {"path": big})])
    assert first.error_kind is ErrorKind.PENDING_APPROVAL
    assert second.error_kind is ErrorKind.UNAVAILABLE and "1 calls of this session wait" in second.content
    assert [p.call_id for p in loop.pending()] == ["b1"] and RAN == []


def test_turns_whose_tools_ask_nothing_are_looked_through_only_where_a_call_may_wait(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked: list[list[str]] = []
    hold = SessionApprovals.hold

    def counting(self: SessionApprovals, prepared: Any, *args: Any, **kwargs: Any) -> Any:
        looked.append([call.name for _, call, _, _ in prepared])
        return hold(self, prepared, *args, **kwargs)

    monkeypatch.setattr(SessionApprovals, "hold", counting)
    loop = _system(system).start_loop("s1")
    assert [r.content for r in loop.run_turn([ToolCall("c1", "look", '{"path": "/a"}')])] == ["looked at /a"]
    assert looked == []  # no policy, no tool asking: nothing to look through
    results = loop.run_turn([ToolCall("c2", "look", '{"path": "/b"}'), ToolCall("c3", "pay", '{"amount": 500}')])
    assert results[0].ok and results[1].error_kind is ErrorKind.PENDING_APPROVAL
    assert looked == [["look", "pay"]]
    asking = system.start_loop("s2", approval=lambda info: info.name == "look")
    assert asking.run_turn([ToolCall("c4", "look", '{"path": "/c"}')])[0].error_kind is ErrorKind.PENDING_APPROVAL
    assert looked[-1] == ["look"] and RAN == []

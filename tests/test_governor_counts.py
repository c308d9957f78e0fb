"""What the governor's budgets count and its breaker compares (DESIGN §4 "The governor"): ``max_calls``,
``max_calls_per_session`` and ``max_repeats`` count the calls the governor handed to
their isolation; a call answered before that (``rate_limited``, ``unavailable``,
cancelled while it waited, ``not_started`` as the system stops) gives back what it
reserved, as pydantic-ai's ``UsageLimits(tool_calls_limit)`` counts the tool calls that
ran. A call admitted reserves its count at once, so calls racing never pass a cap.

Before: every call admitted counted, also one refused before its tool ran: a session
whose calls waited out a busy upstream's place (``unavailable``) or a rate
(``rate_limited``) ran out of budget having run nothing."""

from __future__ import annotations

import json
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CancelToken, ErrorKind, GovernorSettings, ToolCall, ToolResult, tool
from rho_actors.declarations.policy import call_policy
from rho_actors.isolation.call import CallSpec

from .conftest import WAIT_S, wait_for


def test_a_call_refused_before_its_tool_ran_spends_no_budget_nor_repeat(tmp_path: Path) -> None:
    gate, started = threading.Event(), threading.Event()

    @tool(timeout_ms=int(2 * WAIT_S * 1000))
    def hold(x: int) -> str:
        """Hold the one thread place until the test lets go."""
        started.set()
        gate.wait(WAIT_S)
        return "held"

    @tool(max_calls=1, timeout_ms=300)
    def brief(key: str) -> str:
        """Return the key (one call a session, 300 ms to run)."""
        return key

    @tool(max_calls=1, timeout_ms=int(2 * WAIT_S * 1000))
    def once(key: str) -> str:
        """Return the key (one call a session)."""
        return key

    @tool(rate="1/min", timeout_ms=20_000)  # the second call's token comes past its deadline
    def rare(key: str) -> str:
        """Return the key (an upstream that allows one call a minute)."""
        return key

    @tool
    def plain(key: str) -> str:
        """Return the key."""
        return key

    with ActorSystem(tmp_path, governor=GovernorSettings(max_thread_calls=1)) as system:
        for one in (hold, brief, once, rare, plain):
            system.register(one)
        holder = system.start_loop("h").submit_turn([ToolCall("h", "hold", '{"x": 1}')])
        assert started.wait(WAIT_S)
        loop = system.start_loop("s", max_calls_per_session=4, max_repeats=1)
        [waited] = loop.run_turn([ToolCall("b1", "brief", '{"key": "a"}')])  # no thread place within 300 ms
        assert waited.error_kind is ErrorKind.UNAVAILABLE, waited
        token = CancelToken()
        cancelled = loop.submit_turn([ToolCall("o1", "once", '{"key": "a"}')], cancel=token)
        assert wait_for(lambda: system.stats()["governor"]["queued"].get("once") == 1)
        token.cancel("the user stopped it")
        assert cancelled.result(WAIT_S)[0].error_kind is ErrorKind.CANCELLED
        gate.set()
        assert holder.result(WAIT_S)[0].ok
        first, limited = loop.run_turn([ToolCall("r1", "rare", '{"key": "a"}'), ToolCall("r2", "rare", '{"key": "b"}')])
        assert first.ok and limited.error_kind is ErrorKind.RATE_LIMITED, limited
        # none of the three refused spent its tool's max_calls=1, the session's 4, or max_repeats=1
        ran = loop.run_turn([ToolCall("o2", "once", '{"key": "a"}'), ToolCall("b2", "brief", '{"key": "a"}')])
        assert [(r.ok, r.content) for r in ran] == [(True, "a"), (True, "a")], ran
        [again] = loop.run_turn([ToolCall("o3", "once", '{"key": "c"}')])
        assert again.error_kind is ErrorKind.BUDGET_EXHAUSTED and "(max_calls)" in again.content, again
        results = loop.run_turn([ToolCall("p1", "plain", '{"key": "p"}'), ToolCall("p2", "plain", '{"key": "q"}')])
        assert results[0].ok, results  # the session's fourth call that ran
        assert results[1].error_kind is ErrorKind.BUDGET_EXHAUSTED, results
        assert "budget of 4 tool calls (max_calls_per_session)" in results[1].content
        refused = system.stats()["governor"]["refused"]
        assert refused == {"budget_exhausted": 2, "repeated_call": 0, "rate_limited": 1, "unavailable": 1}


def _entry(**policy: Any) -> Any:
    """What :meth:`Governor.start` reads of a registered tool (its policy, isolation, concurrency)."""
    return types.SimpleNamespace(info=types.SimpleNamespace(policy=call_policy(**policy), concurrency="parallel",
                                                         parameter_schema={}),
                                 isolation="process")


def _spec(call_id: str, name: str, reply: Callable[[ToolResult], None], deadline_s: float) -> CallSpec:
    now = time.monotonic()
    return CallSpec(call_id, name, None, {"id": call_id}, {}, now, now + deadline_s, 1000, CancelToken(), 1000, reply)


class _Running:
    def cancel(self, reason: str) -> None:
        pass


def _storm(threads: int, each: int, call: Callable[[int, int], None]) -> None:
    """``call(thread, i)`` from ``threads`` threads at once, ``each`` times in each."""
    ready = threading.Barrier(threads)

    def work(n: int) -> None:
        ready.wait(WAIT_S)
        for i in range(each):
            call(n, i)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(WAIT_S)
        assert not worker.is_alive()


def test_racing_calls_never_pass_a_budget_and_the_refused_give_theirs_back(tmp_path: Path) -> None:
    with ActorSystem(tmp_path) as system:
        governor: Any = system._runtime.governor
        lock, started = threading.Lock(), []
        results: dict[str, ToolResult] = {}

        def start(spec: CallSpec) -> _Running:
            with lock:
                started.append(spec.call_id)
            if spec.call_id != "held":
                spec.reply(ToolResult(spec.call_id, spec.name, True, "ran"))
            return _Running()

        def record(call_id: str) -> Callable[[ToolResult], None]:
            return lambda result: results.__setitem__(call_id, result)

        # 200 calls at once of a tool allowed 5 calls a session: 5 start, none more
        many = _entry(max_calls=5)
        _storm(8, 25, lambda n, i: governor.start(many, _spec(f"m{n}.{i}", "many", record(f"m{n}.{i}"), WAIT_S),
                                                   "s", start, True))
        assert len(started) == 5 and len(results) == 200
        assert sum(r.error_kind is ErrorKind.BUDGET_EXHAUSTED for r in results.values()) == 195
        # its one place held: 200 calls at once wait out their deadline (now), unavailable, their counts given back
        started.clear()
        results.clear()
        one = _entry(max_calls=5, max_concurrency=1)
        held = governor.start(one, _spec("held", "one", record("held"), WAIT_S), "s", start, True)
        _storm(8, 25, lambda n, i: governor.start(one, _spec(f"o{n}.{i}", "one", record(f"o{n}.{i}"), 0.0),
                                                  "s", start, True))
        assert wait_for(lambda: len(results) == 200)
        assert started == ["held"]
        kinds = {r.error_kind for r in results.values()}
        assert ErrorKind.UNAVAILABLE in kinds and kinds <= {ErrorKind.UNAVAILABLE, ErrorKind.BUDGET_EXHAUSTED}
        held.spec.reply(ToolResult("held", "one", True, "ran"))  # its place free again
        after = [governor.start(one, _spec(f"x{i}", "one", record(f"x{i}"), WAIT_S), "s", start, True)
                 for i in range(6)]
        assert len(after) == 6 and started == ["held", "x0", "x1", "x2", "x3"], started
        assert results["x5"].error_kind is ErrorKind.BUDGET_EXHAUSTED, results["x5"]


# --- the breaker's arguments: JSON's numbers ----------------------------------------------------


def test_the_breaker_knows_1_and_1_0_as_one_number_and_true_as_not_1(tmp_path: Path) -> None:
    """Before: the breaker's key was the arguments' ``json.dumps``: ``1`` and ``1.0`` (one
    number in JSON and JSON Schema) were two arguments, and a model that wrote the same call
    with ``1.0`` ran it again past ``max_repeats``."""

    @tool
    def look(query: dict) -> str:  # type: ignore[type-arg]
        """Look something up."""
        return "found"

    with ActorSystem(tmp_path, governor=GovernorSettings(max_repeats=1)) as system:
        system.register(look)
        loop = system.start_loop("s")
        texts = ['{"query": {"n": 1, "xs": [2, {"y": -0.0}], "e": 100}}',
                 '{"query": {"xs": [2.0, {"y": 0}], "e": 1e2, "n": 1.0}}',  # the same numbers, keys in another order
                 '{"query": {"n": true, "xs": [2, {"y": 0}], "e": 100}}',  # true is not 1
                 '{"query": {"n": 1.5, "xs": [2, {"y": 0}], "e": 100}}']
        results = loop.run_turn([ToolCall(f"c{i}", "look", text) for i, text in enumerate(texts)])
        assert [r.error_kind for r in results] == [None, ErrorKind.REPEATED_CALL, None, None], results


def test_the_breakers_key_is_canonical_for_numbers_at_any_depth() -> None:
    from rho_actors.governor.session_counts import arguments_key

    assert arguments_key({"a": 1}) == arguments_key({"a": 1.0}) == arguments_key({"a": -0.0 + 1})
    assert arguments_key({"a": [1, {"b": [2.0]}]}) == arguments_key({"a": [1.0, {"b": [2]}]})
    assert arguments_key({"a": 2 ** 64}) == arguments_key({"a": float(2 ** 64)})
    assert arguments_key({"a": 0}) == arguments_key({"a": -0.0})
    for one, other in ((True, 1), (False, 0), (True, 1.0), (1, 1.5), (1, "1"), (None, 0), (2 ** 53 + 1, 2.0 ** 53)):
        assert arguments_key({"a": one}) != arguments_key({"a": other}), (one, other)
        assert arguments_key({"a": [{"b": one}]}) != arguments_key({"a": [{"b": other}]}), (one, other)
    assert arguments_key({"a": float("inf")}) != arguments_key({"a": float("nan")})
    assert arguments_key({"a": {1, 2}}) == arguments_key({"a": {1, 2}})  # not JSON: its repr


def test_the_breaker_knows_a_default_written_out_as_the_call_that_left_it_out(tmp_path: Path) -> None:
    """Before: the key was made of the arguments as written, so ``{"amount": 1}`` and
    ``{"amount": 1, "currency": "EUR"}`` (the tool's default written out) were two calls,
    and the same payment ran twice past ``max_repeats=1``."""
    ran: list[tuple[int, str]] = []

    @tool
    def pay(amount: int, currency: str = "EUR") -> str:
        """Pay an amount."""
        ran.append((amount, currency))
        return "paid"

    with ActorSystem(tmp_path, governor=GovernorSettings(max_repeats=1)) as system:
        system.register(pay)
        loop = system.start_loop("s")
        texts = ['{"amount": 1}', '{"amount": 1, "currency": "EUR"}', '{"currency": "EUR", "amount": 1.0}',
                 '{"amount": 1, "currency": "USD"}']
        results = [loop.run_turn([ToolCall(f"c{i}", "pay", text)])[0] for i, text in enumerate(texts)]
        assert [r.error_kind for r in results] == [None, ErrorKind.REPEATED_CALL, ErrorKind.REPEATED_CALL, None]
    assert ran == [(1, "EUR"), (1, "USD")]


# --- the breaker's memory, nested defaults, counts kept across a session's restarts (hostile round 18) ---------


def test_the_breaker_forgets_only_unsaturated_keys_least_recently_used_first() -> None:
    """Past MAX_REPEAT_KEYS distinct calls the oldest key below max_repeats is forgotten;
    a key at max_repeats never is: its call stays refused behind any flood."""
    from rho_actors.governor.session_counts import MAX_REPEAT_KEYS, SessionCounts

    counts = SessionCounts()
    assert counts.admit("t", ("t", "charge"), None, None, 2) is None
    assert counts.admit("t", ("t", "charge"), None, None, 2) is None  # at max_repeats=2: saturated
    assert counts.admit("t", ("t", "old"), None, None, 2) is None  # once: may be forgotten
    for n in range(MAX_REPEAT_KEYS):
        assert counts.admit("t", ("t", str(n)), None, None, 2) is None
    assert len(counts.repeats) == MAX_REPEAT_KEYS and ("t", "old") not in counts.repeats
    assert counts.admit("t", ("t", "charge"), None, None, 2) == ("repeated_call", {"count": 2})
    assert counts.admit("t", ("t", "1"), None, None, 2) is None  # the most recent: still counted once
    assert counts.admit("t", ("t", "1"), None, None, 2) == ("repeated_call", {"count": 2})


def test_once_the_breaker_holds_its_bound_of_saturated_keys_a_new_one_is_refused(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from rho_actors.governor import session_counts

    monkeypatch.setattr(session_counts, "MAX_SATURATED_KEYS", 3)

    @tool
    def look(n: int) -> str:
        """Look ``n`` up."""
        return f"saw {n}"

    with ActorSystem(data_dir=tmp_path / "data", governor=GovernorSettings(max_repeats=1)) as system:
        system.register(look)
        loop = system.start_loop("s")
        got = loop.run_turn([ToolCall(f"c{n}", "look", json.dumps({"n": n})) for n in range(4)], timeout_s=WAIT_S)
        assert [r.ok for r in got] == [True, True, True, False], got
        assert got[3].error_kind is ErrorKind.BUDGET_EXHAUSTED
        assert got[3].content == ("tool 'look' did not run: this session has used its budget of 3 distinct calls "
                                  "at max_repeats the breaker remembers (max_repeats)")
        [again] = loop.run_turn([ToolCall("c9", "look", '{"n": 0}')], timeout_s=WAIT_S)
        assert again.error_kind is ErrorKind.REPEATED_CALL, again  # nothing was forgotten


def test_defaults_fill_nested_objects_and_local_refs() -> None:
    from rho_actors.governor.session_counts import arguments_key, with_defaults

    schema = {"type": "object", "$defs": {"Opts": {"type": "object", "properties": {
        "currency": {"type": "string", "default": "EUR"}, "fees": {"type": "object", "properties": {
            "waived": {"type": "boolean", "default": False}}}}}},
        "properties": {"amount": {"type": "number"}, "options": {"$ref": "#/$defs/Opts", "default": {}},
                       "other": {"$ref": "https://example.com/x.json"}}}
    left_out = with_defaults({"amount": 5}, schema)
    assert left_out == {"amount": 5, "options": {"currency": "EUR"}}
    spelled = with_defaults({"amount": 5.0, "options": {"currency": "EUR"}}, schema)
    assert arguments_key(left_out) == arguments_key(spelled)
    assert with_defaults({"amount": 5, "options": {"fees": {}}}, schema) == {
        "amount": 5, "options": {"currency": "EUR", "fees": {"waived": False}}}
    assert with_defaults({"amount": 5, "other": {"a": 1}, "options": {"currency": "USD"}}, schema) == {
        "amount": 5, "other": {"a": 1}, "options": {"currency": "USD"}}
    given = {"amount": 1, "options": {"currency": "USD", "fees": {"waived": True}}}
    assert with_defaults(given, schema) is given  # nothing left out: no copy


def test_a_sessions_counts_survive_its_loops_stop_read_back_from_its_transcript(tmp_path: Path) -> None:
    """A session stopped and started again (an MCP client reaped and back, a new host)
    keeps its counts: the transcript's started calls count, its refused ones do not."""
    from rho_actors.agent.model import Reply
    from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript

    ran: list[str] = []

    @tool
    def charge(to: str, amount: int) -> str:
        """Charge ``amount`` to ``to``."""
        ran.append(f"{to} {amount}")
        return "charged"

    with ActorSystem(data_dir=tmp_path / "data",
                     governor=GovernorSettings(max_repeats=1, max_calls_per_session=2)) as system:
        system.register(charge)
        loop = system.start_loop("s")
        [made] = loop.run_turn([ToolCall("c0", "charge", '{"to": "zed", "amount": 1}')], timeout_s=WAIT_S)
        assert made.ok, made  # (the session's folder made)
        loop.stop(WAIT_S)
        transcript = Transcript(loop.data_dir / TRANSCRIPT_NAME)
        transcript.open()
        transcript.reply(1, Reply("", (ToolCall("a", "charge", '{"to": "bob", "amount": 5}'),
                                       ToolCall("b", "charge", {"to": "eve", "amount": 7}),
                                       ToolCall("c", "charge", '{"to": "kim", "amount": 2}'))))
        transcript.result(1, 0, ToolResult("a", "charge", True, "charged"))
        transcript.result(1, 1, ToolResult("b", "charge", False, "refused", ErrorKind.REPEATED_CALL))
        transcript.close()  # call c has no result: its host died running it; not counted (run again, or ended unrun)
        loop = system.start_loop("s")
        got = loop.run_turn([ToolCall("d", "charge", '{"amount": 5.0, "to": "bob"}'),
                             ToolCall("e", "charge", '{"to": "eve", "amount": 7}'),
                             ToolCall("f", "charge", '{"to": "ann", "amount": 3}')], timeout_s=WAIT_S)
        assert [r.error_kind for r in got] == [ErrorKind.REPEATED_CALL, None, ErrorKind.BUDGET_EXHAUSTED], got
        assert got[2].content == ("tool 'charge' did not run: this session has used its budget of 2 tool calls "
                                  "(max_calls_per_session)")
    assert ran == ["zed 1", "eve 7"]

"""The agent loop: prompt/aprompt over a real ActorSystem, with durable transcripts."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import rho_actors.cli.commands as cli_module
from rho_actors import ActorSystem, ErrorKind, ToolCall, ToolResult, kill, tool
from rho_actors.agent.driver import PromptResult, aprompt, prompt
from rho_actors.agent.model import Message, Reply, ScriptedModel
from rho_actors.agent.transcript import INTERRUPTED, TRANSCRIPT_NAME, Transcript, load, read_records

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(60)

runs: Counter[str] = Counter()
runs_lock = threading.Lock()


def _ran(name: str) -> None:
    with runs_lock:
        runs[name] += 1


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    runs.clear()


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    _ran("add")
    return a + b


@tool(concurrency="exclusive")
def note(text: str) -> str:
    """Write a note (one at a time)."""
    _ran("note")
    return f"noted {text}"


@tool
def fail() -> str:
    """Always raise."""
    _ran("fail")
    raise RuntimeError("disk on fire")


@tool(timeout_ms=150)
def slow(ctx: Mapping[str, Any]) -> str:
    """Wait for cancellation (longer than the timeout)."""
    _ran("slow")
    ctx["cancel"].wait(WAIT_S)
    return "never seen"


@tool
def extra() -> str:
    """A tool that comes and goes."""
    _ran("extra")
    return "extra!"


def call(call_id: str, name: str, args: Any = None) -> ToolCall:
    return ToolCall(call_id, name, json.dumps(args or {}))


def names(tools: Sequence[dict[str, Any]]) -> list[str]:
    return [t["name"] for t in tools]


def tool_messages(messages: Sequence[Message]) -> list[tuple[str | None, bool, str]]:
    return [(m.tool_call_id, m.is_error, m.text) for m in messages if m.role == "tool"]


def transcript_of(loop: Any) -> list[dict[str, Any]]:
    records, _, torn = read_records(loop.data_dir / TRANSCRIPT_NAME)
    assert not torn
    return records


def steps_of(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(r["type"], r["step"]) for r in records]


class HookedModel(ScriptedModel):
    """A ScriptedModel that runs ``hooks[step]()`` (1-based) while answering that step."""

    def __init__(self, replies: Sequence[Reply], hooks: dict[int, Callable[[], None]]) -> None:
        super().__init__(replies)
        self.hooks = hooks

    def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        *,
        on_text: Callable[[str], None] | None = None,
        **options: Any,
    ) -> Reply:
        reply = super().complete(messages, tools, on_text=on_text, **options)
        hook = self.hooks.get(len(self.requests))
        if hook is not None:
            hook()
        return reply


@pytest.fixture
def loop(system: ActorSystem) -> Any:
    for t in (add, note, fail, slow):
        system.register(t)
    return system.start_loop("s1")


# --------------------------------------------------------------------------- the cycle


def test_a_multi_step_conversation(loop: Any) -> None:
    model = ScriptedModel([
        Reply("checking", (call("c1", "add", {"a": 1, "b": 2}), call("c2", "add", {"a": 3, "b": 4}),
                           call("c3", "fail"), call("c4", "nope"))),
        Reply("", (call("c5", "note", {"text": "x"}), call("c6", "slow"), call("c7", "add", {"a": "one"}))),
        Reply("3 and 7; noted"),
    ])
    result = prompt(loop, "do things", model=model)
    assert result == PromptResult("3 and 7; noted", result.steps, None)
    assert [s.number for s in result.steps] == [1, 2, 3] and result.steps[2].results == ()
    assert [r.error_kind for r in result.steps[1].results] == [None, ErrorKind.TIMEOUT, ErrorKind.INVALID_ARGUMENTS]

    first_messages, first_tools = model.requests[0]
    assert first_messages == [Message.user("do things")]
    assert names(first_tools) == ["add", "note", "fail", "slow"]
    assert set(first_tools[0]) >= {"name", "description", "parameters"}

    second_messages, _ = model.requests[1]
    assert second_messages[1] == Message.assistant("checking", model.replies[0].tool_calls)
    sent = tool_messages(second_messages)
    assert sent[:2] == [("c1", False, "3"), ("c2", False, "7")]
    assert sent[2][:2] == ("c3", True) and "disk on fire" in sent[2][2]
    assert sent[3][:2] == ("c4", True) and "unknown tool 'nope'" in sent[3][2]

    third = tool_messages(model.requests[2][0])
    assert third[:4] == sent
    assert third[4] == ("c5", False, "noted x")
    assert third[5][:2] == ("c6", True) and "timeout of 150 ms" in third[5][2]
    assert third[6][:2] == ("c7", True) and "invalid arguments" in third[6][2]
    assert model.requests[2][0][-1].tool_call_id == "c7"  # results in the model's order
    # slow's thread may begin only after its deadline answered it (a loaded machine): it runs all the same, once
    assert wait_for(lambda: runs == {"add": 2, "fail": 1, "note": 1, "slow": 1}), runs

    records = transcript_of(loop)
    assert steps_of(records) == [("user", 1), ("reply", 1)] + [("result", 1)] * 4 + [("reply", 2)] + [
        ("result", 2)] * 3 + [("reply", 3)]
    # each result is written as its call settles (parallel calls settle in any order), once
    assert [sorted(r["index"] for r in records if r["type"] == "result" and r["step"] == step)
            for step in (1, 2)] == [[0, 1, 2, 3], [0, 1, 2]]
    final = Message.assistant("3 and 7; noted")
    assert load(loop.data_dir / TRANSCRIPT_NAME).messages == [*model.requests[2][0], final]


def test_max_steps_stops_with_a_clear_error(loop: Any) -> None:
    model = ScriptedModel([Reply("", (call(f"c{i}", "add", {"a": i}),)) for i in range(5)])
    result = prompt(loop, "loop forever", model=model, max_steps=2)
    assert result.error is not None and "max_steps=2" in result.error
    assert len(result.steps) == 2 and len(model.requests) == 2 and runs["add"] == 2
    assert steps_of(transcript_of(loop))[-1] == ("error", 3)  # stopped before request 3
    with pytest.raises(ValueError, match="max_steps"):
        prompt(loop, "x", model=model, max_steps=0)


class Broken:
    def __init__(self) -> None:
        self.calls = 0

    def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Reply:
        self.calls += 1
        raise ConnectionError("provider down after 3 retries")


def test_a_model_that_raises_is_an_error_result_and_the_session_goes_on(loop: Any) -> None:
    broken = Broken()
    result = prompt(loop, "hello", model=broken)
    assert result.error is not None and "provider down after 3 retries" in result.error and result.steps == ()
    assert loop.alive
    model = ScriptedModel([Reply("", (call("c1", "add", {"a": 1}),)), Reply("hi")])
    again = prompt(loop, "hello again", model=model)
    assert again.error is None and again.text == "hi"
    assert model.requests[0][0] == [Message.user("hello"), Message.user("hello again")]
    assert [s.number for s in again.steps] == [2, 3]  # the failed request used up step 1
    assert steps_of(transcript_of(loop)) == [("user", 1), ("error", 1), ("user", 2), ("reply", 2), ("result", 2),
                                             ("reply", 3)]


def test_an_invalid_reply_is_a_model_error(loop: Any) -> None:
    class Sloppy:
        def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Any:
            return {"text": "not a Reply"}

    result = prompt(loop, "hello", model=Sloppy())
    assert result.error is not None and "not a Reply" in result.error


def test_continue_without_new_text(loop: Any) -> None:
    model = ScriptedModel([Reply("done")])
    nothing = prompt(loop, None, model=model)
    assert nothing.error is not None and "nothing to continue" in nothing.error and model.requests == []
    prompt(loop, "hi", model=Broken())
    result = prompt(loop, None, model=model)
    assert result.text == "done" and model.requests[0][0] == [Message.user("hi")]


def test_tools_are_read_again_at_every_step(system: ActorSystem, loop: Any) -> None:
    hooks = {
        1: lambda: system.register(extra),
        2: lambda: loop.set_withheld(["add", "fail"]),
        3: lambda: system.unregister("extra"),
    }
    model = HookedModel([
        Reply("", (call("c1", "add", {"a": 1}),)),
        Reply("", (call("c2", "extra"),)),
        Reply("", (call("c3", "add", {"a": 1}), call("c4", "extra"))),
        Reply("", (call("c5", "extra"),)),
        Reply("bye"),
    ], hooks)
    result = prompt(loop, "go", model=model)
    assert result.error is None
    assert [names(tools) for _, tools in model.requests] == [
        ["add", "note", "fail", "slow"],
        ["add", "note", "fail", "slow", "extra"],
        ["note", "slow", "extra"],
        ["note", "slow"],
        ["note", "slow"],
    ]
    kinds = [r.error_kind for s in result.steps for r in s.results]
    # hook k runs while request k is answered, so its change already meets that turn
    assert kinds == [None, None, ErrorKind.WITHHELD, ErrorKind.UNAVAILABLE, ErrorKind.UNAVAILABLE]


# --------------------------------------------------------------------------- durability


def test_resume_in_a_new_system_does_not_run_tools_again(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = ScriptedModel([Reply("", (call("c1", "add", {"a": 1, "b": 1}),)), Reply("two")])
    with ActorSystem(data_dir=data_dir) as system:
        system.register(add)
        assert prompt(system.start_loop("s"), "1+1?", model=first).text == "two"
    assert runs["add"] == 1
    second = ScriptedModel([Reply("", (call("c2", "add", {"a": 2, "b": 2}),)), Reply("four")])
    with ActorSystem(data_dir=data_dir) as system:
        system.register(add)
        loop = system.start_loop("s")
        result = prompt(loop, "2+2?", model=second)
        records = transcript_of(loop)
    assert result.text == "four" and [s.number for s in result.steps] == [3, 4]
    assert second.requests[0][0] == [*first.requests[1][0], Message.assistant("two"), Message.user("2+2?")]
    assert runs["add"] == 2
    assert steps_of(records) == [("user", 1), ("reply", 1), ("result", 1), ("reply", 2),
                                 ("user", 3), ("reply", 3), ("result", 3), ("reply", 4)]


@pytest.mark.parametrize("text", [None, "what happened?"])
def test_a_recorded_but_unanswered_turn_gets_cancelled_results(
    tmp_path: Path, text: str | None, logs: list[str]
) -> None:
    data_dir = tmp_path / "data"
    with ActorSystem(data_dir=data_dir) as system:
        system.register(add)
        loop = system.start_loop("s")
        with Transcript(loop.data_dir / TRANSCRIPT_NAME) as t:  # a process that died mid-turn
            t.user(1, "add twice")
            t.reply(1, Reply("", (call("c1", "add", {"a": 1}), call("c2", "add", {"a": 2}))))
            t.result(1, 0, ToolResult("c1", "add", True, "1"))
        model = ScriptedModel([Reply("the second one was lost")])
        result = prompt(loop, text, model=model)
        records = transcript_of(loop)
    assert runs["add"] == 0
    assert result.text == "the second one was lost" and result.error is None
    assert [(r.call_id, r.error_kind, r.content) for r in result.recovered] == [
        ("c2", ErrorKind.CANCELLED, INTERRUPTED)]
    sent = tool_messages(model.requests[0][0])
    assert sent == [("c1", False, "1"), ("c2", True, INTERRUPTED)]
    assert model.requests[0][0][-1] == (Message.user(text) if text else Message.tool_result(result.recovered[0]))
    assert steps_of(records)[:5] == [("user", 1), ("reply", 1), ("result", 1), ("result", 1),
                                     ("user", 2) if text else ("reply", 2)]
    assert any("interrupted before its result was recorded" in m for m in logs)


def test_a_torn_last_line_is_skipped_with_a_warning(loop: Any, logs: list[str]) -> None:
    first = ScriptedModel([Reply("", (call("c1", "add", {"a": 5}),)), Reply("five")])
    prompt(loop, "5?", model=first)
    path = loop.data_dir / TRANSCRIPT_NAME
    path.write_bytes(path.read_bytes() + b'{"v": 1, "type": "user", "st')
    second = ScriptedModel([Reply("six")])
    result = prompt(loop, "6?", model=second)
    assert result.text == "six"
    assert second.requests[0][0] == [*first.requests[1][0], Message.assistant("five"), Message.user("6?")]
    assert any("cut short" in m for m in logs)
    assert steps_of(transcript_of(loop))[-2:] == [("user", 3), ("reply", 3)]


def test_one_prompt_per_session_at_a_time(loop: Any) -> None:
    with Transcript(loop.data_dir / TRANSCRIPT_NAME):
        result = prompt(loop, "hi", model=ScriptedModel([Reply("no")]))
    assert result.error is not None and "in use by another prompt" in result.error


def test_killing_the_loop_mid_turn(system: ActorSystem) -> None:
    started = threading.Event()

    @tool
    def block(ctx: Mapping[str, Any]) -> str:
        """Signal, then wait to be cancelled."""
        _ran("block")
        started.set()
        ctx["cancel"].wait(WAIT_S)
        return "never seen"

    system.register(block)
    system.register(add)
    loop = system.start_loop("k")
    old_ref = loop.ref
    model = ScriptedModel([
        Reply("", (call("c1", "block"), call("c2", "add", {"a": 1}))),
        Reply("", (call("c3", "add", {"a": 2}),)),
        Reply("recovered"),
    ])
    outcome: list[PromptResult] = []
    driver = threading.Thread(target=lambda: outcome.append(prompt(loop, "go", model=model)))
    driver.start()
    assert started.wait(WAIT_S)
    assert wait_for(lambda: runs.get("add") == 1)  # c2 ran: the kill lands mid-turn, with only c1 still running
    kill(old_ref)
    driver.join(WAIT_S)
    assert not driver.is_alive()
    [result] = outcome
    assert result.error is None and result.text == "recovered"
    first = result.steps[0].results
    assert first[0].error_kind == ErrorKind.CRASHED and "crashed" in first[0].content
    assert result.steps[1].results[0].content == "2"
    assert loop.alive and loop.ref is not old_ref
    assert runs == {"block": 1, "add": 2}
    assert tool_messages(model.requests[1][0])[0] == ("c1", True, first[0].content)
    records = transcript_of(loop)
    assert steps_of(records) == [("user", 1), ("reply", 1), ("result", 1), ("result", 1), ("reply", 2),
                                 ("result", 2), ("reply", 3)]


def test_a_loop_gone_for_good_is_an_error_result(loop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from rho_actors.agent import driver as agent

    monkeypatch.setattr(agent, "LOOP_WAIT_S", 0.05)
    loop.stop()
    model = ScriptedModel([Reply("never")])
    result = prompt(loop, "anyone?", model=model)
    assert result.error is not None and "is not running" in result.error and model.requests == []
    assert steps_of(transcript_of(loop)) == [("user", 1), ("error", 1)]
    assert transcript_of(loop)[-1]["kind"] == "loop"


# --------------------------------------------------------------------------- asyncio


class Gate:
    """A model whose first request waits for ``proceed`` (set from the event loop)."""

    def __init__(self, replies: Sequence[Reply]) -> None:
        self.inner = ScriptedModel(replies)
        self.entered = threading.Event()
        self.proceed = threading.Event()
        self.proceeded: bool | None = None

    def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Reply:
        if self.proceeded is None:
            self.entered.set()
            self.proceeded = self.proceed.wait(WAIT_S)
        return self.inner.complete(messages, tools)


def test_aprompt_does_not_block_the_event_loop(loop: Any) -> None:
    model = Gate([Reply("", (call("c1", "add", {"a": 1}),)), Reply("async done")])

    async def main() -> PromptResult:
        task = asyncio.create_task(aprompt(loop, "hi", model=model))
        assert await asyncio.to_thread(model.entered.wait, WAIT_S)
        model.proceed.set()  # runs only if the event loop is free while the model works
        return await asyncio.wait_for(task, WAIT_S)

    result = asyncio.run(main())
    assert model.proceeded is True and result.text == "async done" and runs["add"] == 1


def test_cancelling_aprompt_stops_before_the_next_request(loop: Any) -> None:
    model = Gate([Reply("", (call("c1", "add", {"a": 1}),)), Reply("never asked")])

    async def main() -> None:
        task = asyncio.create_task(aprompt(loop, "hi", model=model))
        assert await asyncio.to_thread(model.entered.wait, WAIT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        model.proceed.set()

    asyncio.run(main())
    assert wait_for(lambda: len(model.inner.requests) == 1)  # the request given up has answered
    # cancelled during its first request: the prompt did not wait for the reply, which is dropped
    assert steps_of(transcript_of(loop)) == [("user", 1), ("error", 1)]
    assert transcript_of(loop)[-1]["kind"] == "cancelled" and runs["add"] == 0


# --------------------------------------------------------------------------- chat


TOOL_FILE = '''
from rho_actors import tool

@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b
'''


def test_chat_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    tools_file = tmp_path / "chat_tools.py"
    tools_file.write_text(TOOL_FILE, encoding="utf-8")
    model = ScriptedModel([Reply("", (call("c1", "add", {"a": 1, "b": 2}), call("c2", "nope"))), Reply("1 + 2 = 3"),
                           Reply("bye")])
    made: list[tuple[str, str | None]] = []

    def factory(spec: str, base_url: str | None) -> Any:
        made.append((spec, base_url))
        return model

    monkeypatch.setattr(cli_module, "_chat_model", factory)
    monkeypatch.setattr("sys.stdin", io.StringIO("what is 1 + 2?\n\nthanks\n/exit\nnever read\n"))
    argv = ["chat", "--model", "openai:gpt-test", "--base-url", "http://localhost:1/v1", "--session", "cli1",
            "--data-dir", str(tmp_path / "data"), "--max-steps", "3", "--tools", str(tools_file)]
    assert cli_module.main(argv) == 0
    out = capsys.readouterr().out
    assert made == [("openai:gpt-test", "http://localhost:1/v1")]
    assert "session cli1 (new); model openai:gpt-test; tools: add" in out
    assert "  -> add [c1]" in out
    assert "  <- add [c1]: ok, " in out and " ms" in out
    assert "  <- nope [c2]: unknown_tool, 0.0 ms" in out
    assert out.index("<- add [c1]") < out.index("1 + 2 = 3") < out.index("bye")
    assert len(model.requests) == 3

    monkeypatch.setattr("sys.stdin", io.StringIO("again\n"))  # EOF quits too; the session resumes
    model.replies.append(Reply("resumed"))
    assert cli_module.main(argv) == 0
    out = capsys.readouterr().out
    assert "session cli1 (resumed, 7 messages so far)" in out and "resumed" in out.splitlines()[-1]
    assert model.requests[3][0][-1] == Message.user("again") and len(model.requests[3][0]) == 8


def test_chat_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_module.main(["chat", "--model", "gpt-4o"]) == 2
    assert "PROVIDER:MODEL" in capsys.readouterr().err
    assert cli_module.main(["chat", "--model", "openai:x", "--max-steps", "0"]) == 2
    capsys.readouterr()

    monkeypatch.setitem(sys.modules, "anthropic", None)  # the SDK is not installed
    monkeypatch.delitem(sys.modules, "rho_actors.agent.providers.anthropic", raising=False)
    assert cli_module.main(["chat", "--model", "anthropic:claude", "--data-dir", str(tmp_path)]) == 2
    assert "pip install 'rho_actors[anthropic]'" in capsys.readouterr().err
    monkeypatch.undo()

    monkeypatch.setattr(cli_module, "_chat_model", lambda spec, base_url: ScriptedModel([]))
    assert cli_module.main(["chat", "--model", "openai:x", "--tools", str(tmp_path / "missing.py")]) == 2
    assert "no such file" in capsys.readouterr().err


# --------------------------------------------------------------------------- odd replies


def test_odd_tool_call_arguments_fail_only_their_call(loop: Any) -> None:
    def calls() -> Any:  # a generator: read once
        yield ToolCall("n", "add", 5)  # type: ignore[arg-type]
        yield ToolCall("b", "add", b'{"a": 2, "b": 3}')  # type: ignore[arg-type]
        yield ToolCall("m", "add", None)  # type: ignore[arg-type]

    model = ScriptedModel([Reply(tool_calls=calls()), Reply(text="done")])
    result = prompt(loop, "go", model=model)
    assert result.error is None and result.text == "done"
    first = result.steps[0].results
    assert [r.call_id for r in first] == ["n", "b", "m"]
    assert [r.error_kind for r in first] == [ErrorKind.INVALID_JSON, None, ErrorKind.INVALID_JSON]
    assert first[1].content == "5"


def test_a_lone_surrogate_in_the_users_text_does_not_poison_the_session(loop: Any) -> None:
    model = ScriptedModel([Reply(text="one"), Reply(text="two")])
    assert prompt(loop, "caf\udce9", model=model).text == "one"
    sent = model.requests[0][0][-1].text
    assert sent == "caf\ufffd"
    sent.encode("utf-8")
    assert prompt(loop, "again", model=model).text == "two"


def test_a_reply_cut_short_keeps_its_text_and_says_so(loop: Any) -> None:
    model = ScriptedModel([Reply(text="half an ans", stop_reason="incomplete")])
    result = prompt(loop, "go", model=model)
    assert result.text == "half an ans"
    assert result.error is not None and "cut short" in result.error


HOST_MID_TURN = r'''
import sys, threading
from pathlib import Path
from rho_actors import ActorSystem, Reply, ScriptedModel, ToolCall, prompt, tool

marker = Path(sys.argv[2])

@tool
def fast() -> str:
    "Leave a mark and finish."
    with marker.open("a") as f:
        f.write("ran\n")
    return "done"

@tool(timeout_ms=600_000)
def stuck() -> str:
    "Never finish."
    threading.Event().wait()
    return "never"

with ActorSystem(data_dir=sys.argv[1]) as system:
    system.register(fast)
    system.register(stuck)
    model = ScriptedModel([Reply("", (ToolCall("c1", "fast", "{}"), ToolCall("c2", "stuck", "{}"))), Reply("x")])
    prompt(system.start_loop("s"), "go", model=model)
'''


def test_a_host_killed_mid_turn_keeps_the_results_of_calls_that_finished(tmp_path: Path) -> None:
    """Each result is recorded as its call settles: a host killed (SIGKILL) while one call
    of a turn still runs loses none of the calls that finished, and resuming runs none again."""
    import signal
    import subprocess

    data_dir, marker = tmp_path / "data", tmp_path / "ran"
    host = subprocess.Popen([sys.executable, "-c", HOST_MID_TURN, str(data_dir), str(marker)])
    transcript = data_dir / "sessions" / "s" / TRANSCRIPT_NAME

    def fast_result_recorded() -> bool:
        try:
            records, _, _ = read_records(transcript)
        except OSError:
            return False
        return any(r.get("type") == "result" and r.get("call_id") == "c1" for r in records)

    try:
        assert wait_for(fast_result_recorded, timeout_s=WAIT_S * 3), "the finished call was not recorded mid-turn"
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait(WAIT_S)
    model = ScriptedModel([Reply("resumed")])
    with ActorSystem(data_dir=data_dir) as system:
        system.register(add)
        result = prompt(system.start_loop("s"), None, model=model)
    assert result.text == "resumed"
    assert tool_messages(model.requests[0][0]) == [("c1", False, "done"), ("c2", True, INTERRUPTED)]
    assert marker.read_text() == "ran\n"  # the finished call ran once, and was not run again

"""Background calls: calls that outlive their turn, supervised as tasks (DESIGN §4
"Background calls"), through a real ActorSystem, a real worker process and a real host
killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from rho_actors import ActorSystem, ErrorKind, TaskError, TaskFinished, TaskSettings, ToolCall, tool
from rho_actors.agent.model import Message, Reply, ScriptedModel
from rho_actors.agent.transcript import TRANSCRIPT_NAME, load
from rho_actors.tasks import records

from .conftest import WAIT_S, read_line, wait_for

pytestmark = pytest.mark.timeout(120)

release = threading.Event()


@pytest.fixture(autouse=True)
def _released() -> None:
    release.clear()


@tool(background=True, background_timeout_ms=int(2 * WAIT_S * 1000))  # its wait ends first
def crawl(site: str) -> str:
    """Crawl a site (takes long: waits until the test lets it finish, WAIT_S at most)."""
    release.wait(WAIT_S)
    return f"crawled {site}"


@tool(background=True, background_timeout_ms=60_000)
def sleeper(seconds: float) -> int:
    """Sleep in a worker process and return its pid."""
    time.sleep(seconds)
    return os.getpid()


@tool(background=True, background_timeout_ms=300)
def overdue() -> str:
    """Run past its background deadline."""
    release.wait(WAIT_S)
    return "never"


def call(call_id: str, name: str, arguments: str = "{}") -> ToolCall:
    return ToolCall(call_id, name, arguments)


def test_a_background_call_answers_its_turn_at_once_and_its_result_follows(system: ActorSystem) -> None:
    system.register(crawl)
    loop = system.start_loop("s1")
    began = time.monotonic()
    [ack] = loop.run_turn([call("c1", "crawl", '{"site": "example.com"}')])
    took = time.monotonic() - began
    assert ack.ok and ack.details is not None
    task_id = ack.details["task_id"]
    assert f"runs in the background as task {task_id}" in ack.content
    assert took < WAIT_S  # the tool waits WAIT_S unless released: the turn did not wait for it
    [info] = loop.tasks()
    assert (info.task_id, info.call_id, info.name, info.status, info.result) == (task_id, "c1", "crawl", "working",
                                                                                 None)
    tasks_node = system.tree()["children"][-1]
    assert tasks_node["id"] == "tasks" and [c["id"] for c in tasks_node["children"]] == [task_id]
    assert 0 < tasks_node["children"][0]["ms_left"] <= 2 * WAIT_S * 1000
    with pytest.raises(TimeoutError, match=f"task {task_id} \\(crawl\\) is still working"):
        loop.task_result(task_id, timeout_s=0.05)
    release.set()
    done = loop.task_result(task_id, timeout_s=WAIT_S)
    assert done.status == "completed" and done.result is not None and done.result.content == "crawled example.com"
    assert done.finished is not None and done.finished >= done.started
    assert system.stats()["tasks"]["completed"] == 1 and system.stats()["tasks"]["open"] == 0


def test_a_task_past_its_background_deadline_failed_with_timeout(system: ActorSystem) -> None:
    system.register(overdue)
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([call("c1", "overdue")])
    done = loop.task_result(ack.details["task_id"], timeout_s=WAIT_S)
    assert done.status == "failed" and done.result is not None
    assert done.result.error_kind is ErrorKind.TIMEOUT and "300 ms" in done.result.content


def test_cancel_task_kills_the_worker_process_of_a_process_task(system: ActorSystem) -> None:
    system.register(sleeper, isolation="process")
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([call("c1", "sleeper", '{"seconds": 30}')])
    assert ack.ok, ack.content
    task_id = ack.details["task_id"]
    assert wait_for(lambda: system.tree()["children"][-1]["children"] != [])
    workers = {p.pid for p in psutil.Process().children(recursive=True)}
    cancelled = loop.cancel_task(task_id)
    assert cancelled.status == "cancelled" and cancelled.result is not None
    assert cancelled.result.error_kind is ErrorKind.CANCELLED
    assert loop.cancel_task(task_id) == cancelled  # cancelling an ended task returns it as it is
    assert wait_for(lambda: not any(p.pid in workers and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                                    for p in psutil.Process().children(recursive=True)
                                    if "sleeper" in " ".join(p.cmdline()))), "the sleeping worker still runs"


def test_a_turn_cancelled_after_the_acknowledgement_leaves_its_task_running(system: ActorSystem) -> None:
    from rho_actors import CancelToken

    system.register(crawl)
    loop = system.start_loop("s1")
    token = CancelToken()
    [ack] = loop.run_turn([call("c1", "crawl", '{"site": "a"}')], cancel=token)
    token.cancel("the host moved on")
    assert loop.tasks()[0].status == "working"
    release.set()
    assert loop.task_result(ack.details["task_id"], timeout_s=WAIT_S).status == "completed"


def test_the_bounds_refuse_a_background_call_past_them_naming_the_bound(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, tasks=TaskSettings(max_tasks_per_session=2, max_tasks=3)) as system:
        system.register(crawl)
        first, second = system.start_loop("s1"), system.start_loop("s2")
        acks = first.run_turn([call(f"c{i}", "crawl", '{"site": "a"}') for i in range(3)])
        assert [a.ok for a in acks] == [True, True, False]
        assert acks[2].error_kind is ErrorKind.UNAVAILABLE
        assert acks[2].content == ("tool 'crawl' did not run: 2 background calls are open in this session; the bound "
                                   "is 2 (max_tasks_per_session)")
        one, two = second.run_turn([call("d1", "crawl", '{"site": "b"}'), call("d2", "crawl", '{"site": "b"}')])
        assert one.ok and not two.ok and "3 background calls are open in the system; the bound is 3 (max_tasks)" \
            in two.content
        assert system.stats()["tasks"]["refused"] == 2
        release.set()


@pytest.mark.parametrize("bad", [{"max_tasks": 0}, {"max_tasks_per_session": True}, {"task_ttl_s": -1.0},
                                 {"max_timeout_ms": 1.5}])
def test_bad_task_settings_are_refused_naming_the_setting(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=f"TaskSettings.{next(iter(bad))}"):
        TaskSettings(**bad)  # type: ignore[arg-type]


def test_an_unknown_or_another_sessions_task_is_refused_naming_it(system: ActorSystem) -> None:
    system.register(crawl)
    mine, other = system.start_loop("mine"), system.start_loop("other")
    [ack] = mine.run_turn([call("c1", "crawl", '{"site": "a"}')])
    with pytest.raises(TaskError, match=f"session 'other' has no task '{ack.details['task_id']}'"):
        other.task_result(ack.details["task_id"])
    with pytest.raises(TaskError, match="session 'mine' has no task 't_nope'"):
        mine.cancel_task("t_nope")
    release.set()


def test_an_ended_task_is_forgotten_after_its_ttl_record_and_all(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, tasks=TaskSettings(task_ttl_s=0)) as system:
        system.register(crawl)
        loop = system.start_loop("s1")
        release.set()
        [ack] = loop.run_turn([call("c1", "crawl", '{"site": "a"}')])
        assert ack.ok
        assert wait_for(lambda: loop.tasks() == [])  # ended, and forgotten at once
        assert records.read_all(loop.data_dir) == []
        with pytest.raises(TaskError, match="ended more than task_ttl_s=0 s ago"):
            loop.task_result(ack.details["task_id"])


def _registry_growth(system: ActorSystem, sessions: range, background: bool) -> int:
    """Bytes the task registry's own code holds more after ``sessions`` each ran one turn
    (a background call forgotten at once, or a plain call) and stopped."""
    import tracemalloc

    from rho_actors.tasks import registry

    release.set()

    def run(n: int) -> None:
        loop = system.start_loop(f"s{n}")
        [result] = loop.run_turn([call("c", "crawl" if background else "echo", '{"site": "a"}')])
        assert result.ok, result.content
        if background:
            assert wait_for(lambda: loop.tasks() == [])
        loop.stop()

    run(-1)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, registry.__file__)])
        for n in sessions:
            run(n)
        after = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, registry.__file__)])
    finally:
        tracemalloc.stop()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))


@pytest.mark.parametrize("background", [False, True], ids=["no_task", "tasks_forgotten"])
def test_a_host_serving_sessions_without_end_keeps_nothing_for_those_without_a_task(
        tmp_path: Path, background: bool) -> None:
    """The task registry keeps a session's entry only while it has a task: 300 sessions
    more (about 80 bytes each, kept before) leave it no larger."""

    @tool
    def echo(site: str) -> str:
        """Echo."""
        return site

    with ActorSystem(data_dir=tmp_path, tasks=TaskSettings(task_ttl_s=0)) as system:
        system.register(crawl)
        system.register(echo)
        assert _registry_growth(system, range(300), background) < 4_096


def test_the_agent_loop_gives_the_model_a_finished_tasks_result_at_its_next_step(system: ActorSystem) -> None:
    system.register(crawl)
    loop = system.start_loop("s1")
    class ReleasingModel(ScriptedModel):  # the task ends once the model has answered its acknowledgement
        def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], **options: Any) -> Reply:
            reply = super().complete(messages, tools, **options)
            if len(self.requests) == 2:
                release.set()  # the prompt then waits for it
            return reply

    model = ReleasingModel([
        Reply("", (call("c1", "crawl", '{"site": "example.com"}'),)),
        Reply("The crawl is under way."),
        Reply("The crawl found it."),
    ])
    events = list(loop.stream("Crawl example.com", model=model, wait_for_tasks=True))
    finished = [e for e in events if isinstance(e, TaskFinished)]
    assert len(finished) == 1 and finished[0].task.result is not None
    assert finished[0].task.result.content == "crawled example.com"
    last_request = model.requests[2][0]
    delivered = last_request[-1]
    assert delivered.role == "user" and f"Background task {finished[0].task.task_id}" in delivered.text
    assert "crawled example.com" in delivered.text
    assert loop.tasks()[0].delivered
    track = load(loop.data_dir / TRANSCRIPT_NAME).calls["c1"]  # the call's lifecycle, in the transcript
    assert track.state == "settled" and track.states["backgrounded"]["task_id"] == finished[0].task.task_id
    # the next prompt does not give it again
    again = ScriptedModel([Reply("ok")])
    loop.prompt("Anything else?", model=again)
    texts = [m.text for m in again.requests[0][0] if m.role == "user"]
    assert sum("Background task" in t for t in texts) == 1


def test_without_wait_for_tasks_a_prompt_ends_and_the_next_one_gets_the_result(system: ActorSystem) -> None:
    system.register(crawl)
    loop = system.start_loop("s1")
    first = loop.prompt("Crawl a", model=ScriptedModel([Reply("", (call("c1", "crawl", '{"site": "a"}'),)),
                                                        Reply("started")]))
    assert first.ok and first.text == "started"
    release.set()
    loop.task_result(loop.tasks()[0].task_id, timeout_s=WAIT_S)
    model = ScriptedModel([Reply("it is done")])
    assert loop.prompt(None, model=model).text == "it is done"  # the result is something to continue with
    assert "crawled a" in model.requests[0][0][-1].text


_HOST = textwrap.dedent("""
    import asyncio, sys, threading
    from rho_actors import ActorSystem, ToolCall, tool

    @tool(background=True)
    def crawl(site: str) -> str:
        \"\"\"Crawl a site.\"\"\"
        threading.Event().wait(600)
        return "never"

    @tool(background=True)
    async def quick(site: str) -> str:
        \"\"\"Look at a site (async, at once).\"\"\"
        return f"quick look at {site}"

    @tool(background=True)
    async def watch(site: str) -> str:
        \"\"\"Watch a site (async, long).\"\"\"
        await asyncio.sleep(600)
        return "never"

    if __name__ == "__main__":
        system = ActorSystem(data_dir=sys.argv[1])
        for t in (crawl, quick, watch):
            system.register(t)
        loop = system.start_loop("s1")
        [ack] = loop.run_turn([ToolCall("c1", "crawl", '{"site": "a"}')])
        [done] = loop.run_turn([ToolCall("c2", "quick", '{"site": "b"}')])
        loop.task_result(done.details["task_id"], timeout_s=60)
        [watching] = loop.run_turn([ToolCall("c3", "watch", '{"site": "c"}')])
        print(ack.details["task_id"], done.details["task_id"], watching.details["task_id"], flush=True)
        threading.Event().wait(600)
""")


def test_a_host_killed_mid_task_leaves_it_failed_interrupted_for_the_next_host_delivered_once(
        tmp_path: Path) -> None:
    script = tmp_path / "host.py"
    script.write_text(_HOST)
    data = tmp_path / "data"
    host = subprocess.Popen([sys.executable, str(script), str(data)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        task_id, done_id, watch_id = read_line(host.stdout).split()  # type: ignore[arg-type]
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait(WAIT_S)
    assert task_id.startswith("t_")
    with ActorSystem(data_dir=data) as system:
        loop = system.start_loop("s1")
        info, done, watching = loop.tasks()  # in the order they started
        assert [(i.task_id, i.status) for i in (info, done, watching)] == [
            (task_id, "failed"), (done_id, "completed"), (watch_id, "failed")]
        assert done.result is not None and done.result.content == "quick look at b"
        for interrupted, name in ((info, "crawl"), (watching, "watch")):  # a thread's call and an async one
            assert interrupted.result is not None and interrupted.result.error_kind is ErrorKind.CANCELLED
            assert interrupted.result.content == (f"interrupted: the host stopped before the background call of "
                                                  f"tool {name!r} finished; it was not run again")
        assert system.stats()["tasks"]["interrupted"] == 2
        model = ScriptedModel([Reply("noted"), Reply("still noted")])
        loop.prompt("What happened?", model=model)
        loop.prompt("And now?", model=model)
        for tid, outcome in ((task_id, "failed (cancelled)"), (done_id, "finished"), (watch_id, "failed (cancelled)")):
            sent = [m for m in model.requests[1][0] if m.role == "user" and tid in m.text]
            assert len(sent) == 1 and outcome in sent[0].text
    with ActorSystem(data_dir=data) as system:  # a third host: still ended, delivered, nothing re-run
        again = system.start_loop("s1").tasks()
        assert [(i.status, i.delivered) for i in again] == [("failed", True), ("completed", True), ("failed", True)]


def test_a_damaged_task_record_is_skipped_with_the_others_kept(tmp_path: Path) -> None:
    session = tmp_path / "sessions" / "s1"
    folder = session / records.FOLDER
    folder.mkdir(parents=True)
    (folder / f"t_{'0' * 32}.json").write_text("{not json")
    good = {"task_id": f"t_{'1' * 32}", "call_id": "c1", "name": "crawl", "session_id": "s1",
            "status": "completed", "started": time.time(), "finished": time.time(), "delivered": False,
            "result": {"ok": True, "content": "done", "error_kind": None, "duration_ms": 1.0}}
    records.write(session, good)
    with ActorSystem(data_dir=tmp_path) as system:
        [info] = system.start_loop("s1").tasks()
    assert info.task_id == good["task_id"] and info.result is not None and info.result.content == "done"


@pytest.mark.parametrize("damage", [
    {"finished": "yesterday"}, {"finished": float("nan")}, {"started": float("inf")}, {"started": True},
    {"result": {"ok": True, "content": "done", "duration_ms": "slow"}},
    {"result": {"ok": False, "content": "x", "error_kind": ["crashed"]}},
])
def test_a_task_record_with_a_field_of_the_wrong_type_is_skipped(tmp_path: Path, damage: dict[str, object]) -> None:
    session = tmp_path / "sessions" / "s1"
    good = {"task_id": f"t_{'1' * 32}", "call_id": "c1", "name": "crawl", "session_id": "s1",
            "status": "completed", "started": time.time(), "finished": time.time(), "delivered": False,
            "result": {"ok": True, "content": "done", "error_kind": None, "duration_ms": 1.0}}
    records.write(session, good)
    damaged = {**good, "task_id": f"t_{'2' * 32}", **damage}
    folder = session / records.FOLDER
    (folder / f"{damaged['task_id']}.json").write_text(json.dumps({"v": 1, **damaged}))  # NaN, inf: as Python writes
    with ActorSystem(data_dir=tmp_path) as system:
        loop = system.start_loop("s1")
        assert [i.task_id for i in loop.tasks()] == [good["task_id"]]
        assert loop.run_turn([call("c2", "crawl", '{"site": "a"}')])[0].error_kind is ErrorKind.UNKNOWN_TOOL


def test_a_temporary_record_left_by_a_killed_host_is_removed_at_the_next_hosts_first_look(tmp_path: Path) -> None:
    folder = tmp_path / "sessions" / "s1" / records.FOLDER
    folder.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(WAIT_S)
    left = folder / f".t_{'3' * 32}.json.{dead.pid}.140000.tmp"  # a host killed between its write and its rename
    left.write_text('{"v": 1, "task_')
    ours = folder / f".t_{'4' * 32}.json.{os.getpid()}.140000.tmp"  # a writer still at work in a live process
    ours.write_text("{")
    with ActorSystem(data_dir=tmp_path) as system:
        assert system.start_loop("s1").tasks() == []
    assert not left.exists() and ours.exists()


class ClassCrawl:
    """A class tool declaring its background calls through the contract's callbacks, with
    a background deadline of ``deadline_ms`` (its name says which)."""

    def __init__(self, deadline_ms: int) -> None:
        self.deadline_ms = deadline_ms

    def name(self) -> str:
        return f"class_crawl_{self.deadline_ms}"

    @staticmethod
    def description() -> str:
        return "Crawl a site (a class tool)."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"site": {"type": "string"}}, "required": ["site"]}

    @staticmethod
    def background() -> bool:
        return True

    def background_timeout_ms(self) -> int:
        return self.deadline_ms

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        release.wait(WAIT_S)
        return f"crawled {args['site']}"


def test_a_class_tool_declares_background_and_its_deadline_through_the_contract(system: ActorSystem) -> None:
    loop = system.start_loop("s1")
    # its task must still run when the test looks at the tree after the acknowledgement: a loaded
    # machine may pass a short deadline first (the task timed out already), then again with a longer one
    for deadline_ms in (1_000, 4_000, 16_000):
        crawl = ClassCrawl(deadline_ms)
        system.register(crawl)
        [ack] = loop.run_turn([call(f"c{deadline_ms}", crawl.name(), '{"site": "a"}')])
        assert ack.ok and ack.details is not None, ack.content
        nodes = system.tree()["children"][-1]["children"]
        done = loop.task_result(ack.details["task_id"], timeout_s=WAIT_S)
        assert done.status == "failed" and done.result is not None
        assert done.result.error_kind is ErrorKind.TIMEOUT and f"{deadline_ms} ms" in done.result.content
        if nodes:
            break
    [node] = nodes
    assert 0 < node["ms_left"] <= deadline_ms


def test_a_background_deadline_is_capped_by_the_systems_max_timeout_ms(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, tasks=TaskSettings(max_timeout_ms=300)) as system:
        system.register(crawl)  # declares 60 s
        loop = system.start_loop("s1")
        [ack] = loop.run_turn([call("c1", "crawl", '{"site": "a"}')])
        done = loop.task_result(ack.details["task_id"], timeout_s=WAIT_S)
        assert done.status == "failed" and done.result is not None
        assert done.result.error_kind is ErrorKind.TIMEOUT and "300 ms" in done.result.content


@tool(background=True)
def big_report(size: int) -> str:
    """A report of ``size`` characters."""
    return "x" * size


@tool
def big_answer(size: int) -> str:
    """An answer of ``size`` characters, in the turn."""
    return "y" * size


def test_a_tasks_result_is_charged_to_its_sessions_result_budget(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, max_session_result_bytes=10_000) as system:
        system.register(big_report)
        system.register(big_answer)
        loop = system.start_loop("s1")
        [ack] = loop.run_turn([call("c1", "big_report", '{"size": 6000}')])
        done = loop.task_result(ack.details["task_id"], timeout_s=WAIT_S)
        assert done.status == "completed" and done.result is not None and len(done.result.content) == 6000
        [over] = loop.run_turn([call("c2", "big_answer", '{"size": 6000}')])  # what the task took is gone
        assert over.error_kind is ErrorKind.OUTPUT_LIMIT and "session's result budget" in over.content
        [ack2] = loop.run_turn([call("c3", "big_report", '{"size": 6000}')])
        refused = loop.task_result(ack2.details["task_id"], timeout_s=WAIT_S)
        assert refused.status == "failed" and refused.result is not None
        assert refused.result.error_kind is ErrorKind.OUTPUT_LIMIT and "result budget" in refused.result.content

"""``ray`` isolation against a real local Ray (started once for this module, loopback only)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from rho_actors import ActorSystem, CancelToken, ChildSpec, ErrorKind, Supervisor, ToolCall, start_link, tool, untrusted
from rho_actors.errors import RhoError
from rho_actors.isolation.servers import ServerUnreachable, call_server
from rho_actors.otp.names import Names
from rho_actors.results import text

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'rho_actors[ray]')")

from rho_actors.integrations.ray.servers import RayActor, RayCall, RayServerDown  # noqa: E402
from rho_actors.isolation.ray_tasks import (  # noqa: E402
    RayResources,
    RayRuntime,
    default_runtime,
    run_on_ray,
)
from tests.conftest import READS, WAIT_S, slack, wait_for  # noqa: E402

"""The deadline of the tests' Ray calls: a new Ray worker takes seconds to start on a busy machine."""


@pytest.fixture(scope="module")
def runtime() -> Iterator[RayRuntime]:
    if ray.is_initialized():
        pytest.skip("Ray is already initialized in this process by something else")
    rt = RayRuntime({"num_cpus": 2, "connect_timeout_s": 120})
    rt.connect()
    try:
        yield rt
    finally:
        rt.shutdown()


class Probe:
    """A tool doing what ``args["do"]`` says; ``pid_file`` receives its worker's pid."""

    @staticmethod
    def name() -> str:
        return "probe"

    @staticmethod
    def description() -> str:
        return "Test probe."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object"}

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        if "pid_file" in args:
            Path(args["pid_file"] + ".part").write_text(str(os.getpid()))
            os.replace(args["pid_file"] + ".part", args["pid_file"])  # whole, or not there
        do = args.get("do", "noop")
        if do == "noop":
            return {"echo": args.get("value"), "call_id": ctx["call_id"]}
        if do == "sleep":
            time.sleep(args["s"])
            return f"slept {args['s']}"
        if do == "raise":
            raise ValueError("bad value 42")
        if do == "exit":
            sys.exit(3)
        if do == "os_exit":
            os._exit(7)
        if do == "segfault":
            import ctypes

            ctypes.string_at(0)
        if do == "details":
            return {"output": "x"}
        raise AssertionError(do)


def call(runtime: RayRuntime, args: dict[str, Any], timeout_s: float = WAIT_S, *,
         cancel: CancelToken | None = None, resources: RayResources | None = None, call_id: str = "c1") -> Any:
    now = time.monotonic()  # the deadline's start is the call's: read later, it would shorten the stated timeout
    return run_on_ray(runtime, Probe, args, {"call_id": call_id, "session_id": "s"}, now + timeout_s,
                      cancel or CancelToken(), 10_000, resources or RayResources(num_cpus=0.5), name="probe",
                      started=now)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def read_pid(path: Path) -> int:
    assert wait_for(lambda: path.exists() and path.read_text() != ""), "the task never started"
    return int(path.read_text())


def test_noop_call_and_results_in_order(runtime: RayRuntime) -> None:
    results = [call(runtime, {"value": i}, call_id=f"c{i}") for i in range(3)]
    assert [r.call_id for r in results] == ["c0", "c1", "c2"]
    assert all(r.ok and r.error_kind is None for r in results), results
    assert [r.content for r in results] == [f'{{"echo": {i}, "call_id": "c{i}"}}' for i in range(3)]
    assert runtime.stats()["ray_tasks_running"] == 0


def test_hung_task_is_timeout_on_time_and_its_worker_killed(runtime: RayRuntime, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    for timeout_s in (2.0, 8.0, 32.0, WAIT_S):  # on a loaded machine the timeout may come before the task began
        started = time.monotonic()
        result = call(runtime, {"do": "sleep", "s": 60, "pid_file": str(pid_file)}, timeout_s=timeout_s)
        late = time.monotonic() - started - timeout_s
        assert result.error_kind is ErrorKind.TIMEOUT, result
        assert f"within its timeout of {timeout_s * 1000:.0f} ms" in result.content, result
        assert late < slack(1.0), f"the timeout result came {late:.2f} s after the deadline"
        if pid_file.exists():
            break
    pid = read_pid(pid_file)
    assert wait_for(lambda: pid_gone(pid)), f"worker {pid} still runs after its task was force-cancelled"


@pytest.mark.parametrize(("do", "kind", "words"), [
    ("raise", ErrorKind.RAISED, "raised ValueError: bad value 42"),
    ("exit", ErrorKind.EXITED, "SystemExit"),
    ("os_exit", ErrorKind.CRASHED, "WorkerCrashedError"),
    ("segfault", ErrorKind.CRASHED, "WorkerCrashedError"),
])
def test_failures_become_results(runtime: RayRuntime, do: str, kind: ErrorKind, words: str) -> None:
    result = call(runtime, {"do": do})
    assert result.error_kind is kind and words in result.content, result
    assert call(runtime, {"value": 1}).ok  # the next call is served


def test_worker_killed_from_outside_is_crashed(runtime: RayRuntime, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(call(runtime, {"do": "sleep", "s": 60,
                                                                          "pid_file": str(pid_file)})))
    thread.start()
    os.kill(read_pid(pid_file), signal.SIGKILL)
    thread.join(WAIT_S)
    assert box and box[0].error_kind is ErrorKind.CRASHED, box
    assert "WorkerCrashedError" in box[0].content


def test_infeasible_resource_is_unavailable_at_once(runtime: RayRuntime) -> None:
    started = time.monotonic()
    result = call(runtime, {}, resources=RayResources(num_cpus=1, resources={"tpu": 1}))
    assert result.error_kind is ErrorKind.UNAVAILABLE, result
    assert "tpu=1 (the largest node has 0)" in result.content
    result = call(runtime, {}, resources=RayResources(num_cpus=64))
    assert "CPU=64 (the largest node has 2)" in result.content
    assert time.monotonic() - started < slack(2.0)


def test_cancel_token_cancels_the_task(runtime: RayRuntime, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    cancel = CancelToken()
    box: list[Any] = []
    every_cpu = RayResources(num_cpus=2)
    thread = threading.Thread(target=lambda: box.append(call(runtime, {"do": "sleep", "s": 60,
                                                                          "pid_file": str(pid_file)},
                                                              cancel=cancel, resources=every_cpu)))
    thread.start()
    pid = read_pid(pid_file)
    [task] = runtime.tasks()  # the operator view: the task in flight
    assert task["call_id"] == "c1" and task["tool"] == "probe" and 0 < task["ms_left"] <= WAIT_S * 1000
    assert runtime.stats()["ray_tasks_running"] == 1
    # resources that exist but are busy: the call waits in Ray's queue until its deadline, no longer
    queued = call(runtime, {}, timeout_s=0.5, resources=every_cpu, call_id="c2")
    assert queued.error_kind is ErrorKind.TIMEOUT and queued.duration_ms < (0.5 + slack(1.0)) * 1000, queued
    cancel.cancel("stopping")
    thread.join(WAIT_S)
    assert box and box[0].error_kind is ErrorKind.CANCELLED and "stopping" in box[0].content, box
    assert wait_for(lambda: pid_gone(pid))


class Greeter:
    """An instance tool: its current state travels with each call (a new version)."""

    def __init__(self) -> None:
        self.greeting = "hello"

    def run(self, args: dict[str, Any], ctx: Any) -> str:
        return f"{self.greeting} {args['who']}"


def test_instance_state_travels_and_bad_arguments_are_named(runtime: RayRuntime) -> None:
    greeter = Greeter()

    def greet(args: dict[str, Any]) -> Any:
        return run_on_ray(runtime, greeter, args, {"call_id": "g"}, time.monotonic() + WAIT_S, CancelToken(),
                          1_000, RayResources(num_cpus=0.5), name="greet")

    assert greet({"who": "ann"}).content == "hello ann"

    @tool
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    shouted = run_on_ray(runtime, shout, {"text": "hi"}, {"call_id": "s"}, time.monotonic() + WAIT_S,
                         CancelToken(), 1_000, RayResources(num_cpus=0.5), name="shout")
    assert shouted.ok and shouted.content == "HI", shouted
    greeter.greeting = "bye"
    assert greet({"who": "ann"}).content == "bye ann"
    assert greet({"who": 3}).content == "bye 3"  # arguments travel as to a worker process (pickled)
    bad = greet({"who": threading.Lock()})
    assert bad.error_kind is ErrorKind.RAISED and "could not be sent to its Ray task" in bad.content, bad
    shared = default_runtime({"num_cpus": 2})
    assert default_runtime() is shared and default_runtime({"num_cpus": 2}) is shared
    with pytest.raises(ValueError, match=re.escape("already set up for Ray with {'num_cpus': 2}")):
        default_runtime({"address": "auto"})
    with pytest.raises(ValueError, match="unknown ray settings \\['adress'\\]"):
        RayRuntime({"adress": "auto"})


def test_untrusted_tools_are_refused(tmp_path: Path) -> None:
    @untrusted
    class Plugin(Probe):
        pass

    with ActorSystem(data_dir=tmp_path, untrusted=READS) as system:
        with pytest.raises(ValueError, match="untrusted tools cannot use isolation='ray': Ray unpickles"):
            system.register(Plugin, isolation="ray")
        with pytest.raises(ValueError, match="untrusted tools cannot use isolation='ray'"):
            system.register(Probe, untrusted=True, isolation="ray")
        with pytest.raises(ValueError, match="resources need an isolation that takes them"):
            system.register(Probe, resources={"num_cpus": 1})
        with pytest.raises(ValueError, match="isolation 'process' takes no resources"):
            system.register(Probe, isolation="process", resources={"num_cpus": 1})
        with pytest.raises(ValueError, match="'num_cpus' must be a number >= 0"):
            system.register(Probe, isolation="ray", resources={"num_cpus": -2})
        assert system.tools() == []


def test_bad_resources_are_named() -> None:
    with pytest.raises(ValueError, match="'num_gpus' must be a number >= 0"):
        RayResources.from_mapping({"num_gpus": -1})
    assert RayResources.from_mapping({"num_cpus": 2, "browser": 1}).demand() == {"CPU": 2.0, "browser": 1.0}


class Counter:
    def __init__(self, start: int) -> None:
        self.n = start

    def incr(self) -> int:
        self.n += 1
        return self.n

    def pid(self) -> int:
        return os.getpid()

    def block(self, s: float) -> None:
        time.sleep(s)

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def ports(self) -> list[int]:
        import psutil

        return sorted({c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN"})

    def block_marked(self, path: str, s: float) -> int:
        Path(path).write_text("began")
        time.sleep(s)
        return self.n


def test_ray_actor_server_restarted_by_rho(runtime: RayRuntime, tmp_path: Path) -> None:
    names = Names()
    spec = ChildSpec("counter", RayActor(Counter, 10, resources={"num_cpus": 0}, runtime=runtime, ping_ms=200),
                     name="counter")
    sup = start_link(Supervisor, [spec], strategy="one_for_one", max_restarts=5, max_seconds=30, names=names)
    try:
        first = names.whereis("counter")
        assert first is not None
        assert first.ask(RayCall("incr")) == 11
        assert first.proxy().call("incr").get(timeout=WAIT_S) == 12
        [view] = runtime.actors()
        assert view["class"] == "Counter" and len(view["node_id"]) == 56
        pid = first.ask(RayCall("pid"), block=True)
        # a call waiting on the server when its Ray actor dies gets an error, not a hang
        marker = tmp_path / "began"
        waiting = first.ask(RayCall("block_marked", (str(marker), 60)), block=False)
        queued = first.ask(RayCall("incr"), block=False)
        assert wait_for(marker.exists, WAIT_S)  # the call is under way in the Ray actor
        os.kill(pid, signal.SIGKILL)
        with pytest.raises((RayServerDown, pykka.ActorDeadError)) as died:
            waiting.get(timeout=WAIT_S)
        if isinstance(died.value, RayServerDown):
            assert died.value.key == "server_crashed" and "died during block_marked()" in str(died.value), died.value
        with pytest.raises((RayServerDown, pykka.ActorDeadError)):
            queued.get(timeout=WAIT_S)
        assert wait_for(lambda: names.whereis("counter") not in (None, first), WAIT_S)
        second = names.whereis("counter")
        assert second is not None and second.ask(RayCall("incr"), timeout=WAIT_S) == 11  # fresh state
        [info] = sup.proxy().which_children().get(timeout=WAIT_S)
        assert info.restarts == 1
        # an idle Ray actor that dies is found by the liveness ping
        os.kill(second.ask(RayCall("pid"), block=True), signal.SIGKILL)
        assert wait_for(lambda: names.whereis("counter") not in (None, second), WAIT_S)
        third = names.whereis("counter")
        assert third is not None and third.ask(RayCall("incr"), timeout=WAIT_S) == 11
        # a call past its deadline: the Ray actor cannot cancel a method, so it is killed
        third_pid = third.ask(RayCall("pid"), block=True)
        stuck = third.ask(RayCall("block", (60,), timeout_ms=300), block=False)
        behind = third.ask(RayCall("incr"), block=False)  # queued behind the stuck call: fails with it
        with pytest.raises(RayServerDown, match=r"did not answer block\(\) within 300 ms") as down:
            stuck.get(timeout=WAIT_S)
        assert down.value.key == "server_killed" and isinstance(down.value, RhoError)
        with pytest.raises(RayServerDown, match=r"did not answer block\(\) within 300 ms"):
            behind.get(timeout=WAIT_S)  # not its own 30 s deadline
        assert wait_for(lambda: pid_gone(third_pid))
        assert wait_for(lambda: names.whereis("counter") not in (None, third), WAIT_S)
        assert names.whereis("counter").ask(RayCall("incr"), timeout=WAIT_S) == 11  # type: ignore[union-attr]
    finally:
        sup.stop(timeout=WAIT_S)
    assert wait_for(lambda: runtime.actors() == [])


def test_tools_reach_a_ray_server_by_name(runtime: RayRuntime, system: ActorSystem) -> None:
    @tool
    def count(ctx: Any) -> int:
        """Count one more."""
        return int(ctx["whereis"]("counter").ask(RayCall("incr"), timeout=WAIT_S))

    system.register(count)
    # no runtime=: the system's own Ray runtime (one per system, shared with its ray calls)
    system.start_child(ChildSpec("counter", RayActor(Counter, 0, resources={"num_cpus": 0}), name="counter"))
    loop = system.start_loop()
    results = loop.run_turn([ToolCall("c1", "count", "{}"), ToolCall("c2", "count", "{}")])
    assert sorted(r.content for r in results) == ["1", "2"], results
    workers = next(c for c in system.tree()["children"] if c["id"] == "workers")
    [server] = workers["isolations"]["ray"]["actors"]
    assert server["class"] == "Counter" and server["calls"] == 2 and server["node"].startswith("node ")
    system.stop()
    assert runtime.actors() == []  # the test's own runtime never saw it


def test_call_server_turns_a_down_ray_server_into_the_models_text(runtime: RayRuntime, system: ActorSystem) -> None:
    """From a tool, a Ray server past a call's deadline and one whose Ray actor dies are
    the model's error texts of ``results.TEXTS`` (``server_killed``, ``server_crashed``),
    not a raise; the restarted server then answers with fresh state."""
    @tool(timeout_ms=60_000)
    def kv(method: str, ctx: Any) -> Any:
        """Call the counter."""
        if method == "block":
            return call_server(ctx, "counter", "block", 60, timeout_ms=500)
        return call_server(ctx, "counter", method)

    system.register(kv)
    system.start_child(ChildSpec("counter", RayActor(Counter, 0, resources={"num_cpus": 0}, ping_ms=200),
                                 name="counter"), max_restarts=3, max_seconds=60)
    loop = system.start_loop()
    [one] = loop.run_turn([ToolCall("c1", "kv", '{"method": "incr"}')])
    assert one.ok and one.content == "1", one
    first = system.whereis("counter")
    [stuck] = loop.run_turn([ToolCall("c2", "kv", '{"method": "block"}')])
    assert stuck.error_kind is ErrorKind.TIMEOUT, stuck
    assert stuck.content == text("server_killed", server="counter", method="block", timeout_ms=500), stuck
    assert wait_for(lambda: system.whereis("counter") not in (None, first), WAIT_S)
    second = system.whereis("counter")
    [died] = loop.run_turn([ToolCall("c3", "kv", '{"method": "die"}')])
    assert died.error_kind is ErrorKind.CRASHED, died
    assert died.content.startswith("server 'counter' died during die() (its Ray actor "), died
    assert "ActorDiedError" in died.content and "everything it held is lost" in died.content, died
    assert wait_for(lambda: system.whereis("counter") not in (None, second), WAIT_S)
    [fresh] = loop.run_turn([ToolCall("c4", "kv", '{"method": "incr"}')])
    assert fresh.ok and fresh.content == "1", fresh  # a fresh Ray actor


def _abort_connections_to(ports: list[int]) -> int:
    """Abort this process's TCP connections to ``ports`` (``ss -K``: a network blip, as
    an overloaded machine's gRPC sees); returns how many there were."""
    import psutil

    mine = [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port in ports]
    for conn in mine:
        subprocess.run(["ss", "-K", "sport", "=", f":{conn.laddr.port}", "dport", "=", f":{conn.raddr.port}"],
                       check=False, capture_output=True, timeout=WAIT_S)
    return len(mine)


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to abort a connection")
def test_a_ray_server_keeps_its_state_through_a_network_blip(runtime: RayRuntime, system: ActorSystem,
                                                             tmp_path: Path) -> None:
    """A connection to a Ray server's actor aborted mid-call (Ray's
    ``ActorUnavailableError``: temporary, the actor alive) fails that call with
    ``server_unreachable`` (it may or may not have run), but the server is not taken
    down: same Ray actor, same state, and the tool gets the model's text."""
    @tool(timeout_ms=60_000)
    def count(ctx: Any) -> Any:
        """Count one more."""
        return call_server(ctx, "counter", "incr")

    system.register(count)
    system.start_child(ChildSpec("counter", RayActor(Counter, 0, resources={"num_cpus": 0}, ping_ms=200),
                                 name="counter"), max_restarts=3, max_seconds=60)
    loop = system.start_loop()
    [one] = loop.run_turn([ToolCall("c1", "count", "{}")])
    assert one.ok and one.content == "1", one
    server = system.whereis("counter")
    assert server is not None
    ports = list(server.ask(RayCall("ports"), block=True, timeout=WAIT_S))
    marker = tmp_path / "began"
    blocked = server.ask(RayCall("block_marked", (str(marker), 3.0)), block=False)
    assert wait_for(marker.exists, WAIT_S)
    if _abort_connections_to(ports) == 0:
        pytest.skip("no connection of this process to the Ray actor was found")
    try:
        blocked.get(timeout=WAIT_S)
    except ServerUnreachable as exc:
        assert exc.key == "server_unreachable" and "may or may not have run" in str(exc), exc
        assert "ActorUnavailableError" in str(exc), exc
    except Exception as exc:
        raise AssertionError(f"the blip took the server down: {exc!r}") from None
    else:
        pytest.skip("the aborted connection was not the one carrying the call (it succeeded)")
    [two] = loop.run_turn([ToolCall("c2", "count", "{}")])
    assert two.ok and two.content == "2", two  # the same Ray actor, its state kept
    assert system.whereis("counter") is server
    assert wait_for(lambda: server.ask(RayCall("incr"), timeout=WAIT_S) == 3)


def test_a_ray_actor_class_from_a_local_module_runs_on_ray(runtime: RayRuntime, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A class from a local file on the host's sys.path (not installed, so not on the Ray
    workers' path) is shipped to Ray by value, as tools are."""
    import importlib

    from rho_actors.sandbox.shipping import local_modules

    name = f"local_tally_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        "class Tally:\n    def __init__(self):\n        self.n = 0\n\n"
        "    def add(self, k):\n        self.n += k\n        return self.n\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    assert local_modules(module.Tally) == [] and local_modules(module.Tally, installed_only=True) == [module]
    assert local_modules(Counter, installed_only=True) != []  # this test file is not installed either
    assert local_modules(RayCall, installed_only=True) == []  # rho_actors is on every worker
    ref = RayActor(module.Tally, resources={"num_cpus": 0}, runtime=runtime)()
    try:
        assert ref.ask(RayCall("add", (2,)), timeout=WAIT_S) == 2
        assert ref.ask(RayCall("add", (3,)), timeout=WAIT_S) == 5
    finally:
        ref.stop()


class WorkerPid:
    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> int:
        return os.getpid()


def test_two_hosts_share_one_ray_cluster_and_a_session_moves(runtime: RayRuntime, tmp_path: Path) -> None:
    """Two ActorSystems (two hosts) with their data_dir in one shared folder, running tool
    calls on one Ray cluster: a session begun on the first resumes on the second."""
    from rho_actors import Reply, ScriptedModel

    @tool
    def worker_pid(ctx: Any) -> str:
        """The pid of the Ray worker that ran this call."""
        result = run_on_ray(runtime, WorkerPid, {}, ctx, ctx["deadline"], ctx["cancel"], 1_000,
                            RayResources(num_cpus=0.5), name="worker_pid")
        assert result.ok, result
        return result.content

    shared = tmp_path / "shared"
    answers = []
    for host in ("a", "b"):
        with ActorSystem(data_dir=shared) as system:
            system.register(worker_pid)
            loop = system.start_loop("s1")
            model = ScriptedModel([Reply(tool_calls=(ToolCall(f"c-{host}", "worker_pid", "{}"),)),
                                   Reply(text=f"done on {host}")])
            assert loop.prompt(f"on {host}", model=model).text == f"done on {host}"
            answers.append(model.requests[-1][0])
    first, second = answers
    assert [m.tool_call_id for m in second if m.role == "tool"] == ["c-a", "c-b"]  # host b saw host a's step
    assert first[-1].text.isdigit() and int(first[-1].text) != os.getpid()  # it ran in a Ray worker


class Broken:
    def __init__(self) -> None:
        raise OSError("no browser binary")


def test_ray_actor_start_errors_are_named(runtime: RayRuntime) -> None:
    with pytest.raises(RuntimeError, match="tpu=1 \\(the largest node has 0\\)"):
        RayActor(Counter, 0, resources={"tpu": 1}, runtime=runtime)()
    with pytest.raises(RuntimeError, match="no browser binary"):
        RayActor(Broken, resources={"num_cpus": 0}, runtime=runtime)()
    with pytest.raises(ValueError, match="ping_ms must be milliseconds > 0"):
        RayActor(Counter, ping_ms=0)
    assert runtime.actors() == []


def test_a_system_runs_ray_tools_with_their_resources(runtime: RayRuntime, tmp_path: Path) -> None:
    """``register(tool, isolation="ray", resources=...)``: the system's calls run as Ray
    tasks with the tool's resources; the tree shows the isolation in use."""

    class Starved(Probe):
        @staticmethod
        def name() -> str:
            return "starved"

    with ActorSystem(data_dir=tmp_path) as system:
        system.register(Probe, isolation="ray", resources={"num_cpus": 0.5})
        system.register(Starved, isolation="ray", resources={"tpu": 1})
        loop = system.start_loop("s1")
        ok, starved = loop.run_turn([ToolCall("c1", "probe", '{"value": 7}'), ToolCall("c2", "starved", "{}")])
        assert ok.ok and '"echo": 7' in ok.content, ok
        assert starved.error_kind is ErrorKind.UNAVAILABLE and "tpu" in starved.content, starved
        workers = next(c for c in system.tree()["children"] if c["id"] == "workers")
        assert workers["isolations"]["ray"] == {"tasks": [], "actors": []}
        assert system.stats()["ray_tasks_total"] >= 1

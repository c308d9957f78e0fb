"""A background call of an idempotent tool that a host died running is run again, once,
by the next host on the same data folder (DESIGN §4 "Background calls"); one of a tool
that is not idempotent is ``failed`` ("interrupted") and never run again. Real hosts,
really killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rho_actors import ActorSystem, ErrorKind, ToolCall
from tests.task_rerun_tools import charge, reindex

from .conftest import WAIT_S, read_line, wait_for

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parent.parent

_HOST = textwrap.dedent("""
    import sys, threading
    from rho_actors import ActorSystem, ToolCall
    from tests.task_rerun_tools import charge, reindex
    with ActorSystem(data_dir=sys.argv[1]) as system:
        system.register(reindex)
        system.register(charge)
        loop = system.start_loop("s1")
        acks = loop.run_turn([ToolCall("c1", "reindex", '{"table": "users"}'),
                              ToolCall("c2", "charge", '{"amount": 5}')])
        print(" ".join(a.details["task_id"] for a in acks), flush=True)
        threading.Event().wait(600)
""")


def _host(data: Path, env: dict[str, str]) -> tuple[list[str], subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", _HOST, str(data)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    assert proc.stdout is not None
    return read_line(proc.stdout, WAIT_S * 3).split(), proc


def _kill(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(WAIT_S)
    assert proc.stdout is not None
    proc.stdout.close()


def _system(data: Path) -> ActorSystem:
    system = ActorSystem(data_dir=data, shutdown_ms=2_000)
    system.register(reindex)
    system.register(charge)
    return system


def test_a_host_killed_mid_task_an_idempotent_one_runs_again_once_the_other_is_interrupted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs, hold, data = tmp_path / "runs.log", tmp_path / "hold", tmp_path / "data"
    runs.touch()
    hold.touch()
    env = {**os.environ, "RHO_TEST_RUNS": str(runs), "RHO_TEST_HOLD": str(hold),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    task_ids, first = _host(data, env)
    try:
        assert wait_for(lambda: sorted(runs.read_text().splitlines()) == ["charge 5", "reindex users"], WAIT_S * 3)
    finally:
        _kill(first)
    hold.unlink()
    monkeypatch.setenv("RHO_TEST_RUNS", str(runs))
    for _ in range(2):  # the second host finds it run to its end: never again
        with _system(data) as system:
            loop = system.start_loop("s1")
            again = loop.task_result(task_ids[0], timeout_s=WAIT_S)
            assert (again.status, again.call_id) == ("completed", "c1")
            assert again.result is not None and again.result.content == "reindexed users"
            interrupted = loop.task_result(task_ids[1], timeout_s=WAIT_S)
            assert interrupted.status == "failed" and interrupted.result is not None
            assert interrupted.result.error_kind is ErrorKind.CANCELLED
            assert system.stats()["tasks"]["rerun"] in (0, 1)
    assert sorted(runs.read_text().splitlines()) == ["charge 5", "reindex users", "reindex users"]


def test_a_task_run_again_and_killed_again_is_not_run_a_third_time(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    runs, hold, data = tmp_path / "runs.log", tmp_path / "hold", tmp_path / "data"
    runs.touch()
    hold.touch()
    env = {**os.environ, "RHO_TEST_RUNS": str(runs), "RHO_TEST_HOLD": str(hold),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    task_ids, first = _host(data, env)
    try:
        assert wait_for(lambda: "reindex users" in runs.read_text(), WAIT_S * 3)
    finally:
        _kill(first)
    second = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, threading
        from rho_actors import ActorSystem
        from tests.task_rerun_tools import charge, reindex
        system = ActorSystem(data_dir=sys.argv[1])
        system.register(reindex)
        system.register(charge)
        system.start_loop("s1")
        print("STARTED", flush=True)
        threading.Event().wait(600)
    """), str(data)], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        assert second.stdout is not None and read_line(second.stdout, WAIT_S * 3).strip() == "STARTED"
        assert wait_for(lambda: runs.read_text().splitlines().count("reindex users") == 2, WAIT_S * 3)
    finally:
        _kill(second)
    hold.unlink()
    monkeypatch.setenv("RHO_TEST_RUNS", str(runs))
    with _system(data) as system:
        info = system.start_loop("s1").task_result(task_ids[0], timeout_s=WAIT_S)
        assert info.status == "failed" and info.result is not None
        assert info.result.error_kind is ErrorKind.CANCELLED
    assert runs.read_text().splitlines().count("reindex users") == 2


def test_a_task_of_a_tool_not_idempotent_keeps_no_arguments_in_its_record(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from rho_actors.tasks import records

    monkeypatch.setenv("RHO_TEST_RUNS", str(tmp_path / "runs.log"))
    with _system(tmp_path) as system:
        loop = system.start_loop("s1")
        for ack in loop.run_turn([ToolCall("c1", "reindex", '{"table": "t"}'), ToolCall("c2", "charge",
                                                                                       '{"amount": 1}')]):
            loop.task_result(ack.details["task_id"], timeout_s=WAIT_S)
        kept = {r["name"]: r.get("arguments") for r in records.read_all(loop.data_dir)}
    assert kept == {"reindex": {"table": "t"}, "charge": None}

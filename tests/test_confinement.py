"""OS confinement, tried for real: children confined by ``apply()`` try what an attacking
tool would (signal the host, read another session's transcript, write outside their
folder, escape with ``setsid``, outlive a ``kill -9`` of the host, fork-bomb, spread memory
over children), and the host kills and classifies what they did.

Children are forked from the test process and confine themselves first, as a worker
does; the ``kill -9`` test runs its host as a subprocess with a fork server. Each test
skips, saying why, when it needs root or a kernel feature this machine lacks."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from rho_actors import ErrorKind
from rho_actors.sandbox.confine.cgroups import Cgroup, find_hierarchy
from rho_actors.sandbox.confine.confinement import (
    Confinement,
    ConfinementError,
    apply,
    make_private_dir,
    make_session_dir,
    probe,
    python_read_paths,
)
from rho_actors.sandbox.confine.trees import RssSampler, classify_ending, kill_tree
from tests.conftest import WAIT_S, read_line, wait_for

ROOT = os.geteuid() == 0
HOST = probe()
needs_root = pytest.mark.skipif(not ROOT, reason="uid separation and RLIMIT_NPROC need a root host")
needs_landlock = pytest.mark.skipif(HOST.landlock is not None, reason=str(HOST.landlock))
needs_cgroup = pytest.mark.skipif(HOST.cgroup is not None, reason=str(HOST.cgroup))
# Mechanisms under test, one at a time: the others stay off so each test can fail on its own.
BARE = Confinement(
    uid=None, gid=None, landlock=False, no_new_privs=False, nproc=None, address_space=None, namespaces=False,
    disk_bytes=None, seccomp=False,
)
MIB = 2**20
_ = traceback  # preloaded: a child that dropped root may not be able to import it later


class Child:
    """A forked child that runs ``body(send)`` and reports JSON lines on a pipe."""

    def __init__(self, body: Callable[[Callable[[Any], None]], None]) -> None:
        r, w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            os.close(r)
            code = 0
            try:

                def send(obj: Any) -> None:
                    os.write(w, json.dumps(obj).encode() + b"\n")

                body(send)
            except BaseException as exc:
                os.write(w, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode() + b"\n")
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        self._r = os.fdopen(r, "rb")
        self.status: int | None = None

    def read(self, timeout_s: float = WAIT_S) -> Any:
        """The next line the child sent; fails the test after ``timeout_s``."""
        line = read_line(self._r, timeout_s)  # not select on the fd: a first readline may have buffered this line
        assert line, f"child {self.pid} ended without answering (status {self.wait()})"
        answer = json.loads(line)
        assert "error" not in answer, answer["error"]
        return answer

    def wait(self, timeout_s: float = WAIT_S) -> int:
        """The child's ``returncode`` (``-N`` for signal N); fails the test after ``timeout_s``."""
        if self.status is None:
            until = time.monotonic() + timeout_s
            while (done := os.waitpid(self.pid, os.WNOHANG)) == (0, 0):
                assert time.monotonic() < until, f"child {self.pid} still running after {timeout_s} s"
                time.sleep(0.005)
            self.status = os.waitstatus_to_exitcode(done[1])
        return self.status

    def close(self) -> None:
        if self.status is None:
            kill_tree(self.pid)
            self.wait()
        self._r.close()


@pytest.fixture
def children() -> Iterator[Callable[[Callable[[Callable[[Any], None]], None]], Child]]:
    started: list[Child] = []

    def start(body: Callable[[Callable[[Any], None]], None]) -> Child:
        started.append(Child(body))
        return started[-1]

    yield start
    for child in started:
        child.close()


@pytest.fixture
def cgroup(request: pytest.FixtureRequest) -> Iterator[Callable[..., Cgroup]]:
    made: list[Cgroup] = []

    def make(**bounds: int | None) -> Cgroup:
        made.append(Cgroup(f"test-{len(made)}-{request.node.name[:20]}", **bounds))
        return made[-1]

    yield make
    for group in made:
        group.kill()
        group.remove()


def _gone(pids: list[int]) -> bool:
    def dead(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return all(dead(pid) for pid in pids)


def _unique_uid() -> int:
    """A uid no other process on this machine uses, so RLIMIT_NPROC counts only the test's."""
    return 2_000_000_000 + (os.getpid() % 100_000) * 100 + threading.get_native_id() % 100


# --- identity ---------------------------------------------------------------------------------


@needs_root
def test_dropped_uid_cannot_signal_the_host_nor_read_another_sessions_file(children: Any) -> None:
    base = Path(tempfile.mkdtemp(prefix="rho-actors-test-"))
    try:
        base.chmod(0o755)
        session = Path(make_session_dir(str(base / "sessions" / "other")))
        (session / "transcript.jsonl").write_text('{"text": "4111 1111 1111 1111"}\n')
        open_dir = base / "public"
        open_dir.mkdir(mode=0o755)
        (open_dir / "readme.txt").write_text("readable")
        host = os.getpid()

        def body(send: Callable[[Any], None]) -> None:
            applied = apply(Confinement(pid_namespace=False, landlock=False, nproc=None, address_space=None))
            answer: dict[str, Any] = {"applied": applied, "uid": os.getuid()}
            for name, attempt in (
                ("signal", lambda: os.kill(host, signal.SIGTERM)),
                ("read", (session / "transcript.jsonl").read_text),
                ("list", lambda: os.listdir(session)),
                ("regain", lambda: os.setuid(0)),
            ):
                try:
                    attempt()
                    answer[name] = "allowed"
                except OSError as exc:
                    answer[name] = errno.errorcode[exc.errno or 0]
            answer["control"] = (open_dir / "readme.txt").read_text()
            send(answer)

        answer = children(body).read()
        assert session.stat().st_mode & 0o777 == 0o700
        assert "identity" in answer["applied"] and answer["uid"] == 65534
        assert answer["signal"] == "EPERM"
        assert answer["read"] == answer["list"] == "EACCES"
        assert answer["regain"] == "EPERM"
        assert answer["control"] == "readable"  # the denials come from the identity, not a broken child
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=True)


def test_session_dir_is_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        fresh = make_session_dir(str(tmp_path / "a" / "s1"))
        loose = tmp_path / "b"
        loose.mkdir(mode=0o777)
        make_session_dir(str(loose))
    finally:
        os.umask(old)
    assert Path(fresh).stat().st_mode & 0o777 == 0o700
    assert loose.stat().st_mode & 0o777 == 0o700


@needs_root
def test_private_dir_belongs_to_the_dropped_uid() -> None:
    path = make_private_dir()
    try:
        st = os.stat(path)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (65534, 65534, 0o700)
    finally:
        os.rmdir(path)


# --- filesystem -------------------------------------------------------------------------------


@needs_landlock
def test_landlock_allows_only_python_and_the_private_dir(tmp_path: Path, children: Any) -> None:
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("host data")
    read_only = tmp_path / "code"
    read_only.mkdir()
    (read_only / "tool.py").write_text("X = 1\n")
    private = make_private_dir(uid=None)

    def body(send: Callable[[Any], None]) -> None:
        before = secret.read_text()
        spec = Confinement(
            pid_namespace=False,  # forked by multiprocessing: no PID namespace of its own
            uid=None,
            read_only=python_read_paths(modules=[str(read_only)], exclude=[str(tmp_path / "elsewhere")]),
            private_dir=private,
            address_space=None,
            disk_bytes=None,  # the folder stays on the host's disk: the host reads it below
        )
        answer: dict[str, Any] = {"applied": apply(spec), "before": before}
        for name, attempt in (
            ("read_outside", secret.read_text),
            ("write_outside", lambda: (tmp_path / "new.txt").write_text("x")),
            ("write_read_only", lambda: (read_only / "tool.py").write_text("X = 2\n")),
            ("read_code", (read_only / "tool.py").read_text),
            ("write_private", lambda: Path(os.environ["TMPDIR"], "scratch.txt").write_text("ok")),
            ("devnull", lambda: Path("/dev/null").write_text("x")),
        ):
            try:
                attempt()
                answer[name] = "allowed"
            except OSError as exc:
                answer[name] = errno.errorcode[exc.errno or 0]
        answer["cwd"] = os.getcwd()
        send(answer)

    try:
        answer = children(body).read()
        assert "landlock" in answer["applied"] and answer["before"] == "host data"
        assert answer["read_outside"] == answer["write_outside"] == answer["write_read_only"] == "EACCES"
        assert answer["read_code"] == answer["write_private"] == answer["devnull"] == "allowed"
        assert answer["cwd"] == private and (Path(private) / "scratch.txt").read_text() == "ok"
    finally:
        subprocess.run(["rm", "-rf", private], check=True)


@pytest.mark.skipif("signals" not in HOST.detail.get("landlock", ""), reason="needs Landlock ABI 6 (signal scoping)")
def test_landlock_alone_keeps_a_child_from_signalling_the_host(children: Any) -> None:
    host = os.getpid()

    def body(send: Callable[[Any], None]) -> None:
        apply(Confinement(pid_namespace=False, uid=None, read_only=python_read_paths(), address_space=None))
        try:
            os.kill(host, signal.SIGTERM)
            send({"signal": "allowed"})
        except OSError as exc:
            send({"signal": errno.errorcode[exc.errno or 0], "uid": os.getuid()})

    assert children(body).read() == {"signal": "EPERM", "uid": os.getuid()}


@pytest.mark.parametrize("binding", [{"no_new_privs": True}, {"landlock": True}, {"uid": os.geteuid()},
                                     {"namespaces": True}, {"no_new_privs": True, "seccomp": True}])
def test_apply_refuses_a_multithreaded_process_what_binds_one_thread(children: Any, binding: dict[str, Any]) -> None:
    def body(send: Callable[[Any], None]) -> None:
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()
        try:
            apply(replace(BARE, **binding))
            send({"applied": True})
        except ConfinementError as exc:
            send({"refused": str(exc)})
        finally:
            stop.set()

    assert "single-threaded" in children(body).read()["refused"]


def test_apply_contains_a_multithreaded_process_when_nothing_binds_one_thread(children: Any) -> None:
    """A trusted worker's containment (session, subreaper, rlimits) applies in a process
    whose import started threads (numpy's OpenBLAS): nothing there binds one thread."""
    def body(send: Callable[[Any], None]) -> None:
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()
        try:
            send({"applied": list(apply(BARE)), "threads": threading.active_count()})
        finally:
            stop.set()

    assert children(body).read() == {"applied": ["pdeathsig", "session", "subreaper", "rlimits"], "threads": 2}


# --- process tree -----------------------------------------------------------------------------


def _sleep_forever() -> None:
    while True:
        signal.pause()


def _escape(send_pid: Callable[[int], None], *, double: bool) -> None:
    """Start a ``setsid`` process: directly, or by a double fork whose middle process exits."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if double and os.fork() != 0:
            os._exit(0)
        os.setsid()
        os.write(w, f"{os.getpid()}\n".encode())
        _sleep_forever()
    if double:
        os.waitpid(pid, 0)
    send_pid(int(os.read(r, 64)))


def test_kill_tree_kills_setsid_escapes(children: Any) -> None:
    def body(send: Callable[[Any], None]) -> None:
        apply(BARE)
        pids: list[int] = []
        _escape(pids.append, double=False)
        _escape(pids.append, double=True)
        send({"pids": pids, "sids": [os.getsid(p) for p in pids], "ppids": [psutil.Process(p).ppid() for p in pids]})
        _sleep_forever()

    child = children(body)
    answer = child.read()
    pids = answer["pids"]
    assert answer["sids"] == pids  # both left the child's session
    assert answer["ppids"] == [child.pid, child.pid]  # the orphan reparented to the child (a subreaper)
    killed = kill_tree(child.pid)
    assert set(killed) == {child.pid, *pids}
    assert child.wait() == -signal.SIGKILL
    assert wait_for(lambda: _gone(pids)), [psutil.Process(p).status() for p in pids if psutil.pid_exists(p)]


def test_child_whose_parent_already_died_kills_itself(children: Any) -> None:
    def body(send: Callable[[Any], None]) -> None:
        apply(Confinement(pid_namespace=False, uid=None, landlock=False, parent_pid=1, address_space=None))
        send({"survived": True})

    child = children(body)
    assert child.wait() == -signal.SIGKILL


_HOST_SCRIPT = """
import multiprocessing, os, signal, sys, time

def escape(double):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if double and os.fork() != 0:
            os._exit(0)
        os.setsid()
        os.write(w, b"%d\\n" % os.getpid())
        while True:
            signal.pause()
    if double:
        os.waitpid(pid, 0)
    return int(os.read(r, 64))

def worker(conn):
    from rho_actors.sandbox.confine.confinement import Confinement, apply
    apply(Confinement(pid_namespace=False, uid=None, landlock=False, address_space=None))
    conn.send([os.getppid(), escape(False), escape(True)])
    while True:  # busy
        pass

if __name__ == "__main__":
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["rho_actors.sandbox.confine.confinement"])
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=worker, args=(child,))
    proc.start()
    print(" ".join(map(str, [proc.pid, *parent.recv()])), flush=True)
    time.sleep(600)
"""


def test_kill_9_of_the_host_leaves_no_worker_nor_escape(tmp_path: Path) -> None:
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(_HOST_SCRIPT))
    host = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, cwd=tmp_path)
    try:
        assert host.stdout is not None
        worker, fork_server, *escapes = map(int, read_line(host.stdout, 3 * WAIT_S).split())
        assert psutil.Process(fork_server).ppid() == host.pid
        assert all(psutil.Process(p).ppid() in (worker, fork_server) for p in escapes)
        host.kill()
        assert host.wait(WAIT_S) == -signal.SIGKILL
        pids = [fork_server, worker, *escapes]
        assert wait_for(lambda: _gone(pids), WAIT_S), {p: psutil.Process(p).name() for p in pids if not _gone([p])}
    finally:
        host.kill()
        host.wait(WAIT_S)


# --- limits -----------------------------------------------------------------------------------


@needs_root
def test_fork_bomb_is_contained_and_killed(children: Any, cgroup: Callable[..., Cgroup]) -> None:
    cap = 24
    group = cgroup(memory_max=None, pids_max=cap) if HOST.cgroup is None else None
    uid = _unique_uid()

    def body(send: Callable[[Any], None]) -> None:
        procs = () if group is None else group.procs_files
        apply(Confinement(pid_namespace=False, uid=uid, gid=uid, landlock=False, nproc=cap, address_space=None,
                          cgroup_procs=procs))
        send({"uid": os.getuid()})
        while True:
            try:
                if os.fork() == 0:
                    continue
            except OSError:
                break
        _sleep_forever()

    child = children(body)
    assert child.read()["uid"] == uid

    def tree() -> list[int]:
        return [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]

    assert wait_for(lambda: len(tree()) >= cap - 2, WAIT_S), f"the bomb reached only {len(tree())} processes"
    time.sleep(0.05)  # let it try to grow past the cap
    bomb = tree()
    assert len(bomb) <= cap
    if group is not None:
        assert len(group.pids()) <= cap
    killed = kill_tree(child.pid)
    assert set(bomb) <= set(killed)
    assert child.wait() == -signal.SIGKILL
    assert wait_for(lambda: _gone(bomb), WAIT_S)


def _spread_memory(send: Callable[[Any], None], procs: tuple[str, ...], each: int) -> None:
    apply(Confinement(pid_namespace=False, uid=None, landlock=False, address_space=512 * MIB, cgroup_procs=procs))
    pids = []
    for _ in range(8):
        pid = os.fork()
        if pid == 0:
            block = bytearray(b"\x01") * each  # written, so resident
            del block[:1]
            _sleep_forever()
        pids.append(pid)
    send({"pids": pids})
    _sleep_forever()


@needs_cgroup
def test_memory_spread_over_children_stops_at_the_cgroup_bound(children: Any, cgroup: Callable[..., Cgroup]) -> None:
    bound = 96 * MIB
    group = cgroup(memory_max=bound, pids_max=32)
    child = children(lambda send: _spread_memory(send, group.procs_files, 24 * MIB))
    pids = child.read()["pids"]
    assert wait_for(group.memory_bound_hit, WAIT_S), group.memory_events()
    group.kill()
    ending = classify_ending(child.wait(), memory_bound_hit=group.memory_bound_hit(), memory_bound="96 MiB")
    assert ending.kind is ErrorKind.MEMORY and "96 MiB" in ending.message
    assert wait_for(lambda: _gone(pids), WAIT_S)
    peak = group.dirs["memory"] + ("/memory.peak" if group.version == 2 else "/memory.max_usage_in_bytes")
    assert int(Path(peak).read_text()) <= bound


def test_memory_spread_over_children_stops_at_the_sampler_bound(children: Any) -> None:
    bound = 96 * MIB
    child = children(lambda send: _spread_memory(send, (), 24 * MIB))
    pids = child.read()["pids"]
    sampler = RssSampler(child.pid, bound, interval_s=0.02).start()
    try:
        assert sampler.exceeded.wait(WAIT_S), f"peak {sampler.peak_bytes / MIB:.0f} MiB"
    finally:
        sampler.stop()
    assert sampler.peak_bytes > bound
    ending = classify_ending(child.wait(), memory_bound_hit=sampler.exceeded.is_set())
    assert ending.kind is ErrorKind.MEMORY
    assert wait_for(lambda: _gone(pids), WAIT_S)


@needs_cgroup
def test_external_sigkill_is_crashed_naming_the_signal(children: Any, cgroup: Callable[..., Cgroup]) -> None:
    group = cgroup(memory_max=256 * MIB, pids_max=8)

    def body(send: Callable[[Any], None]) -> None:
        apply(Confinement(pid_namespace=False, uid=None, landlock=False, address_space=None,
                          cgroup_procs=group.procs_files))
        send({"ready": True})
        _sleep_forever()

    child = children(body)
    child.read()
    assert group.pids() == [child.pid]
    os.kill(child.pid, signal.SIGKILL)
    ending = classify_ending(child.wait(), memory_bound_hit=group.memory_bound_hit())
    assert ending.kind is ErrorKind.CRASHED
    assert ending.message == "the worker was killed by signal SIGKILL from outside the pool"
    assert classify_ending(-9, killed_for=ErrorKind.TIMEOUT).kind is ErrorKind.TIMEOUT


def test_probe_says_what_this_host_offers() -> None:
    report = HOST.as_dict()
    assert set(report) == {
        "identity", "landlock", "user_namespaces", "cgroup", "subreaper", "python_readable", "namespaces", "seccomp",
    }
    assert report["identity"]["available"] is ROOT
    hierarchy = find_hierarchy()
    assert report["cgroup"]["available"] is not isinstance(hierarchy, str)
    assert all(isinstance(entry["reason"], str) for entry in report.values())


def test_read_paths_of_a_script_folder_name_its_code_and_a_linked_entry_by_its_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of a ``sys.path`` folder outside the installation, a confined child reads its code
    entries only, a linked one by the path it leads to (Landlock rules bind real paths),
    never its ``.env``; the folder itself is listed only. The same with the split given."""
    from rho_actors.sandbox.confine.code_paths import split_sys_path

    folder, elsewhere = tmp_path / "script", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    (folder / "tool.py").write_text("")
    (folder / ".env").write_text("SECRET=1")
    (elsewhere / "helper.py").write_text("")
    (folder / "helper.py").symlink_to(elsewhere / "helper.py")
    monkeypatch.syspath_prepend(str(folder))
    split = split_sys_path()
    for read in (python_read_paths(), python_read_paths(split=split)):
        mine = [p for p in read if p.startswith(str(tmp_path))]
        assert mine == [str(elsewhere / "helper.py"), str(folder / "tool.py")], mine
    assert str(folder) in split[1]

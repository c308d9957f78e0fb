"""Selftests in throwaway processes, and the ``rho-actors selftest`` command."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, Error, Ok, tool, untrusted
from rho_actors.cli import main
from rho_actors.selftest import SelftestRow, load_target, run_selftests, selftest_system, tools_in_module
from tests.conftest import WAIT_S, slack

BASE = textwrap.dedent("""
    import asyncio, os, subprocess, sys, tempfile, time
    from pathlib import Path
    from rho_actors import Error, Ok, tool


    class _Base:
        @classmethod
        def name(cls):
            return cls.__name__.lower()

        @staticmethod
        def description():
            return "a test tool"

        @staticmethod
        def parameter_schema():
            return {"type": "object"}

        @staticmethod
        def run(args, ctx):
            return "ran"
""")


def tools_file(tmp_path: Path, filename: str, body: str) -> Path:
    path = tmp_path / filename
    path.write_text(BASE + textwrap.dedent(body))
    return path


def load_tools(path: Path) -> list[Any]:
    [module] = load_target(str(path))
    return tools_in_module(module)


OUTCOMES = """
    class Passes(_Base):
        @staticmethod
        def selftest():
            return Ok("3 checks")

    class PassesWithNone(_Base):
        @staticmethod
        def selftest():
            print("chatty")

    class ReturnsError(_Base):
        @staticmethod
        def selftest():
            return Error("the index is stale")

    class Raises(_Base):
        @staticmethod
        def selftest():
            raise KeyError("config")

    class Exits(_Base):
        @staticmethod
        def selftest():
            sys.exit(4)

    class ReturnsFalse(_Base):
        @staticmethod
        def selftest():
            return False

    class ReturnsJunk(_Base):
        @staticmethod
        def selftest():
            return 42

    class Awaits(_Base):
        @staticmethod
        async def selftest():
            await asyncio.sleep(0)
            return Error({"async": True})

    class Hangs(_Base):
        @staticmethod
        def selftest():
            time.sleep(60)

    class Aborts(_Base):
        @staticmethod
        def selftest():
            os.abort()

    class Vanishes(_Base):
        @staticmethod
        def selftest():
            os._exit(3)

    class Untested(_Base):
        pass

    @tool
    def plain(a: int) -> int:
        \"\"\"Plain.\"\"\"
        return a

    @tool
    def checked(a: int) -> int:
        \"\"\"Checked.\"\"\"
        return a

    checked.selftest = lambda: Ok(checked(2))
"""


def test_every_outcome(tmp_path: Path) -> None:
    tools = load_tools(tools_file(tmp_path, "outcomes.py", OUTCOMES))
    timeout_s = float(max(1, round(slack(1.0))))  # a quiet second, whole seconds as this machine keeps up now
    started = time.monotonic()
    rows = run_selftests(tools, timeout_s=timeout_s, max_parallel=8)
    elapsed = time.monotonic() - started
    by_name = {row.tool: row for row in rows}
    # Under load a selftest that answers may not have started its process within the short
    # bound: those (and only those) run again with the tests' wait bound; the hang stays as is.
    late = [t for t, row in zip(tools, rows, strict=False) if row.outcome == "timeout" and row.tool != "hangs"]
    by_name.update((row.tool, row) for row in run_selftests(late, timeout_s=WAIT_S, max_parallel=8))
    assert [row.tool for row in rows] == [
        "passes", "passeswithnone", "returnserror", "raises", "exits", "returnsfalse", "returnsjunk", "awaits",
        "hangs", "aborts", "vanishes", "untested", "plain", "checked",
    ]

    def check(name: str, outcome: str, message: str = "") -> SelftestRow:
        row = by_name[name]
        assert row.outcome == outcome, row
        assert message in row.message, row
        return row

    check("passes", "passed", "3 checks")
    assert "chatty" in check("passeswithnone", "passed").output
    check("returnserror", "failed", "the index is stale")
    assert "KeyError" in check("raises", "failed", "selftest() raised KeyError: 'config'").output
    check("exits", "failed", "SystemExit: 4")
    check("returnsfalse", "failed", "returned False")
    check("returnsjunk", "failed", "returned a int")
    check("awaits", "failed", '{"async": true}')
    hung = check("hangs", "timeout", f"no answer within {timeout_s:g} s: its process group was killed")
    assert 900 * timeout_s <= hung.duration_ms < 1000 * timeout_s + WAIT_S * 1000
    aborted = check("aborts", "crashed", "died of SIGABRT")
    assert "Fatal Python error: Aborted" in aborted.output  # the fault handler says where
    check("vanishes", "crashed", "exited with code 3 without an answer")
    assert check("untested", "no selftest").duration_ms == 0.0
    check("plain", "no selftest")
    check("checked", "passed", "2")
    assert elapsed < timeout_s + WAIT_S  # the one hang is bounded; the rest ran beside it


def test_side_effects_stay_in_a_removed_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    tools = load_tools(tools_file(tmp_path, "writer.py", """
        class Writer(_Base):
            @staticmethod
            def selftest():
                made = [Path("in_cwd.txt"), Path(tempfile.gettempdir()) / "in_tmp.txt",
                        Path.home() / "in_home.txt", Path(os.path.expanduser("~/dot.txt"))]
                for path in made:
                    path.write_text("x")
                return Ok({"files": [str(p.resolve()) for p in made], "cwd": os.getcwd(),
                           "env": [os.environ[v] for v in ("HOME", "TMPDIR", "TMP", "TEMP")]})
    """))
    [row] = run_selftests(tools, timeout_s=WAIT_S)
    assert row.outcome == "passed", row
    seen = json.loads(row.message)
    workdir = Path(seen["cwd"])
    assert seen["env"] == [seen["cwd"]] * 4
    assert workdir.parent.name.startswith("rho_selftest-") and workdir != tmp_path
    assert all(Path(f).parent == workdir.resolve() for f in seen["files"])
    assert not workdir.parent.exists()  # removed, files and all
    assert sorted(p.name for p in tmp_path.iterdir()) == ["writer.py"]


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie has ended
    except FileNotFoundError:
        return True


def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    tools = load_tools(tools_file(tmp_path, "spawner.py", f"""
        class Spawner(_Base):
            @staticmethod
            def selftest():
                child = subprocess.Popen(["sleep", "60"])
                Path({str(pid_file)!r} + ".tmp").write_text(str(child.pid))
                os.rename({str(pid_file)!r} + ".tmp", {str(pid_file)!r})  # whole, or not there
                time.sleep(60)
    """))
    for timeout_s in (1.0, 4.0, 16.0, WAIT_S):  # on a loaded machine the timeout may come before the spawn
        [row] = run_selftests(tools, timeout_s=timeout_s)
        assert row.outcome == "timeout"
        if pid_file.exists():
            break
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + WAIT_S
    while not _dead(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _dead(pid)


def test_selftests_run_side_by_side(tmp_path: Path) -> None:
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    body = "".join(f"""
        class Meets{i}(_Base):
            @staticmethod
            def selftest():
                Path({str(meeting)!r}, "{i}").touch()
                until = time.monotonic() + {WAIT_S}
                while len(os.listdir({str(meeting)!r})) < 4:
                    if time.monotonic() > until:
                        return Error("not run side by side")
                    time.sleep(0.005)
    """ for i in range(4))
    rows = run_selftests(load_tools(tools_file(tmp_path, "meet.py", body)), timeout_s=WAIT_S, max_parallel=4)
    assert [row.outcome for row in rows] == ["passed"] * 4, rows


@tool
def doubler(n: int) -> int:
    """Double a number."""
    return 2 * n


doubler.selftest = lambda: Ok("fine") if doubler(2) == 4 else Error("2 * 2 != 4")


class Hidden:
    """An untrusted tool: its name is read in the child, never here."""

    @staticmethod
    def name() -> str:
        raise AssertionError("read in the host")

    @staticmethod
    def description() -> str:
        return "hidden"

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object"}

    @staticmethod
    def run(args: Any, ctx: Any) -> str:
        return "ran"

    @staticmethod
    def selftest() -> Any:
        return None


def test_a_systems_tools_and_names(system: ActorSystem) -> None:
    system.register(doubler)
    rows = selftest_system(system, timeout_s=WAIT_S)
    assert [(r.tool, r.outcome, r.message) for r in rows] == [("doubler", "passed", "fine")]

    class Named(Hidden):
        @staticmethod
        def name() -> str:
            return "named_in_child"

    marked = untrusted(type("Marked", (Named,), {}))
    [row] = run_selftests([marked], timeout_s=WAIT_S)
    assert (row.tool, row.outcome) == ("named_in_child", "passed")
    [row] = run_selftests({"given": doubler}, timeout_s=WAIT_S)
    assert row.tool == "given"
    assert run_selftests([]) == []
    with pytest.raises(ValueError, match="timeout_s"):
        run_selftests([doubler], timeout_s=0)
    with pytest.raises(ValueError, match="start_method"):
        run_selftests([doubler], start_method="fork")


def test_tools_in_module(tmp_path: Path) -> None:
    (tmp_path / "helper_mod.py").write_text(BASE)
    path = tools_file(tmp_path, "found.py", """
        class Own(_Base):
            pass

        class WithInstance:
            def name(self):
                return "instance"

            def description(self):
                return "d"

            def parameter_schema(self):
                return {"type": "object"}

            def run(self, args, ctx):
                return 1

        the_instance = WithInstance()
        alias = Own
    """)
    found = load_tools(path)
    # _Base is private, alias is Own again, the class WithInstance is left out for its instance
    assert [getattr(t, "__name__", None) for t in found] == ["Own", None]
    assert type(found[1]).__name__ == "WithInstance"
    module_tool = tmp_path / "module_tool.py"
    module_tool.write_text("def name(): return 'm'\ndef description(): return 'd'\n"
                           "def parameter_schema(): return {'type': 'object'}\ndef run(a, c): return 1\n")
    [module] = load_target(str(module_tool))
    assert tools_in_module(module) == [module]


# --------------------------------------------------------------------------- the command line


def test_cli_table_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    failing = tools_file(tmp_path, "failing.py", """
        class Good(_Base):
            @staticmethod
            def selftest():
                return Ok("all good")

        class Bad(_Base):
            @staticmethod
            def selftest():
                return Error("it is bad")

        class Quiet(_Base):
            pass
    """)
    assert main(["selftest", str(failing), "--timeout", "5"]) == 1
    out = capsys.readouterr().out
    for text in ("selftests", "tool", "outcome", "duration", "message", "good", "passed", "all good", "bad",
                 "failed", "it is bad", "quiet", "no selftest", "1 passed, 1 failed, 1 no selftest"):
        assert text in out, text

    passing = tools_file(tmp_path, "passing.py", """
        class Fine(_Base):
            @staticmethod
            def selftest():
                return None

        class Untested(_Base):
            pass
    """)
    assert main(["selftest", str(passing), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(r["tool"], r["outcome"]) for r in report["results"]] == [("fine", "passed"), ("untested", "no selftest")]
    assert report["exit_code"] == 0 and report["counts"]["passed"] == 1
    assert set(report["results"][0]) == {"tool", "outcome", "duration_ms", "message", "output"}


def test_cli_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "plugins"
    folder.mkdir()
    tools_file(folder, "one.py", "class One(_Base):\n    selftest = staticmethod(lambda: None)\n")
    tools_file(folder, "two.py", "class Two(_Base):\n    selftest = staticmethod(lambda: Ok())\n")
    tools_file(tmp_path, "by_name_mod.py", "class ByName(_Base):\n    selftest = staticmethod(lambda: None)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert main(["selftest", str(folder), "by_name_mod", "--json"]) == 0
    finally:
        import sys

        sys.modules.pop("by_name_mod", None)
    report = json.loads(capsys.readouterr().out)
    assert [(r["tool"], r["outcome"]) for r in report["results"]] == [
        ("one", "passed"), ("two", "passed"), ("byname", "passed"),
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["selftest", "no_such_module_xyz"], "cannot load no_such_module_xyz: cannot import it: ModuleNotFoundError"),
        (["selftest", "missing/file.py"], "cannot load missing/file.py: no such file"),
        (["selftest", "{tmp}/broken.py"], "broken.py: line 1: SyntaxError"),
        (["selftest", "{tmp}/empty.py"], "empty.py: no tools found in it"),
        (["selftest", "{tmp}/empty.py", "--timeout", "0"], "must be a positive number of seconds"),
        (["selftest"], "the following arguments are required: MODULE_OR_PATH"),
    ],
)
def test_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    (tmp_path / "broken.py").write_text("def (\n")
    (tmp_path / "empty.py").write_text("import os\nfrom rho_actors import Ok\n")
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    assert message in capsys.readouterr().err


def test_rows_are_plain_data() -> None:
    row = SelftestRow("t", "passed", 1.5, "ok")
    assert row.to_dict() == {"tool": "t", "outcome": "passed", "duration_ms": 1.5, "message": "ok", "output": ""}
    assert Ok is not Error  # type: ignore[comparison-overlap]  # the contract's two verdicts come from rho_actors.tool

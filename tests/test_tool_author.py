"""What a tool author needs, tried as a new user would: the host gets a raising tool's
traceback (the model does not), the context reaches a parameter by its type, a loop
offers the tools it is given, a forgotten ``if __name__ == "__main__":`` guard is named
with what to do, and messages about untrusted tools name the user's own file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

from rho_actors import ActorSystem, PluginFolder, ToolCall, ToolContext, UntrustedReads, tool
from rho_actors.agent.driver import prompt
from rho_actors.agent.model import Reply, ScriptedModel
from rho_actors.declarations.checks import describe_origin
from rho_actors.sandbox.confine.confinement import probe
from rho_actors.sandbox.confine.uids import DEFAULT_UID_RANGE
from rho_actors.tool import ErrorKind
from tests.conftest import WAIT_S, closed_to_others

ROOT = os.geteuid() == 0
READS = UntrustedReads(timeout_s=WAIT_S)  # a loaded machine: reads are slow, never left out


def _divide(a: int, b: int) -> float:
    return a / b


@tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return _divide(a, b)


@pytest.fixture
def errors() -> Iterator[list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    logger.enable("rho_actors")
    sink = logger.add(lambda m: seen.append((m.record["level"].name, m.record["message"])), level="DEBUG")
    try:
        yield seen
    finally:
        logger.remove(sink)
        logger.disable("rho_actors")


# --- a traceback for the host -----------------------------------------------------------------


@pytest.mark.parametrize("untrusted", [False, True])
def test_a_raising_tool_gives_the_host_its_traceback_and_the_model_one_line(
    tmp_path: Path, errors: list[tuple[str, str]], untrusted: bool
) -> None:
    if untrusted and ROOT and (closed := closed_to_others(Path(__file__))) is not None:
        pytest.skip(f"a confined worker (uid 65534) cannot read this test's source lines: {closed}")
    with ActorSystem(data_dir=tmp_path, shutdown_ms=2_000, warm_workers=1, untrusted=READS) as system:
        system.register(divide, untrusted=untrusted)
        loop = system.start_loop("tb")
        model = ScriptedModel([Reply(tool_calls=(ToolCall("c1", "divide", '{"a": 1, "b": 0}'),)), Reply("sorry")])
        result = prompt(loop, "divide", model=model)
    assert result.ok, result.error
    [call] = result.steps[0].results
    assert call.error_kind == ErrorKind.RAISED
    assert call.content == "tool 'divide' raised ZeroDivisionError: division by zero"
    trace = call.details["traceback"]
    assert trace.startswith("Traceback") and "ZeroDivisionError" in trace
    assert __file__ in trace and "_divide" in trace and "return a / b" in trace  # the tool's own frames
    assert "rho_actors/call.py" not in trace and "rho_actors/sandbox" not in trace  # not the runtime's
    sent = model.requests[1][0]  # what the model was sent: the one line, no traceback
    assert not any("Traceback" in m.text for m in sent)
    [(level, line)] = [(lv, m) for lv, m in errors if "Traceback" in m]
    assert level == "ERROR" and "divide" in line and "c1" in line and "return a / b" in line


def test_the_traceback_log_line_can_be_turned_off(tmp_path: Path, errors: list[tuple[str, str]]) -> None:
    with ActorSystem(data_dir=tmp_path, shutdown_ms=2_000, log_tracebacks=False) as system:
        system.register(divide)
        [result] = system.start_loop().run_turn([ToolCall("c1", "divide", '{"a": 1, "b": 0}')])
    assert "ZeroDivisionError" in result.details["traceback"]  # still in the host-only details
    assert not any("Traceback" in m for _, m in errors)


# --- the context by type ------------------------------------------------------------------------


@tool
def save(text: str, context: ToolContext) -> str:
    """Save a note in the session's folder."""
    (context.data_dir / "note.txt").write_text(text)
    return f"{context.session_id} {context.call_id} {context['call_id']} {type(context).__name__}"


@tool
def plain(text: str, ctx: Mapping[str, Any]) -> str:
    """The ctx parameter, as before."""
    return f"{text} {ctx['call_id']} {type(ctx).__name__}"


def test_the_context_reaches_a_parameter_annotated_tool_context(tmp_path: Path) -> None:
    assert save.parameter_schema()["properties"].keys() == {"text"}  # the model never fills it
    assert plain.parameter_schema()["properties"].keys() == {"text"}
    with ActorSystem(data_dir=tmp_path, shutdown_ms=2_000) as system:
        system.register(save)
        system.register(plain)
        loop = system.start_loop("ctx")
        first, second = loop.run_turn([ToolCall("c1", "save", '{"text": "hi"}'),
                                       ToolCall("c2", "plain", '{"text": "hi"}')])
    assert first.ok and first.content == "ctx c1 c1 ToolContext", first.content
    assert (loop.data_dir / "note.txt").read_text() == "hi"
    assert second.ok and second.content.startswith("hi c2 "), second.content


@pytest.mark.parametrize("source", [
    "def f(text: str, context: Mapping[str, Any]) -> str:\n    '''d'''\n    return text",
    "def f(text: str, context) -> str:\n    '''d'''\n    return text",
    "def f(text: str, run_context: dict) -> str:\n    '''d'''\n    return text",
])
def test_a_parameter_that_looks_like_a_context_but_is_not_typed_so_is_refused(source: str) -> None:
    scope: dict[str, Any] = {"Mapping": Mapping, "Any": Any}
    exec(source, scope)  # a user's function, defined as they would
    with pytest.raises(TypeError, match=r"looks like the call's context.*ToolContext"):
        tool(scope["f"])


def test_a_parameter_named_like_a_context_with_another_type_is_the_models() -> None:
    @tool
    def f(context_size: int) -> int:
        """Its argument is the model's."""
        return context_size

    assert f.parameter_schema()["required"] == ["context_size"]


# --- which tools a loop offers --------------------------------------------------------------------


@tool
def other(n: int = 0) -> int:
    """Another tool."""
    return n


def test_start_loop_tools_is_an_allowlist_by_name_or_by_source(tmp_path: Path) -> None:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "shout.py").write_text(textwrap.dedent('''
        from rho_actors import tool

        @tool
        def shout(text: str) -> str:
            """Shout the text."""
            return text.upper()
    '''))
    with ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000, warm_workers=1, untrusted=READS) as system:
        system.register(divide)
        system.register(other)
        handle = system.add_source(PluginFolder(folder), poll_s=None)
        by_name = system.start_loop("by-name", tools=["divide", other])
        by_source = system.start_loop("by-source", tools=[handle])
        everything = system.start_loop("all")
        assert sorted(i.name for i in by_name.offered()) == ["divide", "other"]
        assert [i.name for i in by_source.offered()] == ["shout"]
        assert sorted(i.name for i in everything.offered()) == ["divide", "other", "shout"]
        [refused] = by_source.run_turn([ToolCall("c1", "divide", '{"a": 1, "b": 1}')])
        [ran] = by_source.run_turn([ToolCall("c2", "shout", '{"text": "hi"}')])
        assert refused.error_kind == ErrorKind.WITHHELD and ran.ok and ran.content == "HI"
        with pytest.raises(TypeError, match="single string"):
            system.start_loop("lone", tools="divide")
        with pytest.raises(TypeError, match="got a int"):
            system.start_loop("odd", tools=[5])


# --- a forgotten __main__ guard, and the uid warning ------------------------------------------------

SCRIPT = '''
import threading
from rho_actors import ActorSystem, ToolCall, tool

@tool
def hello(name: str) -> str:
    """Say hello."""
    return f"hello {name}"

print("BODY RUNS", flush=True)
system = ActorSystem(start_timeout_ms=START_MS)
'''


def run_script(path: Path, body: str) -> subprocess.CompletedProcess[str]:
    # a call waits for a worker as long as the run may take: a loaded machine's first child can
    # need more than the default 10 s to import the script (the call then ends, and the system's
    # stop kills that child before it said why)
    path.write_text(SCRIPT.replace("START_MS", str(int(WAIT_S * 1000))) + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(path)], check=False, capture_output=True, text=True, timeout=2 * WAIT_S,
                          cwd=path.parent, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})


def test_an_unguarded_script_is_told_what_to_do_before_any_child_starts(tmp_path: Path) -> None:
    script = tmp_path / "my_agent.py"
    run = run_script(script, '''
        system.register(hello, isolation="process")
        system.stop()
    ''')
    assert run.returncode != 0
    assert "UnguardedStartError" in run.stderr and f"{script} line 13" in run.stderr
    assert 'if __name__ == "__main__":' in run.stderr
    assert run.stdout.count("BODY RUNS") == 1  # no child ran the body again


def test_a_child_that_imports_an_unguarded_script_stops_saying_why(tmp_path: Path) -> None:
    # registered from another thread, so the host cannot see the script's top level
    script = tmp_path / "my_agent.py"
    run = run_script(script, '''
        def use() -> None:
            system.register(hello, isolation="process")
            system.start_loop().run_turn([ToolCall("c1", "hello", '{"name": "x"}')])

        thread = threading.Thread(target=use)
        thread.start()
        thread.join()  # bounded by run_script's timeout: stopping while the call waits would kill the child
        system.stop()
    ''')
    assert f"rho_actors: {script} starts an ActorSystem at its top level" in run.stderr
    assert 'if __name__ == "__main__":' in run.stderr
    assert "BODY RUNS" in run.stdout


@tool
def whoami() -> int:
    """The uid it runs as."""
    return os.getuid()


@pytest.mark.skipif(not ROOT, reason="the uid drop needs root")
def test_untrusted_tools_run_as_a_uid_of_their_own_and_no_warning_says_they_cannot(
    tmp_path: Path, errors: list[tuple[str, str]]
) -> None:
    with ActorSystem(data_dir=tmp_path, shutdown_ms=2_000, warm_workers=1, untrusted=READS) as system:
        system.register(whoami, untrusted=True)
        [result] = system.start_loop().run_turn([ToolCall("c1", "whoami", "{}")])
        report = system.stats().get("confinement", {})
    assert result.ok and int(result.content) in DEFAULT_UID_RANGE, result.content
    assert probe().warning() is None
    assert not any("cannot run as uid" in m for _, m in errors)
    if "python_readable" in report:
        assert report["python_readable"]["available"] is True


def test_messages_about_an_untrusted_tool_name_the_users_file() -> None:
    origin = describe_origin(divide, trusted=False)
    assert origin.startswith(f"{__name__}.divide ({__file__}:") and "function_tool" not in origin

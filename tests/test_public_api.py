"""The public API: exactly these names are exported from ``rho_actors``, each one
importable and documented, and the runtime's own exceptions share one root."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import rho_actors

EXPORTED = [
    "Actor",
    "ActorExit",
    "ActorSystem",
    "ApprovalError",
    "ArgumentsError",
    "Audio",
    "CallEvent",
    "CallInfo",
    "CancelToken",
    "ChildInfo",
    "ChildSpec",
    "Concurrency",
    "DEFAULT_TIMEOUT_MS",
    "DIALECTS",
    "DeclarationError",
    "DeclarationEvent",
    "Deferred",
    "Details",
    "Dialect",
    "Down",
    "DuplicateToolError",
    "EncodedOutput",
    "EntryPointGroup",
    "Error",
    "ErrorKind",
    "FinalResult",
    "FunctionTool",
    "GovernorSettings",
    "ISOLATIONS",
    "Image",
    "IsolatedReadError",
    "Isolation",
    "IsolationEvent",
    "IsolationServices",
    "LoadError",
    "Loop",
    "Message",
    "Model",
    "ModelError",
    "Monitor",
    "NORMAL",
    "Names",
    "NotRunningError",
    "Ok",
    "PendingCall",
    "PluginFolder",
    "PluginLoadError",
    "ProgressEvent",
    "PromptEvent",
    "PromptResult",
    "Registration",
    "Reply",
    "Resource",
    "RestartIntensityExceeded",
    "RetryPolicy",
    "RhoError",
    "ScriptedModel",
    "SelftestRow",
    "Session",
    "SessionLeaseError",
    "Source",
    "SourceHandle",
    "StartChild",
    "Step",
    "StepEnded",
    "Supervisor",
    "SupervisorEvent",
    "TaskError",
    "TaskFinished",
    "TaskHostStopped",
    "TaskInfo",
    "TaskSettings",
    "Telemetry",
    "TextDelta",
    "ToolCall",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolContext",
    "ToolEntry",
    "ToolFailure",
    "ToolInfo",
    "ToolResult",
    "ToolSet",
    "ToolSetChanged",
    "TranscriptError",
    "UntrustedReads",
    "Usage",
    "WorkerPool",
    "aprompt",
    "astream",
    "check_declaration",
    "concurrency",
    "count_children",
    "declaration",
    "decode_arguments",
    "default_timeout_ms",
    "encode_output",
    "is_tool",
    "is_untrusted",
    "kill",
    "model_from_spec",
    "monitor",
    "prompt",
    "read_declaration",
    "run_selftests",
    "start_link",
    "stream",
    "timeout_ms",
    "to_dialect",
    "tool",
    "untrusted",
    "whereis",
    "which_children",
]

_ROOT = Path(__file__).resolve().parent.parent
DOCS = "\n".join(path.read_text() for path in [_ROOT / "README.md", *sorted((_ROOT / "docs").rglob("*.md"))])


def test_the_exported_names_are_pinned() -> None:
    assert sorted(rho_actors.__all__) == EXPORTED
    assert len(set(EXPORTED)) == len(EXPORTED)


@pytest.mark.parametrize("name", EXPORTED)
def test_each_name_is_importable_and_documented(name: str) -> None:
    value = getattr(rho_actors, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        assert value.__doc__ and value.__doc__.strip(), f"{name} has no docstring of its own"
    else:  # constants and type aliases: named in README.md or the site's pages
        assert f"`{name}`" in DOCS or f"{name} " in DOCS, f"{name} is documented nowhere"


@pytest.mark.parametrize(
    "name",
    ["ArgumentsError", "DeclarationError", "DuplicateToolError", "IsolatedReadError", "LoadError",
     "PluginLoadError", "ToolFailure", "TranscriptError"],
)
def test_the_runtime_exceptions_derive_from_rho_error(name: str) -> None:
    assert issubclass(getattr(rho_actors, name), rho_actors.RhoError)


def test_the_python_kinds_of_the_runtime_exceptions_stay() -> None:
    from rho_actors.files import UnsafePathError

    assert issubclass(UnsafePathError, rho_actors.RhoError) and issubclass(UnsafePathError, OSError)
    assert issubclass(rho_actors.ArgumentsError, ValueError)
    assert issubclass(rho_actors.DeclarationError, ValueError)


def test_a_rho_error_is_caught_as_one() -> None:
    with rho_actors.ActorSystem() as system, pytest.raises(rho_actors.RhoError) as err:
        system.register(rho_actors.tool(name="one", description="One.")(lambda: 1))
        system.register(rho_actors.tool(name="one", description="One.")(lambda: 2))
    assert isinstance(err.value, rho_actors.DuplicateToolError) and "already registered" in str(err.value)

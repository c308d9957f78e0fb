"""The harness that runs the frameworks' own tool-executor suites with rho's adapters
swapped in (tests/frameworks/run.py; the whole suites: ``make test-frameworks``) works:
a few of LangGraph's own ``ToolNode`` tests pass with ``RhoToolNode`` swapped in (and a
few of pydantic-ai's own tool tests with ``RhoToolset``), their calls run as rho turns,
and a test that fails is reported failed, with its message."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.frameworks.run import SUITES, Suite, run_suite

LANGGRAPH_TESTS = [
    f"tests/test_tool_node.py::{name}" for name in (
        "test_tool_node_inject_state",  # InjectedState
        "test_tool_node_strips_plain_injected_tool_arg",  # a value the model sends for an injected argument
        "test_tool_node_list_return_command_and_tool_message",  # a Command returned
        "test_tool_node_error_handling_default_exception",  # the error as ToolNode words it
    )
]


PYDANTIC_AI_TESTS = [
    "tests/test_tools.py::test_args_validator_with_deps",  # the run's deps through RunContext
    "tests/test_tools.py::test_args_validator_context_retry",  # ModelRetry from args_validator, ctx.retry
    "tests/test_tools.py::test_tool_timeout_retry_counts_as_failed",  # pydantic-ai's timeout is a retry
    "tests/test_tools.py::test_call_deferred_without_metadata",  # CallDeferred raised by the tool
    "tests/test_tools.py::test_single_base_model_arg_validator_accepts_wrapped_input",  # a model's fields
    "tests/test_tools.py::test_return_bytes_invalid",  # pydantic-ai's own serialization error
]


def test_langgraph_tests_pass_with_rho_swapped_in_and_run_through_rho() -> None:
    pytest.importorskip("langgraph")
    outcome = run_suite(SUITES["langgraph"], swapped=True, select=LANGGRAPH_TESTS, workers=0)
    assert outcome.failed == {}
    assert len(outcome.passed) >= len(LANGGRAPH_TESTS)  # inject_state is parametrized
    assert outcome.rho_turns >= len(LANGGRAPH_TESTS)


def test_pydantic_ai_tests_pass_with_rho_swapped_in_and_run_through_rho() -> None:
    pytest.importorskip("pydantic_ai")
    outcome = run_suite(SUITES["pydantic_ai"], swapped=True, select=PYDANTIC_AI_TESTS, workers=0)
    assert outcome.failed == {}
    assert len(outcome.passed) == len(PYDANTIC_AI_TESTS)
    assert outcome.rho_turns >= len(PYDANTIC_AI_TESTS)


def test_a_failing_test_is_reported_failed_with_its_message(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_two.py").write_text(
        "def test_kept():\n    assert 1 + 1 == 2\n\n"
        "def test_broken():\n    assert 'rho' == 'langgraph', 'the adapter answered otherwise'\n")
    outcome = run_suite(Suite(str(tmp_path), ("test_two.py",), "unused"), swapped=False, workers=0)
    assert outcome.passed == {"test_two::test_kept"}
    assert list(outcome.failed) == ["test_two::test_broken"]
    assert "the adapter answered otherwise" in outcome.failed["test_two::test_broken"]

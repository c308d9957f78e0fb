"""A finished background task's result reaching the model at its next step, in each
provider's accepted shape (DESIGN §4 "Background calls"): the real ``openai`` and
``anthropic`` SDK clients talking HTTP to the scripted wire server on 127.0.0.1, a real
ActorSystem, ``prompt(..., wait_for_tasks=True)``; and ``astream`` yielding
``TaskFinished``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, TaskFinished, ToolCall, tool
from rho_actors.agent.driver import prompt
from rho_actors.agent.model import Reply, ScriptedModel
from rho_actors.agent.providers import RetryPolicy
from rho_actors.agent.providers.anthropic import AnthropicModel
from rho_actors.agent.providers.openai import OpenAIModel
from tests.conftest import WAIT_S, wait_for
from tests.wire_server import (
    ANTHROPIC_PATH,
    OPENAI_PATH,
    Response,
    WireServer,
    anthropic_message,
    openai_completion,
    text_block,
    tool_use_block,
)

pytestmark = pytest.mark.timeout(120)

FAST = RetryPolicy(attempts=3, initial_s=0.01, max_wait_s=0.2, jitter_s=0.01, total_s=5.0)
release = threading.Event()


@tool(background=True, background_timeout_ms=60_000)
def crawl(site: str) -> str:
    """Crawl a site (until the test lets it finish, 30 s at most)."""
    release.wait(WAIT_S)
    return f"crawled {site}: 42 pages"


waiting_on: list[Any] = []  # the loop whose tasks finish_crawls waits for


@tool
def finish_crawls() -> str:
    """Let the open crawls finish and wait until they have."""
    release.set()
    [loop] = waiting_on
    for info in loop.tasks():
        loop.task_result(info.task_id, timeout_s=WAIT_S)
    return "the crawls are finished"


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Any]:
    release.clear()
    waiting_on.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        system.register(crawl)
        system.register(finish_crawls)
        yield system.start_loop("s1")
    finally:
        release.set()
        system.stop()


def _release_after(server: WireServer, path: str, requests: int) -> threading.Thread:
    """Let the task end once the model has been asked ``requests`` times (it has had its acknowledgement)."""
    def watch() -> None:
        if wait_for(lambda: len(server.bodies(path)) >= requests):
            release.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_openai_gets_the_result_as_a_user_message_after_its_final_reply(server: WireServer, loop: Any) -> None:
    server.script(OPENAI_PATH,
                  Response(200, openai_completion(None, [("c1", "crawl", '{"site": "example.com"}')])),
                  Response(200, openai_completion("The crawl is under way.")),
                  Response(200, openai_completion("It found 42 pages.")))
    watcher = _release_after(server, OPENAI_PATH, 2)
    with OpenAIModel("gpt-test", base_url=server.openai_url, api_key="dummy", retry=FAST, timeout_s=WAIT_S) as oai:
        result = prompt(loop, "Crawl example.com", model=oai, max_steps=5, wait_for_tasks=True)
    watcher.join(WAIT_S)
    assert result.error is None, result.error
    assert result.text == "It found 42 pages."
    [info] = loop.tasks()
    step3 = server.bodies(OPENAI_PATH)[2]["messages"]
    assert [m["role"] for m in step3] == ["user", "assistant", "tool", "assistant", "user"]
    assert step3[2]["tool_call_id"] == "c1" and info.task_id in step3[2]["content"]
    assert step3[4]["content"].startswith(f"Background task {info.task_id} (tool 'crawl', call c1) finished:")
    assert "crawled example.com: 42 pages" in step3[4]["content"]


def test_anthropic_gets_the_result_as_a_user_turn_after_its_final_reply(server: WireServer, loop: Any) -> None:
    server.script(ANTHROPIC_PATH,
                  Response(200, anthropic_message([tool_use_block("t1", "crawl", {"site": "example.com"})])),
                  Response(200, anthropic_message([text_block("The crawl is under way.")])),
                  Response(200, anthropic_message([text_block("It found 42 pages.")])))
    watcher = _release_after(server, ANTHROPIC_PATH, 2)
    with AnthropicModel("claude-test", base_url=server.anthropic_url, api_key="dummy", retry=FAST, timeout_s=WAIT_S,
                        max_tokens=512) as claude:
        result = prompt(loop, "Crawl example.com", model=claude, max_steps=5, wait_for_tasks=True)
    watcher.join(WAIT_S)
    assert result.error is None, result.error
    assert result.text == "It found 42 pages."
    [info] = loop.tasks()
    step3 = server.bodies(ANTHROPIC_PATH)[2]["messages"]
    assert [m["role"] for m in step3] == ["user", "assistant", "user", "assistant", "user"]
    assert step3[2]["content"][0]["type"] == "tool_result" and info.task_id in step3[2]["content"][0]["content"]
    delivered = step3[4]["content"]
    text = delivered if isinstance(delivered, str) else "".join(b["text"] for b in delivered if b["type"] == "text")
    assert text.startswith(f"Background task {info.task_id} (tool 'crawl', call t1) finished:")
    assert "crawled example.com: 42 pages" in text


def test_anthropic_gets_a_result_ready_by_the_next_step_in_that_steps_tool_results_message(
        server: WireServer, loop: Any) -> None:
    waiting_on.append(loop)
    server.script(ANTHROPIC_PATH,
                  Response(200, anthropic_message([tool_use_block("t1", "crawl", {"site": "a"})])),
                  Response(200, anthropic_message([tool_use_block("t2", "finish_crawls", {})])),
                  Response(200, anthropic_message([text_block("Done.")])))
    with AnthropicModel("claude-test", base_url=server.anthropic_url, api_key="dummy", retry=FAST, timeout_s=WAIT_S,
                        max_tokens=512) as claude:
        result = prompt(loop, "Crawl a", model=claude, max_steps=5)
    assert result.error is None and result.text == "Done.", result.error
    [info] = loop.tasks()
    step3 = server.bodies(ANTHROPIC_PATH)[2]["messages"]
    assert [m["role"] for m in step3] == ["user", "assistant", "user", "assistant", "user"]
    blocks = step3[4]["content"]  # ONE user message: the step's tool result, then the task's result
    assert [b["type"] for b in blocks] == ["tool_result", "text"]
    assert blocks[0]["tool_use_id"] == "t2" and blocks[0]["content"] == "the crawls are finished"
    assert blocks[1]["text"].startswith(f"Background task {info.task_id} (tool 'crawl', call t1) finished:")


def test_astream_yields_task_finished_and_the_model_gets_the_result(loop: Any) -> None:
    class ReleasingModel(ScriptedModel):  # the task ends once the model has had its acknowledgement
        def complete(self, messages: Any, tools: Any, **options: Any) -> Reply:
            reply = super().complete(messages, tools, **options)
            if len(self.requests) == 2:
                release.set()
            return reply

    model = ReleasingModel([Reply("", (ToolCall("c1", "crawl", '{"site": "a"}'),)), Reply("Under way."),
                            Reply("Done: 42 pages.")])

    async def run() -> list[Any]:
        return [event async for event in loop.astream("Crawl a", model=model, wait_for_tasks=True)]

    events = asyncio.run(run())
    [finished] = [e for e in events if isinstance(e, TaskFinished)]
    assert finished.task.result is not None and finished.task.result.content == "crawled a: 42 pages"
    assert "crawled a: 42 pages" in model.requests[2][0][-1].text

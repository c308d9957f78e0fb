"""Cancelling a prompt while its model request is in flight: the prompt stops at once
(it does not wait for the model), records the cancellation, never records the reply
that comes later, and the session's next prompt goes on from where it was."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from rho_actors import ActorSystem, CancelToken
from rho_actors.agent.driver import PromptResult, aprompt, prompt, stream
from rho_actors.agent.model import Message, Reply, ScriptedModel
from rho_actors.agent.transcript import TRANSCRIPT_NAME, read_records
from tests.conftest import WAIT_S


class Stuck:
    """A model whose request hangs (after streaming ``"par"`` when asked to stream)
    until :attr:`release` is set, then answers with a tool call."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.release = threading.Event()
        self.answered = threading.Event()

    def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]],
                 on_text: Callable[[str], None] | None = None, **options: Any) -> Reply:
        self.asked.set()
        if on_text is not None:
            on_text("par")
        self.release.wait(WAIT_S * 3)
        self.answered.set()
        return Reply("partial", ())


@pytest.fixture
def stuck() -> Iterator[Stuck]:
    model = Stuck()
    yield model
    model.release.set()


def records_of(loop: Any) -> list[dict[str, Any]]:
    return read_records(loop.data_dir / TRANSCRIPT_NAME)[0]


def then_the_session_goes_on(loop: Any, stuck: Stuck) -> None:
    stuck.release.set()
    assert stuck.answered.wait(WAIT_S)
    after = ScriptedModel([Reply("went on")])
    result = prompt(loop, "again", model=after)
    assert result.ok and result.text == "went on", result.error
    assert [(m.role, m.text) for m in after.requests[0][0]] == [("user", "go"), ("user", "again")]
    types = [(r["type"], r.get("kind")) for r in records_of(loop)]
    assert types == [("user", None), ("error", "cancelled"), ("user", None), ("reply", None)]


def test_a_cancel_token_stops_a_prompt_waiting_for_its_model(system: ActorSystem, stuck: Stuck) -> None:
    loop = system.start_loop("p")
    token = CancelToken()
    out: list[PromptResult] = []
    thread = threading.Thread(target=lambda: out.append(prompt(loop, "go", model=stuck, cancel=token)))
    thread.start()
    assert stuck.asked.wait(WAIT_S)
    token.cancel()
    thread.join(WAIT_S)  # the model still hangs: the prompt must not wait for it
    assert not thread.is_alive()
    assert out[0].error == "the host cancelled the prompt" and out[0].steps == ()
    then_the_session_goes_on(loop, stuck)


def test_cancelling_aprompt_while_the_model_answers(system: ActorSystem, stuck: Stuck) -> None:
    loop = system.start_loop("a")

    async def main() -> None:
        task = asyncio.create_task(aprompt(loop, "go", model=stuck))
        assert await asyncio.to_thread(stuck.asked.wait, WAIT_S)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=WAIT_S)
        assert done, "aprompt waited for the model after it was cancelled"
        with pytest.raises(asyncio.CancelledError):
            task.result()

    asyncio.run(main())
    then_the_session_goes_on(loop, stuck)


def test_closing_a_stream_mid_reply_stops_the_prompt(system: ActorSystem, stuck: Stuck) -> None:
    loop = system.start_loop("s")
    events: Any = stream(loop, "go", model=stuck)  # a generator: it has close()
    first = next(events)
    assert getattr(first, "text", None) == "par"
    closer = threading.Thread(target=events.close)
    closer.start()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    then_the_session_goes_on(loop, stuck)

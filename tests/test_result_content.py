"""A result's audio and embedded-resource content beside text and images (DESIGN §2,
§4 "Budgets", §6b "MCP"): the values and their checks, order kept for mixed content,
the model's text naming what a provider cannot take, the result budgets, the wire of
worker processes (trusted and untrusted), and ``rho-actors mcp serve`` as the official
SDK's client sees it, consumed again as an MCP source."""

from __future__ import annotations

import base64
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from rho_actors import ActorSystem, Audio, ErrorKind, Image, Reply, Resource, ToolCall, ToolResult, tool
from rho_actors.agent.driver import prompt
from rho_actors.agent.providers import RetryPolicy
from rho_actors.agent.providers.anthropic import AnthropicModel
from rho_actors.agent.providers.openai import OpenAIModel
from rho_actors.encoding import encode_output
from rho_actors.results import result_from_return
from rho_actors.sandbox import wire
from tests.conftest import READS, WAIT_S, wait_for
from tests.mcp_fixtures import served_tools
from tests.wire_server import (
    ANTHROPIC_PATH,
    OPENAI_PATH,
    Response,
    WireServer,
    anthropic_message,
    openai_completion,
    picture,
    text_block,
    tool_use_block,
)

MIB = 2**20
PNG = picture("PNG")
MIXED = (Image(PNG, "image/png"), "between", Audio(b"RIFF-wav", "audio/wav"),
         Resource("file:///notes.txt", "text/plain", text="the notes"),
         Resource("test://blob", "application/octet-stream", blob=b"\x00\xff"), "last")


def _result(value: Any, max_chars: int = 10_000) -> ToolResult:
    return result_from_return("c1", "t", value, max_chars, 0.0)


@pytest.mark.parametrize(("value", "max_chars"), [
    ("ok", 100), ("", 100), ("x" * 100, 100), ("x" * 101, 100), ("lone \ud800 surrogate", 100),
    ("paired \ud83d\ude00", 100), ("\ud800" * 5, 3), ("tab\tand\nnewline \x1b[2J", 100),
])
def test_a_text_return_is_the_result_the_dataclass_makes(value: str, max_chars: int) -> None:
    """A tool's ``str`` is its result's text as ``ToolResult`` itself makes it (scrubbed,
    capped), a frozen value like any other (equal, hashed, refusing assignment)."""
    got = result_from_return("c1", "t", value, max_chars, 1.5)
    made = ToolResult("c1", "t", True, encode_output(value, max_chars).text, duration_ms=1.5)
    assert got == made and hash(got) == hash(made) and repr(got) == repr(made)
    assert got.content.encode("utf-8").decode("utf-8") == got.content and len(got.content) <= max_chars + 80
    assert (got.images, got.blocks, got.details, got.error_kind, got.audio) == ((), (), None, None, ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.content = "changed"  # type: ignore[misc]


# --------------------------------------------------------------------------- the values


def test_audio_and_resource_values_check_what_they_are_given() -> None:
    assert Audio(bytearray(b"ab"), " Audio/MPEG ") == Audio(b"ab", "audio/mpeg")  # type: ignore[arg-type]
    assert Resource("test://x", "Text/Plain", text="t").mime_type == "text/plain"
    assert Resource("urn:isbn:1", blob=memoryview(b"b")).blob == b"b"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Audio mime_type 'image/png' is not an audio type; use audio/<subtype>"):
        Audio(b"x", "image/png")
    with pytest.raises(ValueError, match="'wav' is not a MIME type"):
        Audio(b"x", "wav")
    with pytest.raises(TypeError, match="Audio data must be bytes, got str"):
        Audio("x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Resource uri 'notes\.txt' is not an absolute URI"):
        Resource("notes.txt", text="x")
    with pytest.raises(ValueError, match="is not an absolute URI"):
        Resource("test://a b", text="x")
    with pytest.raises(ValueError, match="is not an absolute URI"):
        Resource("test://" + "a" * 8192, text="x")
    for text, blob in ((None, None), ("t", b"b")):
        with pytest.raises(ValueError, match="Resource 'test://x' needs exactly one of text and blob"):
            Resource("test://x", text=text, blob=blob)
    with pytest.raises(TypeError, match="Resource text must be a str, got bytes"):
        Resource("test://x", text=b"t")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"ToolResult blocks\[1\] is a int"):
        ToolResult("c", "t", True, "", blocks=("a", 3))  # type: ignore[arg-type]


def test_a_bad_value_made_in_a_tool_is_an_error_result_naming_it(tmp_path: Path) -> None:
    @tool
    def sound() -> Audio:
        """A sound of the wrong type."""
        return Audio(b"x", "video/mp4")

    with ActorSystem(data_dir=tmp_path) as system:
        system.register(sound)
        [result] = system.start_loop("s").run_turn([ToolCall("c1", "sound", "{}")], timeout_s=WAIT_S)
    assert result.error_kind is ErrorKind.RAISED
    assert "ValueError: Audio mime_type 'video/mp4' is not an audio type" in result.content


def test_mixed_content_keeps_its_order_and_the_model_text_names_what_it_cannot_see() -> None:
    for value in (MIXED, list(MIXED)):
        result = _result(value)
        assert result.ok and result.blocks == MIXED
        assert result.images == (MIXED[0],) and result.audio == (MIXED[2],) and result.resources == MIXED[3:5]
        assert result.content.splitlines() == [
            "between", "[audio: audio/wav, 8 bytes, not shown to the model]",
            "[resource file:///notes.txt (text/plain, text):]", "the notes",
            "[resource test://blob (application/octet-stream, 2 bytes), not shown to the model]", "last"]
    alone = _result(Resource("test://x", text="only"))
    assert alone.blocks == (Resource("test://x", text="only"),) and alone.content == "[resource test://x (text):]\nonly"
    assert _result("text only").blocks == ()
    error = result_from_return("c1", "t", __import__("rho_actors").Error(["failed:", Audio(b"a")]), 100, 0.0)
    assert error.error_kind is ErrorKind.TOOL_ERROR and error.audio == (Audio(b"a"),)
    # over the output cap: the text parts give way to one capped text at the first one's place
    capped = _result(["x" * 500, Audio(b"a"), "y" * 500], max_chars=200)
    text, sound = capped.blocks
    assert isinstance(text, str) and isinstance(sound, Audio) and "x" * 50 in text
    assert len(text) < 400 and "[audio" not in text and "1,001 characters in all" in text
    assert capped.content.startswith(text[:100]) and len(capped.content) < 400
    assert "1,053 characters in all" in capped.content  # one notice: the model's whole text
    long_resource = _result(["short", Resource("test://r", text="z" * 1000)], max_chars=200)
    assert long_resource.blocks[0] == "short" and long_resource.resources[0].text == "z" * 1000  # kept whole
    assert len(long_resource.content) < 400  # the model's text is capped


# --------------------------------------------------------------------------- budgets and the wire


@tool
def heavy(kind: str, mib: float) -> Any:
    """Return a sound or a resource blob of ``mib`` MiB."""
    data = bytes(int(mib * MIB))
    return ["heavy", Audio(data) if kind == "audio" else Resource("test://big", blob=data)]


def test_sounds_and_resources_are_charged_to_the_result_budgets(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, max_turn_result_bytes=3 * MIB) as system:
        system.register(heavy)
        loop = system.start_loop("s")
        for kind in ("audio", "resource"):
            results = loop.run_turn([ToolCall(f"{kind}1", "heavy", {"kind": kind, "mib": 1}),
                                     ToolCall(f"{kind}2", "heavy", {"kind": kind, "mib": 2.5})], timeout_s=WAIT_S)
            # 1 + 2.5 MiB is over the 3 MiB turn budget: whichever settles second is refused
            [kept] = [r for r in results if r.ok]
            [refused] = [r for r in results if not r.ok]
            assert len(kept.blocks) == 2
            assert refused.error_kind is ErrorKind.OUTPUT_LIMIT and refused.blocks == () and refused.images == ()
            assert "over this turn's result budget of 3145728 bytes" in refused.content


def test_the_plain_wire_carries_blocks_and_refuses_bad_ones() -> None:
    codec = wire.PlainCodec()
    result = _result(MIXED)
    back = codec.decode(codec.encode(result))
    assert back.blocks == MIXED and back.content == result.content and back.images == (MIXED[0],)
    with pytest.raises(wire.WireError, match=r"blocks\[0\]: 20,971,521 bytes of data, more than the limit"):
        codec.encode(_result(Audio(bytes(wire.MAX_MEDIA_BYTES + 1))))

    def body(blocks: list[Any]) -> bytes:
        return wire._pack({"ok": True, "content": "", "error_kind": None, "details": None, "images": [],
                           "blocks": blocks})

    refused: dict[str, list[Any]] = {
        r"result.blocks\[0\]: Audio mime_type 'image/png' is not an audio type": [["audio", b"x", "image/png"]],
        r"result.blocks\[0\]: Resource uri 'no scheme' is not an absolute URI": [["resource", "no scheme", None,
                                                                                 "t", None]],
        r"result.blocks\[0\]: Resource 'a:b' needs exactly one": [["resource", "a:b", None, "t", b"b"]],
        r"result.blocks\[0\] is not a text, image, audio or resource block": [["video", b"x", "video/mp4"]],
        r"result.blocks\[0\] data is not bytes of at most": [["audio", bytes(wire.MAX_MEDIA_BYTES + 1), "audio/wav"]],
        r"65 exceeds max_array_len\(64\)": [["text", "x"]] * 65,
    }
    for message, blocks in refused.items():
        with pytest.raises(wire.WireError, match=message):
            codec.decode(body(blocks))


@tool
def mixed() -> tuple[Any, ...]:
    """Return text, a picture, a sound and embedded resources."""
    return MIXED


@tool
def mixed_untrusted() -> list[Any]:
    """Return text, a picture, a sound and embedded resources, from an untrusted worker."""
    return list(MIXED)


def test_mixed_content_survives_worker_processes_trusted_and_untrusted(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, untrusted=READS) as system:
        system.register(mixed, isolation="process")
        system.register(mixed_untrusted, untrusted=True)
        loop = system.start_loop("s")
        results = loop.run_turn([ToolCall("c1", "mixed", "{}"), ToolCall("c2", "mixed_untrusted", "{}")],
                                timeout_s=WAIT_S * 3)
    for result in results:
        assert result.ok, result.content
        assert result.blocks == MIXED and result.content == _result(MIXED).content


# --------------------------------------------------------------------------- model providers

FAST = RetryPolicy(attempts=1, total_s=20.0)


def test_providers_get_the_pictures_and_a_line_naming_each_sound_and_resource(server: WireServer,
                                                                               tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path) as system:
        system.register(mixed)
        server.script(ANTHROPIC_PATH, Response(200, anthropic_message([tool_use_block("t1", "mixed", {})])),
                      Response(200, anthropic_message([text_block("heard")])))
        server.script(OPENAI_PATH, Response(200, openai_completion(None, [("o1", "mixed", "{}")])),
                      Response(200, openai_completion("heard")))
        with AnthropicModel("claude-test", base_url=server.anthropic_url, api_key="k", retry=FAST,
                            timeout_s=WAIT_S) as claude:
            assert prompt(system.start_loop("a"), "listen", model=claude).text == "heard"
        with OpenAIModel("gpt-test", base_url=server.openai_url, api_key="k", retry=FAST, timeout_s=WAIT_S) as gpt:
            assert prompt(system.start_loop("o"), "listen", model=gpt).text == "heard"
    expected = _result(MIXED).content
    [result] = [b for m in server.bodies(ANTHROPIC_PATH)[1]["messages"] if isinstance(m["content"], list)
                for b in m["content"] if b.get("type") == "tool_result"]
    assert [p["type"] for p in result["content"]] == ["text", "image"]
    assert result["content"][0]["text"] == expected and "audio/wav" not in str(result["content"][1])
    messages = server.bodies(OPENAI_PATH)[1]["messages"]
    [tool_message] = [m for m in messages if m["role"] == "tool"]
    assert tool_message["content"].startswith(expected)
    assert "input_audio" not in str(messages) and "data:image/png;base64," in str(messages)


def test_a_transcript_keeps_what_the_model_saw_of_mixed_content(tmp_path: Path) -> None:
    from rho_actors.agent.transcript import Transcript, load

    path = tmp_path / "transcript.jsonl"
    with Transcript(path) as transcript:
        transcript.user(1, "listen")
        transcript.reply(1, Reply("", (ToolCall("c1", "mixed", "{}"),)))
        transcript.result(1, 0, _result(MIXED))
    [_, _, message] = load(path).messages
    assert message.text == _result(MIXED).content and "[audio: audio/wav, 8 bytes" in message.text
    assert message.images == (MIXED[0],)


# --------------------------------------------------------------------------- MCP


def test_mcp_serve_serves_each_block_in_order_to_the_sdk_client(tmp_path: Path) -> None:
    import mcp_types as types

    from tests.test_mcp_serve import stdio_session

    async def main() -> types.CallToolResult:
        async with stdio_session(tmp_path) as session:
            with anyio.fail_after(WAIT_S):
                return await session.call_tool("media", {})

    served = anyio.run(main)
    assert not served.is_error
    image, between, audio, notes, blob, last = served.content
    assert isinstance(image, types.ImageContent) and base64.b64decode(image.data) == served_tools.PNG
    assert isinstance(between, types.TextContent) and between.text == "between"
    assert isinstance(audio, types.AudioContent) and audio.mime_type == "audio/wav"
    assert base64.b64decode(audio.data) == served_tools.WAV
    assert isinstance(notes, types.EmbeddedResource) and isinstance(notes.resource, types.TextResourceContents)
    assert (notes.resource.uri, notes.resource.mime_type, notes.resource.text) == (
        "file:///notes.txt", "text/plain", "the notes")
    assert isinstance(blob, types.EmbeddedResource) and isinstance(blob.resource, types.BlobResourceContents)
    assert base64.b64decode(blob.resource.blob) == b"\x00\xffbytes"
    assert isinstance(last, types.TextContent) and last.text == "last"


def test_an_mcp_source_keeps_an_upstreams_audio_and_resources(tmp_path: Path) -> None:
    from rho_actors.mcp import MCPServer

    command = [sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--tools", served_tools.__file__,
               "--data-dir", str(tmp_path / "upstream")]
    with ActorSystem(data_dir=tmp_path / "data") as system:
        system.add_source(MCPServer(command=command, name="upstream", env={"PYTHONPATH": os.getcwd()},
                                    connect_timeout_s=WAIT_S), poll_s=None)
        assert wait_for(lambda: "media" in {info.name for info in system.tools()}, WAIT_S * 3)
        [result] = system.start_loop("s").run_turn([ToolCall("c1", "media", "{}")], timeout_s=WAIT_S * 2)
    assert result.ok, result.content
    assert result.blocks == served_tools.MEDIA  # so a gateway serves them on as they came


@pytest.mark.parametrize("lists", [0, 1, 7, 14])
def test_a_plain_reply_s_lists_and_maps_are_counted_against_their_bound_at_any_size(lists: int) -> None:
    # a body no longer than the bound is unpacked without the count (each list or map
    # takes a byte at least); one list more than the bound is refused either way
    import msgpack

    from rho_actors.sandbox import wire

    body = msgpack.packb([[] for _ in range(lists)])  # lists + 1 lists in lists + 1 bytes
    assert len(body) == lists + 1
    assert wire._unpack(body, max_len=64, max_containers=lists + 1) == [[]] * lists
    with pytest.raises(wire.WireError, match="too many nested lists and maps"):
        wire._unpack(body, max_len=64, max_containers=lists)
    with pytest.raises(wire.WireError, match="too many nested lists and maps"):
        wire._unpack(msgpack.packb({"a": [[]] * lists}), max_len=64, max_containers=lists + 1)

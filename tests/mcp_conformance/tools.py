"""The tools the official MCP conformance suite (``@modelcontextprotocol/conformance``)
calls, as rho tools, served by ``rho-actors mcp serve --http`` in
``tests/test_mcp_conformance.py`` (the way each SDK's conformance server implements
them: ``examples/servers/typescript/everything-server.ts`` of the suite).

Not here: the suite's resources, prompts and completion scenarios (a rho server
serves tools only).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import mcp_types as types

from rho_actors import Audio, Image, Resource, tool
from rho_actors.mcp import client_of

PNG = base64.b64decode(  # 1x1, red: the suite's own test image
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")

WAV = (  # a minimal RIFF/WAVE file: 8 kHz, mono, 8-bit, four samples of silence
    b"RIFF" + (36 + 4).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (8000).to_bytes(4, "little")
    + (8000).to_bytes(4, "little") + (1).to_bytes(2, "little") + (8).to_bytes(2, "little")
    + b"data" + (4).to_bytes(4, "little") + bytes([128] * 4))


def _client(ctx: Any) -> Any:
    client = client_of(ctx)
    if client is None:
        raise RuntimeError("this tool must be called over MCP")
    return client


@tool
def test_simple_text() -> str:
    """Tests simple text content response."""
    return "This is a simple text response for testing."


@tool
def test_image_content() -> Image:
    """Tests image content response."""
    return Image(PNG, "image/png")


@tool
def test_audio_content() -> Audio:
    """Tests audio content response."""
    return Audio(WAV, "audio/wav")


@tool
def test_embedded_resource() -> Resource:
    """Tests embedded resource content response."""
    return Resource("test://embedded-resource", "text/plain", text="This is an embedded resource content.")


@tool
def test_multiple_content_types() -> list[str | Image | Resource]:
    """Tests response with multiple content types (text, image, resource)."""
    return ["Multiple content types test:", Image(PNG, "image/png"),
            Resource("test://mixed-content-resource", "application/json", text='{"test":"data","value":123}')]


@tool
def test_error_handling() -> str:
    """Tests error response handling."""
    raise RuntimeError("This tool intentionally returns an error for testing")


@tool
def test_tool_with_logging(ctx: Any) -> str:
    """Tests tool that emits log messages during execution."""
    client = _client(ctx)
    for i, text in enumerate(("Tool execution started", "Tool processing data", "Tool execution completed")):
        if i:
            time.sleep(0.05)
        client.log("info", text)
    return "Tool with logging executed successfully"


@tool
def test_tool_with_progress(ctx: Any) -> str:
    """Tests tool that reports progress notifications."""
    for i, done in enumerate((0, 50, 100)):
        if i:
            time.sleep(0.05)
        ctx["progress"](done, 100, f"Completed step {done} of 100")
    return "progress reported"


@tool
def test_reconnection(ctx: Any) -> str:
    """Tests SSE stream disconnection and client reconnection (SEP-1699): the server
    closes the stream mid-call and sends the result after the client reconnects."""
    _client(ctx).close_stream()
    time.sleep(0.1)
    return ("Reconnection test completed successfully. If you received this, the client properly "
            "reconnected after stream closure.")


@tool
def test_sampling(prompt: str, ctx: Any) -> str:
    """Tests server-initiated sampling (LLM completion request)."""
    return f"LLM response: {_client(ctx).sample(prompt, max_tokens=100)}"


@tool
def test_elicitation(message: str, ctx: Any) -> str:
    """Tests server-initiated elicitation (user input request)."""
    action, content = _client(ctx).elicit(message, {
        "type": "object",
        "properties": {"username": {"type": "string", "description": "User's response"},
                       "email": {"type": "string", "description": "User's email address"}},
        "required": ["username", "email"],
    })
    return f"User response: action={action}, content={content}"


@tool
def test_elicitation_sep1034_defaults(ctx: Any) -> str:
    """Tests elicitation with default values per SEP-1034."""
    action, content = _client(ctx).elicit("Please review and update the form fields with defaults", {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"],
                       "default": "active"},
            "verified": {"type": "boolean", "description": "Verification status", "default": True},
        },
        "required": [],
    })
    return f"Elicitation completed: action={action}, content={content}"


@tool
def test_elicitation_sep1330_enums(ctx: Any) -> str:
    """Tests elicitation with enum schema improvements per SEP-1330."""
    options = ["option1", "option2", "option3"]
    action, content = _client(ctx).elicit("Please select options from the enum fields", {
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "description": "Select one option", "enum": options},
            "titledSingle": {"type": "string", "description": "Select one option with titles", "oneOf": [
                {"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"}]},
            "legacyEnum": {"type": "string", "description": "Select one option (legacy)",
                           "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"]},
            "untitledMulti": {"type": "array", "description": "Select multiple options", "minItems": 1,
                              "maxItems": 3, "items": {"type": "string", "enum": options}},
            "titledMulti": {"type": "array", "description": "Select multiple options with titles", "minItems": 1,
                            "maxItems": 3, "items": {"anyOf": [
                                {"const": "value1", "title": "First Choice"},
                                {"const": "value2", "title": "Second Choice"},
                                {"const": "value3", "title": "Third Choice"}]}},
        },
        "required": [],
    })
    return f"Elicitation completed: action={action}, content={content}"


class JsonSchema202012Tool:
    """A tool whose schema uses JSON Schema 2020-12's ``$schema``, ``$defs`` (with an
    ``$anchor``), ``additionalProperties``, composition (``allOf``/``anyOf``) and
    conditional (``if``/``then``/``else``) keywords: SEP-1613 and SEP-2106 say they reach
    the client as declared."""

    @staticmethod
    def name() -> str:
        return "json_schema_2020_12_tool"

    @staticmethod
    def description() -> str:
        return "Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613, SEP-2106)"

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {"address": {"$anchor": "addressDef", "type": "object",
                                  "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
            "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"},
                           "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                           "phone": {"type": "string"}, "email": {"type": "string"}},
            "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
            "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
            "then": {"required": ["phone"]},
            "else": {"required": ["email"]},
            "additionalProperties": False,
        }

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        return f"JSON Schema 2020-12 tool called with: {args}"


# --- protocol 2026-07-28 -------------------------------------------------------------


@tool
def test_missing_capability(ctx: Any) -> str:
    """Asks the client's model, whatever the client declared (a 2026-07-28 client that did
    not declare sampling gets MissingRequiredClientCapabilityError)."""
    return str(_client(ctx).sample("Say hello", max_tokens=10))


@tool
def test_input_required_result_elicitation(ctx: Any) -> str:
    """Asks the user's name (SEP-2322: an input_required result on 2026-07-28)."""
    _, content = _client(ctx).elicit("What is your name?", {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, key="user_name")
    return f"Hello, {content.get('name', '')}!"


@tool
def test_input_required_result_sampling(ctx: Any) -> str:
    """Asks the client's model a question."""
    return str(_client(ctx).sample("What is the capital of France?", max_tokens=100, key="capital_question"))


@tool
def test_input_required_result_list_roots(ctx: Any) -> str:
    """Asks the client's roots."""
    roots = _client(ctx).list_roots(key="client_roots")
    return "Roots: " + ", ".join(root["uri"] for root in roots)


@tool
def test_input_required_result_request_state(ctx: Any) -> str:
    """Asks for a confirmation; the answer comes back with the sealed requestState."""
    _, content = _client(ctx).elicit("Please confirm", {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}, key="confirm")
    return f"state-ok: confirmed={content.get('ok')}"


@tool
def test_input_required_result_multiple_inputs(ctx: Any) -> str:
    """Asks three questions at once: the user, the model and the roots."""
    answers = _client(ctx).ask({
        "user_name": types.ElicitRequest(params=types.ElicitRequestFormParams(
            message="What is your name?", requested_schema={
                "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})),
        "greeting": types.CreateMessageRequest(params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text",
                                                                                   text="Generate a greeting"))],
            max_tokens=50)),
        "client_roots": types.ListRootsRequest(),
    })
    return f"All inputs received: {sorted(answers)}"


@tool
def test_input_required_result_multi_round(ctx: Any) -> str:
    """Asks two questions, one per round; the first answer rides the requestState."""
    client = _client(ctx)
    _, name = client.elicit("Step 1: What is your name?", {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, key="step1")
    _, color = client.elicit("Step 2: What is your favorite color?", {
        "type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}, key="step2")
    return f"{name.get('name')} likes {color.get('color')}"


@tool
def test_input_required_result_tampered_state(ctx: Any) -> str:
    """Asks a question; a tampered requestState on the retry is refused by the server."""
    _client(ctx).elicit("Please confirm", {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}, key="confirm")
    return "confirmed"


@tool
def test_input_required_result_capabilities(ctx: Any) -> str:
    """Asks only what the client declared it can answer."""
    client = _client(ctx)
    requests: dict[str, Any] = {}
    if client.supports("sampling"):
        requests["model"] = types.CreateMessageRequest(params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text="Hi"))],
            max_tokens=10))
    if client.supports("elicitation"):
        requests["user"] = types.ElicitRequest(params=types.ElicitRequestFormParams(
            message="Hi?", requested_schema={"type": "object", "properties": {"x": {"type": "string"}}}))
    answers = client.ask(requests) if requests else {}
    return f"asked: {sorted(answers)}"


class CustomHeadersTool:
    """A tool whose ``region`` argument a 2026-07-28 client mirrors in the
    ``Mcp-Param-Region`` header (SEP-2243: ``x-mcp-header``), which the server checks
    against the body before the call runs."""

    @staticmethod
    def name() -> str:
        return "test_custom_headers"

    @staticmethod
    def description() -> str:
        return "Mirrors its region argument in the Mcp-Param-Region header (SEP-2243)"

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object",
                "properties": {"region": {"type": "string", "x-mcp-header": "Region"}, "query": {"type": "string"}},
                "required": ["region", "query"]}

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        return f"region={args['region']} query={args['query']}"


# --- the tasks extension (SEP-2663): background calls served as MCP tasks ------------


@tool
def greet(name: str) -> str:
    """Greets someone (a sync-only tool: never a task)."""
    return f"Hello, {name}!"


@tool(background="optional", background_timeout_ms=120_000)
def slow_compute(seconds: float, ctx: Any, label: str = "") -> str:
    """Sleeps `seconds` then answers; a task when the client declared the tasks extension."""
    if ctx["cancel"].wait(seconds):
        return "cancelled"
    return f"computed {label} after {seconds} s"


@tool(background=True)
def failing_job(ctx: Any) -> str:
    """Fails after about a second (a tool error: the task completes with isError)."""
    ctx["cancel"].wait(1.0)
    raise RuntimeError("failing_job failed, as it always does")


@tool(background=True)
def protocol_error_job() -> str:
    """Exits its worker (a protocol-level failure: the task is failed with an error)."""
    raise SystemExit(3)


@tool(background=True)
def confirm_delete(filename: str, ctx: Any) -> str:
    """Asks the user to confirm, then deletes (pretends to)."""
    action, content = _client(ctx).elicit(f"Delete {filename}?", {
        "type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]})
    return f"deleted {filename}" if action == "accept" and content.get("confirm") else f"kept {filename}"


@tool(background=True)
def multi_input(ctx: Any) -> str:
    """Asks two questions at once."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "confirm": {"type": "boolean"}}}
    answers = _client(ctx).ask({key: types.ElicitRequest(params=types.ElicitRequestFormParams(
        message=f"Question {key}", requested_schema=schema)) for key in ("first", "second")})
    return "answered: " + ", ".join(f"{key}={answer.content}" for key, answer in sorted(answers.items()))


class ToolWithTask:
    """A task-only tool that needs the user's name before it starts: asked through an
    input_required result (SEP-2322), the task created on the round that answers it."""

    @staticmethod
    def name() -> str:
        return "test_tool_with_task"

    @staticmethod
    def description() -> str:
        return "Asks the user's name, then greets them as a task"

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {}}

    @staticmethod
    def background() -> bool:
        return True

    @staticmethod
    def input_requests(args: dict[str, Any]) -> dict[str, Any]:
        return {"user_name": types.ElicitRequest(params=types.ElicitRequestFormParams(
            message="What is your name?", requested_schema={
                "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}))}

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        _, content = _client(ctx).elicit("What is your name?", {
            "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, key="user_name")
        return f"Hello, {content.get('name', '')}!"

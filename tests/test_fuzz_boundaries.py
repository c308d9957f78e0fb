"""The faults of the third fuzzing round (one test per kind, with the minimal inputs and
siblings): bounded validation, exact ``multipleOf``, ``false`` subschemas named,
ECMA-262 pattern classes, strict text at the terminal, the observer stream, MCP stdio
lines and every text a child sends."""

from __future__ import annotations

import io
import json
import math
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack
import pytest
from rich.console import Console

from rho_actors import ActorSystem, ErrorKind, Image, ToolCall
from rho_actors.declarations.arguments import make_validator, violations
from rho_actors.declarations.checks import check_declaration
from rho_actors.observe.observer import json_line
from rho_actors.observe.top import TopView
from rho_actors.sandbox import wire
from rho_actors.sandbox.pool import WorkerPool
from rho_actors.selftest import SelftestRow, render_rows
from tests.conftest import WAIT_S, slack

from .helpers import make_tool

pytestmark = pytest.mark.timeout(120)



def checked(schema: dict[str, Any]) -> Any:
    return make_validator(check_declaration({"name": "t", "description": "d", "parameter_schema": schema})
                          .parameter_schema)


def strict_loads(text: str | bytes) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not RFC 8259 JSON")

    return json.loads(text, parse_constant=refuse)


# --- 1. validation bounded ------------------------------------------------------------------


def test_unevaluated_properties_is_linear_in_the_keys() -> None:
    schema = {"type": "object", "properties": {f"k{i}": {} for i in range(10)}, "unevaluatedProperties": False}
    keys = {f"k{i}": i for i in range(30_000)}
    started = time.perf_counter()
    found = violations(checked(schema), keys)
    assert time.perf_counter() - started < slack(2.0)  # a list membership per key took 6.8 s
    assert found[0].startswith('$: unexpected properties: "k10", "k100"')
    assert violations(checked(schema), {"k1": 1}) == []


@pytest.mark.parametrize("schema", [
    {"type": "object", "patternProperties": {"^a": {}}},
    {"type": "object", "patternProperties": {"^a": {}}, "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"x": {}}, "additionalProperties": False},
    {"type": "object", "unevaluatedProperties": {"type": "integer"}},
    {"type": "object", "allOf": [{"patternProperties": {"^k": {}}}], "unevaluatedProperties": False},
])
def test_every_key_and_pattern_counts_against_the_budget(monkeypatch: pytest.MonkeyPatch,
                                                         schema: dict[str, Any]) -> None:
    monkeypatch.setattr("rho_actors.declarations.arguments.MAX_KEYWORD_CHECKS", 1_000)
    found = violations(checked(schema), {f"k{i}": i for i in range(2_000)})  # a handful of keywords
    assert found == ["$: validation stopped after 1,000 schema checks; send smaller arguments"]
    assert violations(checked(schema), {}) == []


def test_validation_is_bounded_in_time() -> None:
    schema = {"type": "object", "patternProperties": {f"^p{i}": {} for i in range(50)},
              "additionalProperties": {"type": "integer"}}
    validator = checked(schema)
    started = time.monotonic()
    found = violations(validator, {f"k{i}": i for i in range(30_000)}, 0.05)
    assert found == ["$: validation stopped after 0.05 s; send smaller arguments"]
    assert time.monotonic() - started < 0.05 + slack(0.95)


def test_validation_never_holds_the_loop_past_the_calls_deadline(tmp_path: Path) -> None:
    """A 300 KB argument object for a tool with a 1 s timeout: run_turn raised
    TimeoutError after 11 s; now the call is refused within its own deadline."""
    ran: list[Any] = []
    schema = {"type": "object", "patternProperties": {f"^p{i}": {} for i in range(50)},
              "additionalProperties": {"type": "integer"}}
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        deadline_s = slack(1.0)  # a quiet machine's 1 s, as this machine keeps up now
        system.register(make_tool("counts", lambda args, ctx: ran.append(args), schema=schema,
                                  timeout_ms=int(deadline_s * 1000)))
        loop = system.start_loop("bounded")
        arguments = json.dumps({f"key_{i:06}": i for i in range(30_000)})
        assert len(arguments) > 300_000
        started = time.monotonic()
        [result] = loop.run_turn([ToolCall("c1", "counts", arguments)], timeout_s=WAIT_S)
        elapsed = time.monotonic() - started
        [after] = loop.run_turn([ToolCall("c2", "counts", '{"a": 1}')], timeout_s=WAIT_S)
    finally:
        system.stop()
    assert result.error_kind is ErrorKind.INVALID_ARGUMENTS
    assert "validation stopped after" in result.content
    assert elapsed < deadline_s + slack(2.0)  # its deadline
    assert after.ok and ran == [{"a": 1}]


# --- issue 23.1: multipleOf on the numbers as written ------------------------------------------


@pytest.mark.parametrize("value", [4.02, 0.07, 19.99, 606.67, 1070468.14, 0.0, -0.03, 12, 10**30])
def test_decimal_multiples_are_accepted(value: float) -> None:
    schema = {"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.01}}}
    assert violations(checked(schema), {"price": value}) == []


@pytest.mark.parametrize(("divisor", "value"), [(0.01, 4.025), (0.01, 0.001), (0.1, 0.35), (3, 10), (0.5, 1.25),
                                                (1e-300, 1.5e-300), (0.01, 1e-320)])
def test_non_multiples_are_still_refused(divisor: float, value: float) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": divisor}}}
    assert violations(checked(schema), {"n": value}) == [f"$.n: {json.dumps(value)} fails multipleOf "
                                                         f"{json.dumps(divisor)}"]


def test_multiple_of_through_the_loop(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"amount": {"type": "number", "multipleOf": 0.01}},
              "required": ["amount"]}
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        system.register(make_tool("pay", lambda args, ctx: f"paid {args['amount']}", schema=schema))
        results = system.start_loop("money").run_turn(
            [ToolCall(f"c{i}", "pay", f'{{"amount": {text}}}') for i, text in enumerate(["19.99", "606.67", "0.005"])]
        )
    finally:
        system.stop()
    assert [r.content for r in results[:2]] == ["paid 19.99", "paid 606.67"]
    assert results[2].error_kind is ErrorKind.INVALID_ARGUMENTS and "multipleOf 0.01" in results[2].content


# --- 8. a false subschema names its path --------------------------------------------------------


@pytest.mark.parametrize(("schema", "instance", "expected"), [
    ({"properties": {"legacy": False}}, {"legacy": 1}, ['$.legacy: property "legacy" is not allowed here']),
    ({"properties": {"a": {"type": "array", "items": False}}}, {"a": [1]}, ["$.a[0]: item 0 is not allowed here"]),
    ({"properties": {"a": {"type": "array", "prefixItems": [{}, False]}}}, {"a": [1, 2]},
     ["$.a[1]: item 1 is not allowed here"]),
    ({"properties": {"a": {"prefixItems": [{}], "items": False}}}, {"a": [1, 2]},
     ["$.a[1]: item 1 is not allowed here"]),
    ({"additionalProperties": False}, {"x": 1}, ['$: unexpected properties: "x"']),
    ({"unevaluatedProperties": False}, {"x": 1}, ['$: unexpected properties: "x"']),
    ({"patternProperties": {"^x": False}}, {"x": 1}, ['$.x: property "x" is not allowed here']),
    ({"properties": {"a": {"properties": {"b": {"anyOf": [False]}}}}}, {"a": {"b": 1}},
     ["$.a.b: 1 is not valid under anyOf"]),
])
def test_a_false_subschema_names_the_path_and_says_not_allowed(schema: dict[str, Any], instance: Any,
                                                               expected: list[str]) -> None:
    found = violations(checked({"type": "object", **schema}), instance)
    assert found == expected
    assert not any("None" in line for line in found)


# --- 9. pattern classes in ECMA-262's meaning ----------------------------------------------------


@pytest.mark.parametrize(("pattern", "text", "matches"), [
    (r"^\S+$", "a\u00a0b", False), (r"^\S+$", "a\u2003b", False), (r"^\S+$", "a\ufeffb", False),
    (r"^\S+$", "a\vb", False), (r"^\S+$", "abc", True), (r"^\s$", "\u00a0", True), (r"^\s$", "\u2028", True),
    (r"^[\s]$", "\u3000", True), (r"^[^\s]$", "\u3000", False), (r"^[a\S]$", "\u00a0", False),
    (r"^[^\S\n]$", "\u00a0", True), (r"^[^\S\n]$", "\n", False), (r"^.$", "\u2028", False), (r"^.$", "\r", False),
    (r"^.$", "x", True), (r"^[.]$", ".", True), (r"^\d$", "\u0663", False), (r"^\w$", "\u00e9", False),
    (r"\bx", "\u00e9x", True),
])
def test_pattern_classes_follow_ecma_262(pattern: str, text: str, matches: bool) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
    assert (violations(checked(schema), {"s": text}) == []) is matches
    keyed = {"type": "object", "patternProperties": {pattern: {"type": "integer"}}}
    assert (violations(checked(keyed), {text: "no"}) != []) is matches


def test_translated_patterns_stay_linear() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": r"^(\s*\S*)*$"}}}
    validator = checked(schema)
    started = time.perf_counter()
    assert violations(validator, {"s": " a" * 20_000 + "\u00a0"}) == []
    assert time.perf_counter() - started < slack(2.0)


# --- 2. text others wrote reaches the terminal as text -------------------------------------------

HOSTILE = ["[/]", "[link=https://example.invalid]click[/link]", "\x1b]0;owned\x07", "\x1b]52;c;ZXZpbA==\x07",
           "\x1b[2J\x1b[H", "a\x9b2Jb", "\u202eevil", "[bold]x", "\ud800"]
TERMINAL_CONTROLS = ["\x1b]0;", "\x1b]52;", "\x1b[2J", "\x1b]8;", "\x07", "\x9b", "\u202e"]


def rendered(renderable: Any) -> str:
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="truecolor", width=200).print(renderable)
    return out.getvalue()


@pytest.mark.parametrize("text", HOSTILE)
def test_top_shows_hostile_ids_names_and_reasons_as_text(text: str) -> None:
    view = TopView()
    view.update({"type": "snapshot", "tree": {"id": text, "kind": text, "restart": text, "restarts": text,
                                              "children": [{"id": text}]},
                 "calls": [{"session_id": text, "call_id": text, "tool": text, "ms_left": 5.0}],
                 "workers": [{"pid": text, "rss_bytes": text}], "stats": {}, "dropped": 0,
                 "events": [{"kind": text, "session_id": text, "call_id": text, "tool": text, "outcome": text,
                             "duration_ms": text}],
                 "reports": [{"type": "report", "event": text, "reason": text}]})
    view.update({"type": "event", "kind": "started", "session_id": text, "call_id": text + "2", "tool": text})
    out = rendered(view.render())
    assert not any(control in out for control in TERMINAL_CONTROLS), repr(out)
    if text.startswith("["):
        assert text in out  # shown as written, not read as markup


@pytest.mark.parametrize("text", HOSTILE)
def test_the_selftest_table_shows_hostile_names_and_messages_as_text(text: str) -> None:
    out = rendered(render_rows([SelftestRow(text, "failed", 1.0, text)]))
    assert not any(control in out for control in TERMINAL_CONTROLS), repr(out)
    out.encode("utf-8")


# --- 3. the observer stream is strict JSON -------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "\ud800", {"x": [math.nan]}, b"raw", (1, 2)])
def test_observer_lines_are_rfc_8259(value: Any) -> None:
    line = json_line({"type": "report", "event": "ProgressEvent", "done": value})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    message = strict_loads(line.decode("utf-8"))
    assert message["type"] == "report"


def test_a_nan_progress_is_dropped_and_a_viewer_gets_strict_json(tmp_path: Path) -> None:
    import shutil
    import tempfile

    from rho_actors import tool
    from rho_actors.observe.top import connect

    @tool
    def odd(n: int, ctx: Any) -> int:
        """Report progress that is not a number, then some that is, with a lone surrogate."""
        ctx["progress"](float("nan"), float("inf"), "not a number")
        ctx["progress"](1, float("inf"), "infinite total")
        ctx["progress"](1, 2, "\ud800 odd")
        return n

    folder = Path(tempfile.mkdtemp(prefix="rho-obs-", dir="/tmp"))
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        system.register(odd)
        observer = system.observe(folder / "o.sock", interval_s=60)
        sock = connect(observer.address)
        sock.settimeout(WAIT_S)
        with sock.makefile("rb") as lines:
            strict_loads(lines.readline())
            assert system.start_loop("nan").run_turn([ToolCall("c1", "odd", '{"n": 1}')])[0].ok
            seen: list[dict[str, Any]] = []
            until = time.monotonic() + WAIT_S
            while not any(m.get("event") == "ProgressEvent" for m in seen):
                assert time.monotonic() < until, seen
                seen.append(strict_loads(lines.readline()))
        sock.close()
        observer.close()
    finally:
        system.stop()
        shutil.rmtree(folder, ignore_errors=True)
    # JSON has no NaN or infinity: the reports that are not finite were dropped where they were made
    # (events.report_progress), so the first a viewer gets (in the order made) is the finite one
    [progress] = [m for m in seen if m.get("event") == "ProgressEvent"]
    assert progress["done"] == 1 and progress["total"] == 2 and progress["message"] == "\ufffd odd"


# --- 4. MCP stdio: every request gets its answer ---------------------------------------------


def test_stdio_requests_with_bad_ids_or_params_are_answered(tmp_path: Path) -> None:
    from tests.mcp_fixtures import served_tools

    proc = subprocess.Popen(
        [sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--tools", str(Path(served_tools.__file__)),
         "--data-dir", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    bad_ids = ["null", "true", "1.5", "{}", "[]"]
    lines = [f'{{"jsonrpc": "2.0", "method": "ping", "id": {i}}}' for i in bad_ids]
    lines += ['{"jsonrpc": "2.0", "method": "tools/list", "id": 7, "params": [1]}',
              '{"jsonrpc": "2.0", "method": "tools/list", "id": "s", "params": "x"}',
              '{"jsonrpc": "1.0", "method": "ping", "id": 8}']
    try:
        for line in lines:
            proc.stdin.write(line.encode() + b"\n")
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}).encode() + b"\n")
        proc.stdin.flush()
        received: queue.Queue[bytes] = queue.Queue()  # a thread reads: select() misses lines already buffered
        stdout = proc.stdout

        def read() -> None:
            for answer in stdout:
                received.put(answer)

        threading.Thread(target=read, daemon=True).start()
        answers: list[dict[str, Any]] = []
        for _ in range(len(lines) + 1):
            try:
                answers.append(json.loads(received.get(timeout=WAIT_S)))
            except queue.Empty:
                raise AssertionError(f"no answer after {answers}") from None
    finally:
        proc.kill()
        proc.wait(WAIT_S)
    errors = [(a["id"], a["error"]["code"]) for a in answers if "error" in a]
    assert errors == [(None, -32600)] * len(bad_ids) + [(7, -32600), ("s", -32600), (8, -32600)], answers
    assert "params" in next(a for a in answers if a.get("id") == 7)["error"]["message"]
    [ok] = [a for a in answers if a.get("id") == 1 and "result" in a]
    assert ok["result"]["serverInfo"]["name"] == "rho-actors"


# --- 10. every text a child sends is scrubbed once, in the codec ----------------------------------


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"message": "\\ud800"}', {"message": "\ufffd"}),
    (b'{"m\\udfffx": ["\\u001b]0;t\\u0007", {"k": "\\u009b2J"}]}',
     {"m\ufffdx": ["\ufffd]0;t\ufffd", {"k": "\ufffd2J"}]}),
    (b'"tab\\tnew\\nline"', "tab\tnew\nline"),
    (b"[1, 2.5, null, true]", [1, 2.5, None, True]),
])
def test_json_from_a_child_is_scrubbed(body: bytes, expected: Any) -> None:
    assert wire.decode_json(body) == expected


def test_a_hostile_selftest_answer_reaches_the_table_as_safe_text(tmp_path: Path) -> None:
    from rho_actors.selftest import run_selftests
    from rho_actors.tool import Error

    hostile = make_tool("hostile", selftest=lambda: Error("\ud800 \x1b]52;c;ZXZpbA==\x07 \x1b[2J [/]"))
    [row] = run_selftests([hostile], timeout_s=WAIT_S)
    assert row.outcome == "failed"
    assert "\x1b" not in row.message and "\x07" not in row.message and row.message.encode("utf-8")
    out = rendered(render_rows([row]))
    assert "[/]" in out and not any(control in out for control in TERMINAL_CONTROLS)


# --- 12. a result frame with an unsupported picture type is a protocol violation ------------------


def plain_result(mime: str) -> bytes:
    return bytes(msgpack.packb({"ok": True, "content": "x", "error_kind": None, "details": None,
                                "images": [[b"<svg/>", mime]]}, use_bin_type=True))


@pytest.mark.parametrize("mime", ["image/svg+xml", "text/html", "application/pdf", "image/x-icon"])
def test_a_well_formed_unsupported_image_type_is_a_wire_error(mime: str) -> None:
    with pytest.raises(wire.WireError, match=r"images\[0\].*not supported"):
        wire.PlainCodec().decode(plain_result(mime))
    assert wire.PlainCodec().decode(plain_result("image/png")).images == (Image(b"<svg/>", "image/png"),)


class ForgedImage:
    """Returns a picture whose type was changed after it was checked."""

    @staticmethod
    def name() -> str:
        return "forged_image"

    @staticmethod
    def description() -> str:
        return "Returns an SVG."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object"}

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        image = Image(b"<svg/>", "image/png")
        object.__setattr__(image, "mime_type", "image/svg+xml")
        return image


def test_a_worker_sending_an_unsupported_image_type_is_killed_and_the_call_crashed() -> None:
    with WorkerPool(warm=0) as pool:
        ctx = {"session_id": "s1", "call_id": "c1"}
        result = pool.run(ForgedImage, {}, ctx, time.monotonic() + WAIT_S, 10_000)
        assert result.error_kind is ErrorKind.CRASHED, result
        assert "image/svg+xml" in result.content and "not supported" in result.content
        assert pool.run(ForgedImage, {}, ctx, time.monotonic() + WAIT_S, 10_000).error_kind is ErrorKind.CRASHED

"""Tools served by ``rho-actors mcp serve`` in the tests."""

import time
from typing import Any

from rho_actors import Audio, Details, Error, Image, Resource, tool

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
WAV = b"RIFF" + b"\0" * 40
MEDIA = (Image(PNG, "image/png"), "between", Audio(WAV, "audio/wav"),
         Resource("file:///notes.txt", "text/plain", text="the notes"),
         Resource("test://blob", "application/octet-stream", blob=b"\x00\xffbytes"), "last")


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


@tool(timeout_ms=300)
def slow() -> str:
    """Take too long."""
    time.sleep(3)
    return "never seen"


@tool
def boom() -> str:
    """Raise."""
    raise RuntimeError("boom went the tool")


@tool
def refuse() -> Error:
    """Return an error."""
    return Error("refused on purpose")


@tool
def secret() -> Details:
    """Keep details for the host."""
    return Details("public part", {"token": "host-only-secret"})


@tool
def media() -> tuple[object, ...]:
    """Return a picture, a sound and two embedded resources between texts, in that order."""
    return MEDIA


@tool
def picture() -> list[object]:
    """Return a picture beside text."""
    return ["a picture", Image(PNG, "image/png")]


class WaitForCancel:
    """Reports progress, then waits for its cancellation (at most ``hold_s`` seconds,
    default 15: then it marks its folder ``finished`` and ends)."""

    @staticmethod
    def name() -> str:
        return "wait_for_cancel"

    @staticmethod
    def description() -> str:
        return "Report progress, then wait until cancelled."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"hold_s": {"type": "number", "minimum": 0, "maximum": 15}}}

    @staticmethod
    def timeout_ms() -> int:
        return 20_000

    @staticmethod
    def run(args: dict[str, Any], ctx: dict[str, Any]) -> str:
        ctx["progress"](1, 2, "half way")
        if ctx["cancel"].wait(float(args.get("hold_s", 15))):
            (ctx["data_dir"] / "cancelled").write_text(str(ctx["cancel"].reason))
            return "cancelled"
        (ctx["data_dir"] / "finished").write_text("ran to its end")
        return "not cancelled"

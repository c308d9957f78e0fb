"""Classes the stateful-server tests run in a server's process (stdlib imports only, so a
confined child imports this module by reference)."""

from __future__ import annotations

import os
import time
from typing import Any


class Store:
    """A key-value store, with probes of the process it lives in."""

    def __init__(self, first: str = "") -> None:
        self.data: dict[str, Any] = {"first": first} if first else {}

    def put(self, key: str, value: Any) -> str:
        self.data[key] = value
        return "stored"

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def where(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "uid": os.getuid(), "env": sorted(os.environ)}

    def read(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    def stall(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"

    def opaque(self) -> object:
        return object()

    def forge(self) -> str:
        """Write a forged answer header on the server's channel (descriptor 3 of a clean
        child): an answer of 1 TiB."""
        os.write(3, b"W" + (2**40).to_bytes(8, "big"))
        time.sleep(30)
        return "unreachable"

    def fail(self) -> None:
        raise LookupError("no such thing")


class Broken:
    """A server whose start raises."""

    def __init__(self) -> None:
        raise ValueError("cannot open the store")

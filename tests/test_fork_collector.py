"""The cyclic collector across a fork: a child forked while another thread pauses the
collector gets it back; one forked inside its own pause keeps it until the block ends."""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Iterator

import pytest

from rho_actors.declarations.toolset import no_collection

from .conftest import WAIT_S


def _forked_collector(child_work: str) -> str:
    """Fork; the child reports ``gc.isenabled()`` (``"1"``/``"0"``) now and after
    ``child_work`` (``"block"``: one :func:`no_collection` block), then exits."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing but the report
        try:
            seen = "1" if gc.isenabled() else "0"
            if child_work == "block":
                with no_collection():
                    pass
                seen += "1" if gc.isenabled() else "0"
            os.write(write, seen.encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as pipe:
            return pipe.read().decode()
    finally:
        os.waitpid(pid, 0)


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.mark.skipif(sys.platform == "win32", reason="os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_child_forked_while_another_thread_pauses_the_collector_gets_it_back(collector_on: None) -> None:
    """Before: the child inherited the pause of a thread it does not have; no block of
    its own ever ended the last one, so it ran without a cyclic collector for good
    (``"00"``: off at once, and still off after a block of its own)."""
    entered, release = threading.Event(), threading.Event()

    def pause() -> None:
        with no_collection():
            entered.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=pause)
    holder.start()
    try:
        assert entered.wait(WAIT_S)
        assert not gc.isenabled()  # paused here, by the other thread
        assert _forked_collector("block") == "11"
    finally:
        release.set()
        holder.join(WAIT_S)
    assert gc.isenabled()  # the parent's pause ended as before


@pytest.mark.skipif(sys.platform == "win32", reason="os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_child_forked_inside_its_own_pause_keeps_it_until_the_block_ends(collector_on: None) -> None:
    read, write = os.pipe()
    with no_collection():
        pid = os.fork()
        if pid == 0:
            try:
                seen = "1" if gc.isenabled() else "0"
            except BaseException:
                seen = "?"
            os.write(write, seen.encode())
            os._exit(0)
    if pid == 0:  # pragma: no cover - the child has exited above
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        assert pipe.read() == b"0"  # the forking thread's block still runs in the child
    os.waitpid(pid, 0)
    assert gc.isenabled()

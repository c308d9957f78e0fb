"""Plugin folders read their files safely (DESIGN §3 "Plugin files"): no link is
followed, only regular files within a size bound are read (checked with ``fstat``
first), no file content reaches ``status()`` or the log, and slow files are searched
at once under one bound for the whole scan."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from rho_actors import ActorSystem, PluginFolder
from rho_actors.sources.builtin import Broken
from tests.conftest import WAIT_S, slack
from tests.test_sources import plugin, write

SECRET = "s3cr3t-token-d41d8cd98f00"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "plugins"
    path.mkdir()
    return path


def test_a_link_to_a_root_only_file_is_not_followed(
    system: ActorSystem, folder: Path, tmp_path: Path, logs: list[str]
) -> None:
    secret = tmp_path / "settings.py"
    secret.write_text(f"TOKEN = {SECRET}\n")  # a NameError naming the token, were it imported
    secret.chmod(0o600)
    (folder / "settings.py").symlink_to(secret)
    os.link(secret, folder / "hardlinked.py")
    write(folder, "good.py", plugin("good", "fine"))
    handle = system.add_source(PluginFolder(folder), poll_s=None)
    status = handle.refresh()
    tools = status["tools"]
    assert tools[str(folder / "good.py")]["offered"] is True
    assert "a symbolic link" in tools[str(folder / "settings.py")]["reason"]
    assert "2 hard links" in tools[str(folder / "hardlinked.py")]["reason"]
    assert SECRET not in repr(status)
    assert not any(SECRET in m for m in logs)


def test_a_sparse_huge_file_is_refused_unread(system: ActorSystem, folder: Path) -> None:
    from rho_actors.sources.builtin import DEFAULT_MAX_PLUGIN_FILE_BYTES

    huge = folder / "huge.py"
    with huge.open("wb") as f:
        f.truncate(2**30)  # 1 GiB, sparse: reading it whole would cost the host 1 GiB
    write(folder, "good.py", plugin("good", "fine"))
    source = PluginFolder(folder)
    handle = system.add_source(source, poll_s=None)
    status = handle.refresh()
    reason = status["tools"][str(huge)]["reason"]
    assert f"{2**30} bytes, over the bound of {DEFAULT_MAX_PLUGIN_FILE_BYTES} bytes" in reason
    assert status["tools"][str(folder / "good.py")]["offered"] is True
    assert status["bounds"]["max_file_bytes"] == DEFAULT_MAX_PLUGIN_FILE_BYTES == 2**20
    # the bound is a setting
    small = PluginFolder(folder, max_file_bytes=64)
    found = small.scan()
    assert isinstance(found[str(huge)][0], Broken)
    assert "over the bound of 64 bytes" in found[str(folder / "good.py")][0].reason


def test_a_fifo_is_reported_never_opened(system: ActorSystem, folder: Path) -> None:
    fifo = folder / "pipe.py"
    os.mkfifo(fifo)  # opening it to read would wait for a writer forever
    handle = system.add_source(PluginFolder(folder), poll_s=None)
    reason = handle.refresh(timeout_s=WAIT_S)["tools"][str(fifo)]["reason"]
    assert "not a regular file" in reason


SLOW = "import time\ntime.sleep(60)\n"


def test_slow_files_are_searched_at_once_under_one_bound(folder: Path) -> None:
    timeout_s = round(slack(2.0), 1)  # a search's own bound, scaled: the good file's search stays within it
    good = write(folder, "good.py", plugin("good", "fine"))
    source = PluginFolder(folder, discovery_timeout_s=timeout_s, scan_timeout_s=3 * timeout_s)
    source.scan()  # the forkserver started: its first start is no part of what is measured
    slow = [write(folder, f"slow{i}.py", SLOW) for i in range(3)]
    started = time.monotonic()
    found = source.scan()
    elapsed = time.monotonic() - started
    assert not isinstance(found[str(good)][0], Broken)
    for path in slow:
        assert f"took longer than {timeout_s:g} s" in found[str(path)][0].reason
    assert elapsed < 2 * timeout_s, f"three slow files took {elapsed:.1f} s: searched one after another"


def test_a_scan_waits_at_most_its_bound(folder: Path) -> None:
    path = write(folder, "slow.py", SLOW)
    source = PluginFolder(folder, discovery_timeout_s=3.0, scan_timeout_s=0.2)
    started = time.monotonic()
    found = source.scan()
    assert time.monotonic() - started < 0.2 + slack(1.0)
    assert "still being read or searched" in found[str(path)][0].reason
    # a later scan takes up the outcome once the search is done
    until = time.monotonic() + WAIT_S
    while "still being read" in found[str(path)][0].reason and time.monotonic() < until:
        found = source.scan()
    assert "still being read" not in found[str(path)][0].reason
    assert isinstance(found[str(path)][0], Broken)


def test_a_read_under_way_at_the_systems_stop_leaves_no_thread_behind(tmp_path: Path, folder: Path) -> None:
    """A plugin file still being searched when the system stops: its read is cancelled
    (its discovery child killed) and its reading thread ends, while the host still holds
    the source's handle (its thread idled in the folder's pool for good before)."""
    before = set(threading.enumerate())
    path = write(folder, "slow.py", SLOW)  # searched for 60 s, past the discovery bound below
    source = PluginFolder(folder, discovery_timeout_s=4 * WAIT_S, scan_timeout_s=0.05)
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        handle = system.add_source(source, poll_s=None)
        assert "still being read" in handle.status()["tools"][str(path)]["reason"]
        reading = [t for t in extra_threads_now(before) if t.name.startswith("rho-plugin-read")]
        assert reading, "the file's read is not under way"
    finally:
        system.stop()
    for thread in reading:
        thread.join(WAIT_S)
    assert not [t.name for t in reading if t.is_alive()], "a plugin read's thread outlived the system's stop"
    assert handle.source is source  # held all along


def extra_threads_now(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before]

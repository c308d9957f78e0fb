"""rho_actors.otp.owned.owning: the ledger a thread's new actors and processes read (owner_now)."""

from __future__ import annotations

import threading

import pytest

from rho_actors.otp.owned import OwnedProcesses, owner_now, owning


def test_owning_sets_the_ledger_meanwhile_nested_and_through_an_error() -> None:
    first, second = OwnedProcesses(), OwnedProcesses()
    assert owner_now() is None
    with owning(first):
        assert owner_now() is first
        with owning(None):  # unchanged
            assert owner_now() is first
        with owning(second):
            assert owner_now() is second
        assert owner_now() is first
        with pytest.raises(ValueError, match="inside"), owning(second):
            raise ValueError("inside")  # not swallowed; the ledger before is back
        assert owner_now() is first
        seen: list[OwnedProcesses | None] = []
        other = threading.Thread(target=lambda: seen.append(owner_now()))
        other.start()
        other.join()
        assert seen == [None]  # per thread
    assert owner_now() is None

"""LangGraph prebuilt's tests/conftest.py, cut to what the vendored tests use: the
in-memory checkpointer and store only (upstream also runs SQLite and Postgres)."""

from collections.abc import AsyncIterator, Iterator

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore

from tests.memory_assert import MemorySaverAssertImmutable

pytest.register_assert_rewrite("tests.memory_assert")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=["in_memory"])
def sync_store(request: pytest.FixtureRequest) -> Iterator[BaseStore]:
    yield InMemoryStore()


@pytest.fixture(params=["in_memory"])
async def async_store(request: pytest.FixtureRequest) -> AsyncIterator[BaseStore]:
    yield InMemoryStore()


@pytest.fixture(params=["memory"])
def sync_checkpointer(request: pytest.FixtureRequest) -> Iterator[BaseCheckpointSaver]:
    yield MemorySaverAssertImmutable()


@pytest.fixture(params=["memory"])
async def async_checkpointer(request: pytest.FixtureRequest) -> AsyncIterator[BaseCheckpointSaver]:
    yield MemorySaverAssertImmutable()

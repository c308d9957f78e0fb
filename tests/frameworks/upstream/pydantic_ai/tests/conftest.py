"""The helpers test_tools.py imports from pydantic-ai's tests/conftest.py, copied as they
are there (its other fixtures serve recorded model providers, which these tests do not use)."""

from __future__ import annotations as _annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

import pytest
from dirty_equals import IsBytes, IsDatetime, IsFloat, IsInstance, IsInt, IsList, IsNow as _IsNow, IsStr

from pydantic_ai.messages import ModelMessage

__all__ = ('IsBytes', 'IsDatetime', 'IsFloat', 'IsInstance', 'IsInt', 'IsList', 'IsNow', 'IsStr',
           'iter_message_parts', 'message', 'message_part')

T = TypeVar('T')


def IsNow(*args, **kwargs):
    # Increase the default value of `delta` to 10 to reduce test flakiness on overburdened machines
    if 'delta' not in kwargs:  # pragma: no branch
        kwargs['delta'] = 10
    return _IsNow(*args, **kwargs)


@pytest.fixture
def anyio_backend():
    return 'asyncio'


def iter_message_parts(messages: Sequence[ModelMessage], message_type, part_type) -> Iterator:
    """Iterate over all parts of a given type in messages of a given type."""
    for msg in messages:  # pragma: no branch
        if isinstance(msg, message_type):
            for part in msg.parts:
                if isinstance(part, part_type):
                    yield part


def message(messages: Sequence[ModelMessage], message_type: type[T], *, index: int = 0) -> T:
    """Return `messages[index]`, asserting it is an instance of `message_type`."""
    msg = messages[index]
    assert isinstance(msg, message_type)
    return msg


def message_part(messages: Sequence[ModelMessage], part_type: type[T], *, message_index: int = 0,
                 part_index: int = 0) -> T:
    """Return `messages[message_index].parts[part_index]`, asserting it is an instance of `part_type`."""
    msg = messages[message_index]
    part = msg.parts[part_index]
    assert isinstance(part, part_type)
    return part

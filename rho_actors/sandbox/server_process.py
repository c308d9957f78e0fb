"""The child's side of a stateful server in its own process (internal; DESIGN §5 and §6).

A server child builds one object, ``cls(*args, **kwargs)``, once it is set up (and,
untrusted, confined: :func:`rho_actors.sandbox.child.enter_child` has run), answers
``READY``, then serves ``SERVE`` frames one at a time: ``getattr(obj, method)(*args,
**kwargs)``, answered by a ``SERVED`` frame in its codec (:func:`wire.encode_served`).
Its state is that object, for the life of the process: the host kills the process at a
call's deadline, and its supervisor starts a fresh one. A start that raises is answered
by one ``SERVED`` error frame; the child then ends. The host's side is
:mod:`rho_actors.isolation.servers`.
"""

from __future__ import annotations

import contextlib
import pickle
from typing import Any

from rho_actors.sandbox import wire
from rho_actors.sandbox.channel import Channel

__all__ = ["server_child"]


def _answer(channel: Channel, codec: str, ok: bool, value: Any) -> None:
    try:
        body = wire.encode_served(codec, ok, value)
    except wire.WireError as exc:
        body = wire.encode_served(codec, False, TypeError(str(exc)))
    channel.send(wire.SERVED, body)


def server_child(channel: Channel, payload: tuple[str, bytes]) -> None:
    """Entry of a server child: ``payload`` is ``(codec, pickled (cls, args, kwargs))``,
    unpickled here, after the child's set-up. Returns when the host closes the pipe or
    sends anything but a ``SERVE`` frame."""
    codec, state = payload
    try:
        cls, args, kwargs = pickle.loads(state)
        obj = cls(*args, **kwargs)
    except BaseException as exc:  # a start that fails, SystemExit included, is the answer
        with contextlib.suppress(BaseException):
            _answer(channel, codec, False, exc)
        return
    channel.send(wire.READY, b"")
    while True:
        try:
            tag, body = channel.recv()
        except EOFError:
            return
        if tag != wire.SERVE:
            return
        try:
            method, call_args, call_kwargs = pickle.loads(body)
            if type(method) is not str or method.startswith("_"):
                raise AttributeError(f"a server has no public method {method!r}")
            value = getattr(obj, method)(*call_args, **call_kwargs)
        except BaseException as exc:  # a raise (or an exit) of one call is that call's answer
            _answer(channel, codec, False, exc)
            continue
        _answer(channel, codec, True, value)

"""Text that others wrote, made safe for a terminal (``rho-actors top``, the selftest table).

A call id, a tool name, a rejection reason or a selftest message comes from a model, a
client or a plugin. Printed as rich markup it can break every render (``[/]`` raises
``MarkupError``) or style and link (``[link=...]``); printed raw, its control sequences
drive the terminal (OSC 0 sets the window title, OSC 52 writes the clipboard, CSI 2J
clears the screen). :func:`terminal_text` gives a ``rich.text.Text`` (never parsed as
markup) of the text with every control character and bidirectional override replaced.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from rho_actors.encoding import replace_controls, scrub_text

__all__ = ["safe_text", "terminal_text"]



def safe_text(value: Any) -> str:
    """``value`` (``str()`` of it when not a string; never raises) as a plain string
    with lone surrogates and every unsafe character (see :func:`~rho_actors.encoding.replace_controls`) replaced by
    U+FFFD. Tab and newline are kept."""
    if not isinstance(value, str):
        try:
            value = str(value)
        except Exception:
            value = f"<{type(value).__qualname__}>"
    return replace_controls(scrub_text(value))


def terminal_text(value: Any, style: str = "") -> Text:
    """:func:`safe_text` of ``value`` as a ``rich.text.Text`` with ``style``: shown as
    written, never read as markup."""
    return Text(safe_text(value), style=style)

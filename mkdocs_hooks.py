"""mkdocs hooks for the site (mkdocs.yml ``hooks:``).

The docstrings cross-reference in reST roles (``:class:`~rho_actors.Loop```,
``:meth:`stop```), which Markdown renders as the role's text before the code. The
reference shows the code alone, as the short name where the role asked for it (``~``).
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:attr|class|const|data|exc|func|meth|mod|obj|py:\w+):(<code>)(~?)([^<]*)(</code>)")


def _code(match: re.Match[str]) -> str:
    text = match[3].rsplit(".", 1)[-1] if match[2] else match[3]
    return f"{match[1]}{text}{match[4]}"


def on_page_content(html: str, **_: Any) -> str:
    """The page's HTML with each reST role before a code span left out."""
    return _ROLE.sub(_code, html)

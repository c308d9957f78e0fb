"""A tool result's content blocks to and from MCP content (DESIGN §6b "MCP").

:func:`mcp_content` gives one of a rho result's blocks (:attr:`ToolResult.blocks
<rho_actors.tool.ToolResult.blocks>`: text, :class:`~rho_actors.tool.Image`,
:class:`~rho_actors.tool.Audio`, :class:`~rho_actors.tool.Resource`) as MCP's
``TextContent``, ``ImageContent``, ``AudioContent`` or ``EmbeddedResource``
(:mod:`rho_actors.mcp.serve`); :func:`rho_value` gives an MCP server's
``CallToolResult`` as what a rho tool returns, the same values in the same order
(:mod:`rho_actors.mcp.source`), so a gateway passes an upstream's content on.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import mcp_types as types

from rho_actors.tool import MEDIA, Audio, Block, Details, Error, Image, Resource

__all__ = ["mcp_content", "rho_value"]


def mcp_content(block: Block) -> Any:
    """One of a result's blocks as MCP content: text, image, audio or an embedded resource."""
    if isinstance(block, str):
        return types.TextContent(type="text", text=block)
    if isinstance(block, (Image, Audio)):
        data = base64.b64encode(block.data).decode("ascii")
        if isinstance(block, Image):
            return types.ImageContent(type="image", data=data, mime_type=block.mime_type)
        return types.AudioContent(type="audio", data=data, mime_type=block.mime_type)
    contents: types.TextResourceContents | types.BlobResourceContents
    if block.text is not None:
        contents = types.TextResourceContents(uri=block.uri, mime_type=block.mime_type, text=block.text)
    else:
        contents = types.BlobResourceContents(uri=block.uri, mime_type=block.mime_type,
                                              blob=base64.b64encode(block.blob or b"").decode("ascii"))
    return types.EmbeddedResource(type="resource", resource=contents)


def rho_value(result: types.CallToolResult) -> Any:
    """A ``CallToolResult`` as what a rho tool returns: text, :class:`Image`,
    :class:`Audio` and :class:`Resource` values in the server's order (a gateway serves
    them on as they came); a block rho cannot hold (invalid base64, a bad MIME type or
    URI, a resource link) becomes a line of text saying what it was."""
    parts: list[Any] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, (types.ImageContent, types.AudioContent)):
            kind = "an image" if isinstance(block, types.ImageContent) else "a sound"
            try:
                data = base64.b64decode(block.data, validate=True)
            except ValueError:
                parts.append(f"[{kind} whose base64 data is invalid ({block.mime_type})]")
                continue
            try:
                parts.append(Image(data, block.mime_type) if isinstance(block, types.ImageContent)
                             else Audio(data, block.mime_type))
            except ValueError as exc:
                parts.append(f"[{kind} that cannot be kept: {exc}]")
        elif isinstance(block, types.EmbeddedResource):
            parts.append(_resource(block.resource))
        else:
            parts.append(json.dumps(block.model_dump(by_alias=True, mode="json", exclude_none=True)))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    value: Any = parts if any(isinstance(p, MEDIA) for p in parts) else "\n".join(str(p) for p in parts)
    if result.is_error:
        return Error(value)
    if result.structured_content is not None:  # for the host: the result's details
        return Details(value, {"structuredContent": result.structured_content})
    return value


def _resource(contents: types.TextResourceContents | types.BlobResourceContents) -> Resource | str:
    try:
        if isinstance(contents, types.TextResourceContents):
            return Resource(str(contents.uri), contents.mime_type, text=contents.text)
        return Resource(str(contents.uri), contents.mime_type, blob=base64.b64decode(contents.blob, validate=True))
    except ValueError as exc:  # binascii.Error is a ValueError
        return f"[an embedded resource that cannot be kept ({str(contents.uri)[:200]!r}): {exc}]"

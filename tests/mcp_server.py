"""A tiny MCP server for the tests, written with the official SDK, run as its own process.

`python tests/mcp_server.py` serves over stdio; `--http PORT` over Streamable HTTP on
127.0.0.1 (with `--token T`, only to requests that carry `Authorization: Bearer T`);
`--fail WORDS` writes WORDS to stderr and exits 1, as a server missing something does.

Its tools: `echo` (the text back), `env` (a variable of its environment), `pid` (its process
id), `parts` (a line of text, a PNG, a sound and three resources), `long` (`n` characters), and
`wait`, which writes the server's pid to `marker`, waits until it is cancelled, and then writes
`marker`.ended: how a test sees a call start, and end.
"""

from __future__ import annotations

import argparse
import base64
import os
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp_types import (
    AudioContent,
    BlobResourceContents,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

server = MCPServer("stoke-test")


@server.tool()
def echo(text: str) -> str:
    """The text, back."""
    return text


@server.tool()
def env(name: str) -> str:
    """The value of environment variable `name` here ("" when unset)."""
    return os.environ.get(name, "")


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool(structured_output=False)
def parts() -> list[ContentBlock]:
    """A line of text, a 4 x 4 PNG, 3,000 bytes of sound, a link and two embedded resources."""
    sound = base64.b64encode(bytes(3000)).decode()
    return [
        TextContent(text="a red square"),
        ImageContent(data=_png(), mime_type="image/png"),
        AudioContent(data=sound, mime_type="audio/wav"),
        ResourceLink(name="notes", uri="file:///notes.md", mime_type="text/markdown", size=1500),
        EmbeddedResource(resource=TextResourceContents(uri="file:///a.txt", text="inside a")),
        EmbeddedResource(
            resource=BlobResourceContents(
                uri="file:///b.bin", mime_type="application/zip", blob=sound
            )
        ),
    ]


@server.tool()
def long(n: int) -> str:
    """`n` characters."""
    return "".join(str(i % 10) for i in range(n))


@server.tool()
async def wait(marker: str) -> None:
    """Writes the pid to `marker`, then waits until the call is cancelled."""
    Path(marker).write_text(str(os.getpid()))
    try:
        await anyio.sleep_forever()
    finally:
        Path(marker + ".ended").write_text("ended")


def _png() -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * 4 for _ in range(4))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


def _guarded(app: Any, token: str) -> Any:
    """`app` answering 401 to any request without the bearer token."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int)
    parser.add_argument("--token")
    parser.add_argument("--fail")
    args = parser.parse_args()
    if args.fail:
        print("starting the test server", file=sys.stderr)
        print(args.fail, file=sys.stderr)
        sys.exit(1)
    if args.http is None:
        server.run("stdio")
        return
    import uvicorn

    app = server.streamable_http_app()
    if args.token:
        app = _guarded(app, args.token)
    uvicorn.run(app, host="127.0.0.1", port=args.http, log_level="warning")


if __name__ == "__main__":
    main()

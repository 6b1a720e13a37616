"""A stdio server's stderr: its last lines kept for the words of its state, and its end noticed.

A server that fails says why on stderr (a missing package, a bad token, its own traceback's
last line), so the pipe its stderr goes to is read on the event loop as it writes, and the last
`LINES` lines are kept (each cut to `WIDTH` characters). They are never logged: a server may
print its environment, tokens included. The end of the pipe (`ended`) means the server and
every child holding its stderr are gone, which is how a server that dies while idle is noticed.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from typing import IO

LINES = 20
WIDTH = 300


class StderrTail(asyncio.Protocol):
    """The pipe to give a server as its stderr (`writer`), read on the running loop once
    `start` is awaited; `close` releases both ends."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self.writer: IO[str] = os.fdopen(write_fd, "w")
        self._reader = os.fdopen(read_fd, "rb", buffering=0)
        self._lines: deque[str] = deque(maxlen=LINES)
        self._partial = b""
        self._transport: asyncio.BaseTransport | None = None
        self.ended = asyncio.Event()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.connect_read_pipe(lambda: self, self._reader)

    def spawned(self) -> None:
        """The server holds its own copy of the pipe's end now: Stoke's goes, so the pipe ends
        when the server's does."""
        self.writer.close()

    def close(self) -> None:
        self.writer.close()
        if self._transport is not None:
            self._transport.close()
        else:
            self._reader.close()

    @property
    def last_line(self) -> str | None:
        """The last line the server wrote that is not blank, or None."""
        lines = [*self._lines, self._line(self._partial)]
        return next((line for line in reversed(lines) if line), None)

    def data_received(self, data: bytes) -> None:
        *complete, self._partial = (self._partial + data).split(b"\n")
        self._lines.extend(line for line in map(self._line, complete) if line)
        self._partial = self._partial[-4 * WIDTH :]  # a line without end: its latest part

    def eof_received(self) -> bool:
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    def _end(self) -> None:
        if self._partial.strip():
            self._lines.append(self._line(self._partial))
        self._partial = b""
        self.ended.set()

    @staticmethod
    def _line(raw: bytes) -> str:
        line = raw.decode("utf-8", "replace").strip()
        return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"

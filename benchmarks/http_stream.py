"""A lean asyncio HTTP/1.1 client for the serve benchmarks: JSON POSTs over kept-alive loopback
connections, the response body read as lines (a stream's server-sent events) as they arrive.

The benchmarks measure what the server adds to a request, so the client's own cost must stay small:
httpx's AsyncClient took about 4 ms of a streamed request's time on the project's CPU machine (3.9 ms
from the POST to the app's first line, 1.1 ms from `[DONE]` to the client, against 0.5 and 0.2 ms for
this client; docs/serve.md, "Where the time goes"), about as much as the whole HTTP path it measured.
vLLM's `bench serve` uses aiohttp for the same reason; this needs no package, so the benchmarks run as
they are on the lent GPU machines.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit


class Response:
    """A response's status and headers (names in lower case); its body, once, as `lines()` or `text()`."""

    def __init__(self, client: Client, conn: Connection, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.headers = headers
        self._client, self._conn = client, conn

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines without their line ends, as they arrive; the connection goes back to the pool
        once the body has been read to its end (and is closed if it was not)."""
        reader, pending, whole = self._conn.reader, b"", False
        try:
            async for piece in self._body(reader):
                pending += piece
                *done, pending = pending.split(b"\n")
                for line in done:
                    yield line.rstrip(b"\r").decode()
            if pending:
                yield pending.decode()
            whole = True
        finally:
            if whole and self.headers.get("connection", "").lower() != "close":
                self._client.idle.append(self._conn)
            else:
                self._conn.close()

    async def text(self) -> str:
        return "\n".join([line async for line in self.lines()])

    async def _body(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int((await reader.readline()).split(b";")[0], 16):
                yield await reader.readexactly(size)
                await reader.readexactly(2)  # the chunk's CRLF
            while await reader.readline() not in (b"\r\n", b""):  # trailers
                pass
        elif "content-length" in self.headers:
            yield await reader.readexactly(int(self.headers["content-length"]))


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class Client:
    """POSTs to one `http://host:port` server; each request takes an idle connection or opens one."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.idle: list[Connection] = []

    async def post(self, path: str, body: Any) -> Response:
        """Send `body` as JSON; the response once its headers are in (read its body with `lines()`). A
        kept-alive connection the server has closed meanwhile is replaced once."""
        payload = json.dumps(body, separators=(",", ":")).encode()
        request = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        while True:
            reused = bool(self.idle)
            conn = (
                self.idle.pop()
                if reused
                else Connection(*await asyncio.open_connection(self.host, self.port))
            )
            try:
                return await self._exchange(conn, request)
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                conn.close()
                if not reused:
                    raise

    async def _exchange(self, conn: Connection, request: bytes) -> Response:
        conn.writer.write(request)
        status_line = await conn.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        headers = {}
        while (line := await conn.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        return Response(self, conn, int(status_line.split()[1]), headers)

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()

"""The least one Python process on uvloop needs per answer: a bare asyncio Protocol
replaying an origin's answers, the matrix's ``ceiling`` column.

Where the floor (bench/replay_floor.py) is the least an aiohttp application needs,
this is the least any Python server on the same event loop needs: no aiohttp at all,
no request object, no parsing beyond finding each head's end, its target and four
fields. It keys each request as the floor does (Authorization, target as sent, gzip
or not), fetches a key's answer from ``--origin`` once (with the floor's ``Replay``),
and then writes the stored head and body: a 304 when ``If-None-Match`` names the
stored ETag, ``Connection: close`` honoured. Its CPU per answer, beside the gateway's,
is how much of the gateway's is Python's own work rather than the event loop's and
the kernel's. It is a bench peer, not a server: heads it cannot read close the
connection.

    python bench/replay_ceiling.py --host 127.0.0.1 --port 8091 --origin http://127.0.0.1:8080
"""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate

from replay_floor import REPLAYED, Key, Replay, Stored, run_replay

from gateway.cache.coding import etag_matches

REASONS = {200: b"OK", 304: b"Not Modified"}
# what a 304 carries of the stored fields (RFC 9110, 15.4.5)
NOT_MODIFIED = frozenset({"etag", "cache-control", "vary"})
HEAD_MAX = 16 * 1024


class Answers:
    """Each key's answer as bytes (its 200's head without Date, its body, its ETag and
    its 304's head), made once from the floor's ``Replay``."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self._bytes: dict[Key, tuple[bytes, bytes, str, bytes]] = {}
        self._second = 0
        self._date = b""

    def date(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._date = f"Date: {formatdate(now, usegmt=True)}\r\n".encode()
        return self._date

    def held(self, key: Key) -> tuple[bytes, bytes, str, bytes] | None:
        answer = self._bytes.get(key)
        if answer is None:
            stored = self.replay.held(key)
            if stored is not None:
                answer = self._bytes[key] = _as_bytes(stored)
        return answer


def _as_bytes(stored: Stored) -> tuple[bytes, bytes, str, bytes]:
    fields = [(name, stored.headers[name]) for name in REPLAYED if name in stored.headers]
    reason = REASONS.get(stored.status, b"Answer").decode()
    head = f"HTTP/1.1 {stored.status} {reason}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in fields
    )
    head += f"Content-Length: {len(stored.body)}\r\n"
    not_modified = "HTTP/1.1 304 Not Modified\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in fields if name.lower() in NOT_MODIFIED
    )
    return head.encode(), stored.body, stored.etag, not_modified.encode()


class Connection(asyncio.Protocol):
    """One client connection: each whole head answered in order."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.transport: asyncio.Transport | None = None
        self.held = b""
        self.fetching = False
        self.fetch: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.held += data
        if not self.fetching:
            self._answer_held()

    def _answer_held(self) -> None:
        data, start = self.held, 0
        while self.transport is not None:
            end = data.find(b"\r\n\r\n", start)
            if end < 0:
                break
            lines = data[start:end].split(b"\r\n")
            head_start, start = start, end + 4
            parts = lines[0].split(b" ")
            if len(parts) != 3:
                self.transport.close()
                return
            authorization, gzip, if_none_match, close = "", False, None, False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"authorization":
                    authorization = value.strip().decode("latin-1")
                elif name == b"accept-encoding":
                    gzip = b"gzip" in value
                elif name == b"if-none-match":
                    if_none_match = value.strip().decode("latin-1")
                elif name == b"connection":
                    close = value.strip().lower() == b"close"
            key = (authorization, parts[1].decode("latin-1"), gzip)
            answer = self.answers.held(key)
            if answer is None:  # the origin's first: read nothing more meanwhile
                self.held = data[head_start:]
                self.fetching = True
                self.transport.pause_reading()
                self.fetch = asyncio.ensure_future(self._fetch(key))
                return
            self._send(answer, if_none_match, close)
        self.held = data[start:]
        if len(self.held) > HEAD_MAX and self.transport is not None:
            self.transport.close()

    def _send(
        self, answer: tuple[bytes, bytes, str, bytes], if_none_match: str | None, close: bool
    ) -> None:
        assert self.transport is not None
        head, body, etag, not_modified = answer
        end = b"Connection: close\r\n\r\n" if close else b"\r\n"
        if if_none_match is not None and etag_matches(if_none_match, etag):
            self.transport.writelines((not_modified, self.answers.date(), end))
        else:
            self.transport.writelines((head, self.answers.date(), end, body))
        if close:
            self.transport.close()

    async def _fetch(self, key: Key) -> None:
        try:
            await self.answers.replay.stored(key)
        except Exception:
            if self.transport is not None:
                self.transport.close()
            return
        self.fetching = False
        if self.transport is not None:
            self.transport.resume_reading()
            self._answer_held()


async def serve(host: str, port: int, origin: str) -> None:
    replay = Replay(origin)
    answers = Answers(replay)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(answers), host, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    print(f"replay ceiling: listening on http://{host}:{bound} (replaying {origin})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        server.close()
        await replay.close()


def main() -> None:
    run_replay(__doc__, serve)


if __name__ == "__main__":
    main()

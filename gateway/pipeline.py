"""The request line of one record read, after validation:

    cache key -> cache (hit: bytes out) -> upstream -> normalise -> cache store -> reply

:class:`RecordPipeline` knows nothing of aiohttp's web layer; the HTTP edge hands it
a validated :class:`RecordQuery` and the caller's credentials and turns the
:class:`Reply`, or the GatewayError it raises, into a response.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.auth import Credentials
from gateway.normalise import Normaliser
from gateway.params import RecordQuery
from gateway.upstream import UpstreamClient


@dataclass(frozen=True, slots=True)
class Reply:
    """What the gateway serves for one read: the published JSON body."""

    body: bytes


class RecordPipeline:
    """Serves validated record reads from the upstream, normalised."""

    def __init__(self, upstream: UpstreamClient, normaliser: Normaliser) -> None:
        self._upstream = upstream
        self._normaliser = normaliser

    async def read(self, query: RecordQuery, credentials: Credentials, request_id: str) -> Reply:
        fetched = await self._upstream.fetch(
            query, authorization=credentials.authorization, request_id=request_id
        )
        return Reply(body=self._normaliser.normalise(query, fetched.body))

"""The normalise step of the pipeline: upstream body in, published body out."""

from __future__ import annotations

import orjson

from gateway.errors import UpstreamContractError
from gateway.params import RouteSpec


class Normaliser:
    """Checks that an upstream body is JSON and returns the body to serve."""

    def normalise(self, route: RouteSpec, body: bytes) -> bytes:
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise UpstreamContractError(
                f"GET {route.template}: the upstream answered with a body that is not JSON"
                f" ({exc.msg} at byte {exc.pos})"
            ) from exc
        return body

"""Typed application and request state: every key the web layer stores, in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from gateway.breaker import GuardedCache
from gateway.clock import Clock
from gateway.health import Readiness
from gateway.metrics import Metrics
from gateway.normalise import CoercionCounts
from gateway.pipeline import RecordPipeline
from gateway.runtime import LiveConfig

if TYPE_CHECKING:
    from gateway.handlers import RecordRoutes

LIVE = web.AppKey("live", LiveConfig)
CLOCK = web.AppKey("clock", Clock)
METRICS = web.AppKey("metrics", Metrics)
PIPELINE = web.AppKey("pipeline", RecordPipeline)
CACHE = web.AppKey("cache", GuardedCache)
READINESS = web.AppKey("readiness", Readiness)
COERCIONS = web.AppKey("coercions", CoercionCounts)
OPENAPI = web.AppKey("openapi", bytes)
# typed by annotation: gateway.handlers itself reads keys from here
RECORDS: web.AppKey[RecordRoutes] = web.AppKey("records")
REQUEST_ID = web.RequestKey("request_id", str)
# set by the front door when a record route's shortcut declined the request
SHORTCUT_DECLINED = web.RequestKey("shortcut_declined", bool)

"""Typed application and request state: every key the web layer stores, in one place."""

from __future__ import annotations

from aiohttp import web

from gateway.breaker import GuardedCache
from gateway.clock import Clock
from gateway.health import Readiness
from gateway.metrics import Metrics
from gateway.normalise import CoercionCounts
from gateway.pipeline import RecordPipeline
from gateway.runtime import LiveConfig

LIVE = web.AppKey("live", LiveConfig)
CLOCK = web.AppKey("clock", Clock)
METRICS = web.AppKey("metrics", Metrics)
PIPELINE = web.AppKey("pipeline", RecordPipeline)
CACHE = web.AppKey("cache", GuardedCache)
READINESS = web.AppKey("readiness", Readiness)
COERCIONS = web.AppKey("coercions", CoercionCounts)
OPENAPI = web.AppKey("openapi", bytes)
REQUEST_ID = web.RequestKey("request_id", str)

"""Typed application and request state: every key the web layer stores, in one place."""

from __future__ import annotations

from aiohttp import web

from gateway.breaker import GuardedCache
from gateway.clock import Clock
from gateway.normalise import CoercionCounts
from gateway.pipeline import RecordPipeline
from gateway.settings import Settings

SETTINGS = web.AppKey("settings", Settings)
CLOCK = web.AppKey("clock", Clock)
PIPELINE = web.AppKey("pipeline", RecordPipeline)
CACHE = web.AppKey("cache", GuardedCache)
COERCIONS = web.AppKey("coercions", CoercionCounts)
OPENAPI = web.AppKey("openapi", bytes)
REQUEST_ID = web.RequestKey("request_id", str)

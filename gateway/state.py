"""Typed application and request state: every key the web layer stores, in one place."""

from __future__ import annotations

from aiohttp import web

from gateway.normalise import CoercionCounts
from gateway.pipeline import RecordPipeline
from gateway.settings import Settings

SETTINGS = web.AppKey("settings", Settings)
PIPELINE = web.AppKey("pipeline", RecordPipeline)
COERCIONS = web.AppKey("coercions", CoercionCounts)
OPENAPI = web.AppKey("openapi", bytes)
REQUEST_ID = web.RequestKey("request_id", str)

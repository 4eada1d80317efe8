"""The record routes, each declared once: its path and path parameter, its query
parameters (``parameters``: each kind validates a value and describes itself), the
record model it answers with, its TTL key and default, and what the probe asks of it
(``routes``); the six routes of the Financial Records Read API (``standard``).

Validation (``gateway.records.routes``), the OpenAPI operations and parameters, the
settings' ``cache.ttl_s`` keys, the probe's and ``compare``'s route lists, the router's
registrations and the fast path's matching all read these declarations.

Imports ``gateway.normalise`` (the record models) and ``gateway.errors`` only; never
aiohttp.
"""

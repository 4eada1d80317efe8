"""The record reads, after HTTP: the six routes and the validation of their queries,
the caller's credentials, cache keys, and the pipeline (key -> cache -> upstream ->
normalise -> store) with its coalescing of misses.

Imports ``cache``, ``upstream``, ``normalise``, ``config``, ``ops`` and ``errors``;
never aiohttp's web layer.
"""

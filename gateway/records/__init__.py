"""The record reads, after HTTP: the six routes and the validation of their queries,
the caller's credentials, cache keys, and the pipeline (key -> cache -> upstream ->
normalise -> store): the read's decision (``decision``), its labels
(``cache_status``), the filling of entries with its coalescing of misses (``fill``),
and the caching policy (``policy``).

Imports ``cache``, ``upstream``, ``normalise``, ``config``, ``ops`` and ``errors``;
never aiohttp's web layer.
"""

"""The record reads, after HTTP: the validation of a request against its route's
declaration (``gateway.routing``), the caller's credentials, cache keys, the pipeline
(key -> cache -> upstream -> normalise -> store): the read's decision (``decision``),
its labels (``cache_status``), the filling of entries with its coalescing of misses
(``fill``) and the caching policy (``policy``); and the lookup port the serving layers
use (``lookup``: hit or miss).

Imports ``cache``, ``upstream``, ``normalise``, ``routing``, ``config``, ``ops`` and
``errors``; never aiohttp's web layer.
"""

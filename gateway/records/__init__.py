"""The record reads, after HTTP: the validation of a request against its route's
declaration (``gateway.routing``), the caller's credentials, cache keys, and the
pipeline (key -> cache -> upstream -> normalise -> store) with its coalescing of misses.

Imports ``cache``, ``upstream``, ``normalise``, ``routing``, ``config``, ``ops`` and
``errors``; never aiohttp's web layer.
"""

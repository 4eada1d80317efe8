"""The HTTP edge: the app factory, the edge every request passes (request id, problem
responses, access log, metrics), what no route takes, the record handlers, admin,
health and metrics endpoints, and the OpenAPI document.

Imports the domain (``records``, ``cache``, ``upstream``, ``normalise``) and
``config``/``ops``; never ``fastpath`` or ``process``. Public aiohttp APIs only.
"""

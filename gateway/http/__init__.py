"""The HTTP edge: the app factory, the edge every request passes (request id, problem
responses, access log, metrics), what no route takes, the record handlers, admin,
health and metrics endpoints, the OpenAPI document, and the parts bound to one
upstream with the switch between upstreams (``binding``).

Imports the domain (``records``, ``cache``, ``upstream``, ``normalise``, ``routing``) and
``config``/``ops``; never ``fastpath`` or ``process``. Public aiohttp APIs only.
"""

"""Checks of an upstream from the command line. The conformance probe: call every route
of an upstream once and report how far its answers are from the published schema
(``conformance``), for people and programs (``report``). ``records-gateway compare``:
the requests to send (``sample``), sent to the upstream and to a candidate and their
answers compared (``replay``). Imports ``records``, ``comparison``, ``upstream``,
``normalise`` and below; no HTTP server.
"""

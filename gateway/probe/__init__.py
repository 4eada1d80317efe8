"""The conformance probe: call every route of an upstream once and report how far its
answers are from the published schema (``conformance``), for people and programs
(``report``). Imports ``records``, ``upstream``, ``normalise`` and below; no HTTP server.
"""

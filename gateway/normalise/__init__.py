"""The normalise step: an upstream body in, the published body out.

Holds the coercions of single values (``coercions``), the published schema as pydantic
models with the rules of each record (``schema``), the page envelope (``pages``), the
normaliser that parses, canonicalises and writes a body (``normaliser``), and the
optional compiled twin of the record rules (``compiled``, Cython; ``rules`` picks it
or the pure-Python reference). Imports ``gateway.errors`` only.
"""

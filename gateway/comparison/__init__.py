"""Comparing two upstreams: their answers to one request diffed field by field
(``diff``), what many comparisons add up to (``tally``), and the shadow traffic that
mirrors live requests to a candidate (``shadow``). Imports ``upstream``,
``normalise``, ``ops`` and ``config``; the records layer hands it its requests.
"""

"""W3C Trace Context (https://www.w3.org/TR/trace-context/): the ``traceparent`` and
``tracestate`` fields a caller sends, read strictly, and the ids of new traces and spans.

A ``traceparent`` of version ``00`` is exactly ``00-<trace-id>-<parent-id>-<flags>``:
32, 16 and 2 lower-case hex digits, neither id all zeros. One of a higher version
(not ``ff``) is read as the specification says a version-00 reader reads it: at least
55 characters, the same three fields first, and nothing or a ``-`` after them; it is
continued as version ``00``. Anything else, or the field sent more than once, is no
traceparent at all: the request starts a trace of its own (never an error answer).

Of the flags only ``sampled`` is known to version 00, and only it is passed on (the
specification has a version-00 sender set the other bits to zero).

A ``tracestate`` is kept only with a valid traceparent, and only when every list
member is well formed, there are at most 32 of them, no key twice, and the whole list
is at most 512 characters; otherwise it is dropped (the traceparent still counts).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from random import getrandbits

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.S)
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
_SAMPLED = 0x01
# the list-member grammar of tracestate (simple and multi-tenant keys; values of
# printable ASCII but ',' and '=', not ending in a space)
_MEMBER = re.compile(
    r"([a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
TRACESTATE_MEMBERS_MAX = 32
TRACESTATE_CHARS_MAX = 512


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A caller's valid trace context: its trace id, the id of its span (the parent of
    the gateway's), whether it sampled the trace, and its ``tracestate`` when that was
    valid too."""

    trace_id: str
    parent_id: str
    sampled: bool
    tracestate: str | None = None


def parse_traceparent(value: str) -> TraceParent | None:
    """The trace context of one ``traceparent`` field value; None when it is invalid."""
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, parent_id, bool(int(flags, 16) & _SAMPLED))


def valid_tracestate(fields: Sequence[str]) -> str | None:
    """The ``tracestate`` fields' list members joined as one list, when they are all
    well formed and within bounds; None otherwise (empty members are allowed and
    left out)."""
    members = [
        member.strip(" \t")
        for field in fields
        for member in field.split(",")
        if member.strip(" \t")
    ]
    if not members or len(members) > TRACESTATE_MEMBERS_MAX:
        return None
    keys = set()
    for member in members:
        match = _MEMBER.fullmatch(member)
        if match is None:
            return None
        keys.add(match.group(1))
    if len(keys) != len(members):
        return None
    joined = ",".join(members)
    return joined if len(joined) <= TRACESTATE_CHARS_MAX else None


def caller_context(
    traceparents: Sequence[str] | None, tracestates: Sequence[str] = ()
) -> TraceParent | None:
    """A request's trace context from its ``traceparent`` fields (None: none sent) and
    its ``tracestate`` fields; None when it has no single valid traceparent."""
    if not traceparents or len(traceparents) != 1:
        return None
    parent = parse_traceparent(traceparents[0])
    if parent is None or not tracestates:
        return parent
    tracestate = valid_tracestate(tracestates)
    if tracestate is None:
        return parent
    return TraceParent(parent.trace_id, parent.parent_id, parent.sampled, tracestate)


# Ids need to be unique, not unguessable: the random module's generator (reseeded in
# each forked worker) is enough, and a few times cheaper than os.urandom or secrets.
def new_trace_id() -> str:
    """A new random trace id (32 lower-case hex digits, never all zeros)."""
    bits = getrandbits(128)
    while not bits:  # pragma: no cover - one chance in 2**128
        bits = getrandbits(128)
    return bits.to_bytes(16).hex()


def new_span_id() -> str:
    """A new random span id (16 lower-case hex digits, never all zeros)."""
    bits = getrandbits(64)
    while not bits:  # pragma: no cover - one chance in 2**64
        bits = getrandbits(64)
    return bits.to_bytes(8).hex()


def format_traceparent(trace_id: str, span_id: str, sampled: bool) -> str:
    """The version-00 ``traceparent`` of span ``span_id`` in trace ``trace_id``."""
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"

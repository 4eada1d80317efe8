"""The plain form of an HTTP/1.1 request head, as bytes, and the one check of it that
both ways of serving a connection share.

The plain form is the narrowest and commonest a service sends: the request line is
exactly ``GET <target> HTTP/1.1``, the target an origin form whose path holds only
letters, digits, ``/ _ ~ - .`` and percent escapes other than of a dot, and whose
query only what RFC 3986 allows there (unreserved, sub-delims, ``: @ / ?`` and
escapes); every header line is a token, a colon and printable ASCII (spaces and tabs
included): no obs-fold, no bare CR or LF, no byte above 0x7F.

The fast path reads such heads itself (``gateway.fastpath.request_head``). The public
path (``gateway.process.listener``) reads every read of the socket with aiohttp's
public parser before aiohttp's handler does, so that a head the parser refuses is the
gateway's problem; a read that :func:`one_plain_get` accepts is one that parser reads
as one bodiless GET and refuses nothing of, so it goes to the handler unread.
"""

from __future__ import annotations

import re

# a path of unreserved characters and escapes (not of a dot), and a query of what RFC
# 3986 allows there
# (possessive: neither gives back what it matched, so that a head that is not of the
# form is refused in time linear in its length)
PATH = rb"(/(?:[A-Za-z0-9/_~.-]++|%(?!2[Ee])[0-9A-Fa-f]{2})*+)"
QUERY = rb"(?:\?([A-Za-z0-9._~!$&'()*+,;=:@/?%-]*+))?"
REQUEST_LINE = rb"GET " + PATH + QUERY + rb" HTTP/1\.1\r\n"
FIELD_LINE = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]++:[\t -~]*+\r\n"

# the check's request line takes an escaped dot too (aiohttp's parser does)
_ANY_PATH = rb"/(?:[A-Za-z0-9/_~.-]++|%[0-9A-Fa-f]{2})*+"
_PLAIN_GET = re.compile(
    rb"GET " + _ANY_PATH + rb"(?:\?[A-Za-z0-9._~!$&'()*+,;=:@/?%-]*+)? HTTP/1\.1\r\n"
    rb"(?:" + FIELD_LINE + rb")*+\r\n"
)
# the header fields a plain GET may not have (they frame a body, or switch or hold up
# the request), and those aiohttp's parser takes once at most (RFC 9110's singletons;
# it refuses a second one), as their lines start in a head whose case is folded
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"upgrade", b"expect"))
_NOTED_FIELD = re.compile(
    rb"\r\n(content-length|transfer-encoding|upgrade|expect|content-location|content-range"
    rb"|content-type|etag|host|max-forwards|server|user-agent):"
)


def one_plain_get(data: bytes, line_max: int, fields_max: int) -> bool:
    """Whether ``data`` is exactly one whole head of the plain form (its final empty
    line included), at most ``line_max`` bytes long with at most ``fields_max`` header
    lines, exactly one ``Host``, none of the fields that frame a body or switch
    protocols, and no second one of a field aiohttp's parser takes once. The caller
    sets both bounds well inside its parser's limits (line and field size, header
    count): what this accepts, the parser reads as one GET with no body."""
    if len(data) > line_max or data.count(b"\r\n") > fields_max + 2:
        return False
    if _PLAIN_GET.fullmatch(data) is None:
        return False
    noted = _NOTED_FIELD.findall(data.lower())
    return (
        noted.count(b"host") == 1 and len(set(noted)) == len(noted) and _FRAMING.isdisjoint(noted)
    )

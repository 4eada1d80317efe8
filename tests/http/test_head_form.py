"""The plain form of a request head (``gateway.http.head_form``): what its check
accepts, aiohttp's own parser reads as one bodiless GET and refuses nothing of, under
the limits the server gives it; and the public path's listener, which feeds such a
read to aiohttp unread by its head checker, still answers what follows as before."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.http.head_form import one_plain_get
from gateway.process.worker import MAX_HEADER_BYTES

from ..fastpath.test_request_head import PLAIN, aiohttp_parses, head_of, heads
from ..profiles import examples

# the bounds the listener gives the check: half the server's parser limits
LINE_MAX = MAX_HEADER_BYTES // 2
FIELDS_MAX = 64
# fields aiohttp's parser takes once at most, or that frame a body or switch protocols
_ODD_FIELDS = st.sampled_from(
    ["Host: gw", "User-Agent: a", "Content-Type: text/plain", "ETag: x", "Server: s"] * 2
    + ["Content-Length: 0", "Transfer-Encoding: chunked", "Upgrade: websocket"]
    + ["Expect: 100-continue", "Max-Forwards: 1", "Content-Location: /x", "Content-Range: x"]
    + ["HOST: gw", "user-agent: b"]
)


@st.composite
def heads_with_more(draw: st.DrawFn) -> bytes:
    """A head of ``heads`` (mostly of the plain form), with up to two more fields of
    those the check looks for, anywhere among its lines."""
    head = draw(heads())
    end = b"\r\n" if head.endswith(b"\r\n\r\n") else b"\n"
    lines = head[: -2 * len(end)].split(end)
    for field in draw(st.lists(_ODD_FIELDS, max_size=2)):
        lines.insert(draw(st.integers(1, len(lines))), field.encode())
    return end.join(lines) + end + end


async def aiohttp_reads_one_bodiless_get(head: bytes) -> bool:
    """Whether aiohttp's parser, with the server's limits, reads ``head`` as exactly one
    GET with no body that does not switch protocols, refusing nothing."""
    parsed = await aiohttp_parses(head)
    if parsed is None:
        return False
    messages, upgraded, tail = parsed
    if len(messages) != 1 or upgraded or tail:
        return False
    message, payload = messages[0]
    return bool(message.method == "GET" and payload.is_eof() and not message.upgrade)


@settings(max_examples=examples(800), deadline=None)
@given(heads_with_more())
@example(PLAIN)
@example(head_of("Host: gw", "User-Agent: a", "user-agent: b"))
@example(head_of("Host: gw", "Host: gw"))
@example(head_of("Host: gw", "Content-Length: 0"))
async def test_what_the_check_accepts_aiohttp_reads_as_one_bodiless_get(head: bytes) -> None:
    if one_plain_get(head, LINE_MAX, FIELDS_MAX):
        assert await aiohttp_reads_one_bodiless_get(head)


@pytest.mark.parametrize(
    "head",
    [
        PLAIN,
        head_of("Host: gw", "Accept-Encoding: gzip", "User-Agent: loadgen/1"),
        head_of("host: gw", "X-Request-ID: r-1", request_line="GET /expenses/%2E1 HTTP/1.1"),
        head_of("Host: gw", "Cache-Control: no-cache", "Connection: close"),
    ],
)
async def test_a_plain_get_is_accepted(head: bytes) -> None:
    assert one_plain_get(head, LINE_MAX, FIELDS_MAX)
    assert await aiohttp_reads_one_bodiless_get(head)


@pytest.mark.parametrize(
    "head",
    [
        head_of("Authorization: Bearer t"),  # no Host
        head_of("Host: gw", "HOST: gw"),
        head_of("Host: gw", "User-Agent: a", "User-Agent: b"),
        head_of("Host: gw", "Content-Length: 0"),
        head_of("Host: gw", "transfer-encoding: chunked"),
        head_of("Host: gw", "Upgrade: websocket", "Connection: upgrade"),
        head_of("Host: gw", "Expect: 100-continue"),
        head_of("Host: gw", request_line="HEAD /expenses HTTP/1.1"),
        head_of("Host: gw", request_line="GET /expenses HTTP/1.0"),
        head_of("Host: gw", request_line="GET http://gw/expenses HTTP/1.1"),
        head_of("Host: gw", "Bad Header"),
        head_of("Host: gw", "X-Odd: caf\xe9"),
        PLAIN + PLAIN,  # two heads in one read
        PLAIN[:-2],  # not whole
        head_of("Host: gw", "X-Long: " + "a" * LINE_MAX),
        head_of("Host: gw", *(f"X-{n}: v" for n in range(FIELDS_MAX + 1))),
    ],
)
def test_anything_else_is_left_to_the_checker(head: bytes) -> None:
    assert not one_plain_get(head, LINE_MAX, FIELDS_MAX)


def test_a_head_not_of_the_form_is_refused_in_time_linear_in_its_length() -> None:
    """Possessive repetition: a long run of path or value characters that the form
    refuses at its end is not tried again split another way (were it, this would not
    end in any time a test can wait)."""
    for head in (
        b"GET /" + b"a" * 20_000 + b"%2 HTTP/1.1\r\nHost: gw\r\n\r\n",
        b"GET /?" + b"a=" * 10_000 + b"\x00 HTTP/1.1\r\nHost: gw\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: gw\r\nX: " + b"a " * 10_000 + b"\x01\r\n\r\n",
    ):
        assert not one_plain_get(head, 10**6, FIELDS_MAX)

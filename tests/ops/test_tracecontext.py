"""W3C Trace Context: what the gateway takes of a caller's traceparent and tracestate,
and the ids it makes."""

from __future__ import annotations

import re

import pytest

from gateway.ops.tracecontext import (
    TraceParent,
    caller_context,
    format_traceparent,
    new_span_id,
    new_trace_id,
    parse_traceparent,
    valid_tracestate,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{PARENT}-01"


@pytest.mark.parametrize(
    ("value", "sampled"),
    [
        (VALID, True),
        (f"00-{TRACE}-{PARENT}-00", False),
        (f"00-{TRACE}-{PARENT}-09", True),  # other flags: only sampled is read
        (f"00-{TRACE}-{PARENT}-fe", False),
    ],
)
def test_a_valid_traceparent_is_read(value: str, sampled: bool) -> None:
    assert parse_traceparent(value) == TraceParent(TRACE, PARENT, sampled)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        VALID.upper(),  # upper-case hex
        f"00-{TRACE.upper()}-{PARENT}-01",
        f"00-{'0' * 32}-{PARENT}-01",  # an all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # an all-zero parent id
        f"ff-{TRACE}-{PARENT}-01",  # the version that is never valid
        f"00-{TRACE}-{PARENT}-01-",  # version 00 is exactly 55 characters
        f"00-{TRACE}-{PARENT}-01-extra",
        f"00-{TRACE}-{PARENT}-1",
        f"00-{TRACE[:-1]}-{PARENT}-01",
        f"00_{TRACE}_{PARENT}_01",
        f"0-{TRACE}-{PARENT}-01",
        f"00-{TRACE}-{PARENT}-0g",
        f" {VALID}",
        f"01-{TRACE}-{PARENT}-01x",  # a higher version: a '-' after the flags, or nothing
    ],
)
def test_an_invalid_traceparent_is_none(value: str) -> None:
    assert parse_traceparent(value) is None


@pytest.mark.parametrize(
    "value", [f"01-{TRACE}-{PARENT}-01", f"cc-{TRACE}-{PARENT}-01-what-comes-later"]
)
def test_a_higher_version_is_read_as_its_version_00_fields(value: str) -> None:
    assert parse_traceparent(value) == TraceParent(TRACE, PARENT, True)


def test_the_caller_s_context_needs_one_valid_traceparent() -> None:
    assert caller_context(None) is None
    assert caller_context([]) is None
    assert caller_context([VALID, VALID]) is None  # sent twice: which one?
    assert caller_context(["nonsense"], ["a=1"]) is None
    assert caller_context([VALID]) == TraceParent(TRACE, PARENT, True)
    assert caller_context([VALID], ["a=1"]) == TraceParent(TRACE, PARENT, True, "a=1")
    # a tracestate that is not valid is dropped; the traceparent still counts
    assert caller_context([VALID], ["A=1"]) == TraceParent(TRACE, PARENT, True)


@pytest.mark.parametrize(
    ("fields", "kept"),
    [
        (["congo=t61rcWkgMzE"], "congo=t61rcWkgMzE"),
        (["rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"], "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
        (["rojo=1 ,\t congo=2"], "rojo=1,congo=2"),
        (["rojo=1", "congo=2"], "rojo=1,congo=2"),  # two fields are one list
        (["rojo=1,,congo=2,"], "rojo=1,congo=2"),  # empty members are allowed
        (["fw529a3039@dt=ZGV2", "3@ab=x y"], "fw529a3039@dt=ZGV2,3@ab=x y"),
        ([",".join(f"k{n}=v" for n in range(32))], ",".join(f"k{n}=v" for n in range(32))),
        ([f"k={'v' * 254}", f"l={'v' * 253}"], f"k={'v' * 254},l={'v' * 253}"),  # 512
        (["", " "], None),
        (["Rojo=1"], None),  # keys are lower case
        (["rojo"], None),
        (["rojo=1,rojo=2"], None),  # a key twice
        (["rojo=a,b"], None),
        (["rojo=x="], None),
        (["rojo=a\x01b"], None),
        (["rojo=caf\xe9"], None),
        ([f"rojo={'v' * 257}"], None),
        ([",".join(f"k{n}=v" for n in range(33))], None),  # more than 32 members
        ([f"k={'v' * 254}", f"l={'v' * 254}"], None),  # more than 512 characters
    ],
)
def test_a_tracestate_is_kept_only_whole_and_within_bounds(
    fields: list[str], kept: str | None
) -> None:
    assert valid_tracestate(fields) == kept


def test_new_ids_are_lower_case_hex_and_differ() -> None:
    traces = {new_trace_id() for _ in range(1000)}
    spans = {new_span_id() for _ in range(1000)}
    assert len(traces) == len(spans) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{32}", trace) for trace in traces)
    assert all(re.fullmatch(r"[0-9a-f]{16}", span) for span in spans)


def test_a_traceparent_made_is_read_back() -> None:
    for sampled in (True, False):
        made = format_traceparent(TRACE, PARENT, sampled)
        assert parse_traceparent(made) == TraceParent(TRACE, PARENT, sampled)
    assert format_traceparent(TRACE, PARENT, True) == VALID

"""What of the upstream's ``Retry-After`` the gateway passes on to a caller.

The field is the upstream's text; a caller must not get it as sent (any length, any
characters). :func:`retry_after_of` reads it as RFC 9110 10.2.3 defines it and writes
it again: delay-seconds as a plain number of at most :data:`MAX_RETRY_AFTER_S`, an
HTTP-date (any of its three forms) as an IMF-fixdate, one that lies further ahead than
that as the same most; anything else (and two fields) is no value at all.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

MAX_RETRY_AFTER_S = 86_400
"""The longest wait passed on: a day."""

_DAYS = "Mon|Tue|Wed|Thu|Fri|Sat|Sun"
_LONG_DAYS = "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"
_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTHS = "|".join(_MONTH_NAMES)
_TIME = "(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
_DELAY = re.compile("[0-9]+")
_IMF_FIXDATE = re.compile(
    rf"(?:{_DAYS}), (?P<day>[0-9]{{2}}) (?P<month>{_MONTHS}) (?P<year>[0-9]{{4}}) {_TIME} GMT"
)
_RFC850 = re.compile(
    rf"(?:{_LONG_DAYS}), (?P<day>[0-9]{{2}})-(?P<month>{_MONTHS})-(?P<year>[0-9]{{2}}) {_TIME} GMT"
)
_ASCTIME = re.compile(
    rf"(?:{_DAYS}) (?P<month>{_MONTHS}) (?P<day>[0-9]{{2}}| [0-9]) {_TIME} (?P<year>[0-9]{{4}})"
)


def retry_after_of(fields: list[str], now: datetime) -> str | None:
    """The ``Retry-After`` to pass on for the upstream's ``fields`` of that name (None:
    none), ``now`` being the time (UTC) it answered."""
    if len(fields) != 1:
        return None
    value = fields[0].strip(" \t")
    if _DELAY.fullmatch(value):
        digits = value.lstrip("0") or "0"
        # compared as text first: int() refuses a few thousand digits
        if len(digits) > len(str(MAX_RETRY_AFTER_S)) or int(digits) > MAX_RETRY_AFTER_S:
            return str(MAX_RETRY_AFTER_S)
        return digits
    when = _http_date(value, now)
    if when is None:
        return None
    if when - now > timedelta(seconds=MAX_RETRY_AFTER_S):
        return str(MAX_RETRY_AFTER_S)
    return format_datetime(when, usegmt=True)


def _http_date(value: str, now: datetime) -> datetime | None:
    match = _IMF_FIXDATE.fullmatch(value) or _ASCTIME.fullmatch(value)
    year_of_century = False
    if match is None:
        match = _RFC850.fullmatch(value)
        year_of_century = True
    if match is None:
        return None
    year = int(match["year"])
    if year_of_century:
        # RFC 9110 5.6.7: a two-digit year more than 50 years ahead is in the past
        year += now.year - now.year % 100
        if year > now.year + 50:
            year -= 100
    try:
        return datetime(
            year,
            _MONTH_NAMES.index(match["month"]) + 1,
            int(match["day"]),
            int(match["hour"]),
            int(match["minute"]),
            int(match["second"]),
            tzinfo=UTC,
        )
    except ValueError:  # a day, hour or second the calendar does not have
        return None

"""Repeated keys in an upstream body: where the first one is.

JSON leaves an object with a repeated key to the reader, and parsers keep one of the
values (jiter and orjson the last): a body that says ``"lastBalance": "1.00"`` and
then ``"lastBalance": "999999.00"`` means nothing the gateway may publish. The parse
(gateway.normalise.normaliser.parse_lossless) tells that a key repeats; this module,
on that failure only, reads the body again to name where, as a
:class:`~gateway.normalise.coercions.CanonicalError` whose path is the JSON path of the
second occurrence (``data[2].lastBalance``), the first such in the text's order.

The detail of an upstream-contract problem never quotes what the upstream sent: a key
is named only when it is a name of the published schema; a repeated key of any other
name is reported at the object that holds it, and the path stops at the first object
reached through such a key.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.normalise.coercions import CanonicalError
from gateway.normalise.pages import ENVELOPE
from gateway.normalise.schema import CanonicalModel

REPEATED_KEY = "the key appears more than once in its object"
REPEATED_OTHER_KEY = "a key the published schema does not define appears more than once in it"
REPEATED_WITHIN = (
    "a key appears more than once in an object within a field the published schema does not define"
)
# The names a detail may show: each is the gateway's own text, whatever the body says.
PUBLISHED_NAMES = frozenset(ENVELOPE).union(
    *(model.model_fields for model in CanonicalModel.__subclasses__())
)


class _Pairs(list[tuple[str, Any]]):
    """An object of the body as read here: its members in order, repeats kept."""


def _ignore(text: str) -> None:
    return None


def repeated_key(body: bytes | str) -> CanonicalError:
    """The error naming the first repeated key of ``body``, a JSON text in which a key
    repeats; its path is ``(body)`` when the text cannot be read here."""
    try:
        document = json.loads(
            body,
            object_pairs_hook=_Pairs,
            # the values do not matter here: nothing is converted, nothing can overflow
            parse_int=_ignore,
            parse_float=_ignore,
            parse_constant=_ignore,
        )
    except (ValueError, RecursionError):
        return CanonicalError("(body)", REPEATED_WITHIN)
    found = _first(document, [])
    if found is None:
        return CanonicalError("(body)", REPEATED_WITHIN)
    path, reason = found
    error = CanonicalError(path[-1] if path else "(body)", reason)
    for part in reversed(path[:-1]):
        error.within(part)
    return error


def _first(value: Any, path: list[str | int]) -> tuple[list[str | int], str] | None:
    """The path and reason of the first repeated key in ``value``, or None."""
    if isinstance(value, _Pairs):
        seen: set[str] = set()
        for key, member in value:
            if key in seen:
                if key in PUBLISHED_NAMES:
                    return [*path, key], REPEATED_KEY
                return path, REPEATED_OTHER_KEY
            seen.add(key)
            found = _first(member, [*path, key])
            if found is not None:
                return _shown(found, path, key)
    elif isinstance(value, list):
        for index, member in enumerate(value):
            found = _first(member, [*path, index])
            if found is not None:
                return found
    return None


def _shown(
    found: tuple[list[str | int], str], path: list[str | int], key: str
) -> tuple[list[str | int], str]:
    """``found``, seen from the object at ``path`` through its member ``key``: a key
    the schema does not define is not shown, nor anything below it."""
    if key in PUBLISHED_NAMES:
        return found
    return path, REPEATED_WITHIN

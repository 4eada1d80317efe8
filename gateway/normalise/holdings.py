"""The records an answer holds, and the references that name them.

Every record of the published schema in a body is named by its kind and id
(``expense:<uuid>``, ``account:<id>``, ``client:<uuid>``, ``user:<uuid>``), embedded
records included (an expense's account, client and user), with a version: a digest
of the record's published bytes as that body holds it, but for the fields some views
leave out (:data:`VIEW_FIELDS`), versioned on their own. The cache notes them beside
each entry it stores, so that a purge by record finds every entry holding one
(docs/purging.md). A reference is never a caller's: nothing in it comes from a token.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from gateway.normalise.coercions import CANONICAL_UUID
from gateway.normalise.pages import Page, RecordModel
from gateway.normalise.schema import Account, CanonicalModel, Client, Expense, User

# the kinds of record a reference names, and the model of each
KINDS: dict[str, type[CanonicalModel]] = {
    "expense": Expense,
    "account": Account,
    "client": Client,
    "user": User,
}
_KIND_OF: dict[type[CanonicalModel], str] = {model: kind for kind, model in KINDS.items()}
# kinds whose ids are UUIDs (an account's id is the upstream's text)
_UUID_KINDS = frozenset({"expense", "client", "user"})
# the longest id a reference may carry (an account id is free text upstream); a
# longer one is not noted either
ID_MAX = 200
# the bytes of a version: 64 bits of BLAKE2b, as 16 hexadecimal digits
_VERSION_BYTES = 8
# Fields that some views of a record leave out (null) and others carry (the upstream's
# reference document): an account's bank (in lists only) and last balance (not in the
# account embedded in an expense); a client's description (embedded only). A record's
# version leaves them out, so that every view of it agrees; each is versioned on its
# own where a view carries it, under the record's reference, FIELD_SEPARATOR and its
# name: compared only between views that carry it.
VIEW_FIELDS: dict[str, tuple[str, ...]] = {
    "account": ("bank", "lastBalance"),
    "client": ("description",),
}
# between a reference and a field's name (no reference holds it: an id is printable)
FIELD_SEPARATOR = "\x1f"


class RecordRef(NamedTuple):
    """One record: its kind and its id as the published schema has it."""

    kind: str
    id: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


class BadReference(ValueError):
    """A reference that names no record: the text says why."""


def parse_ref(text: str) -> RecordRef:
    """The record ``text`` names (``<kind>:<id>``); a UUID is read in any case and
    named in its canonical lower case. Raises BadReference."""
    kind, colon, record_id = text.partition(":")
    if not colon:
        raise BadReference("must be <kind>:<id>, for example expense:<uuid>")
    if kind not in KINDS:
        raise BadReference("the kind must be one of " + ", ".join(KINDS))
    if not record_id:
        raise BadReference("the id is empty")
    if len(record_id) > ID_MAX:
        raise BadReference(f"the id is longer than {ID_MAX} characters")
    if kind in _UUID_KINDS:
        record_id = record_id.lower()
        if not CANONICAL_UUID.fullmatch(record_id):
            raise BadReference(f"{kind} ids are UUIDs")
    elif not record_id.isprintable() or "\ufffd" in record_id:
        raise BadReference(
            "an account's id is printable text (no control or invisible characters, valid UTF-8)"
        )
    return RecordRef(kind, record_id)


def version_of(record_bytes: bytes) -> str:
    """The version of a record whose published bytes are ``record_bytes``."""
    return hashlib.blake2b(record_bytes, digest_size=_VERSION_BYTES).hexdigest()


def records_held(model: RecordModel, canonical: Any, dump: Any | None) -> dict[str, str]:
    """``{reference: version}`` of every record in ``canonical`` (a canonical body of
    ``model``), embedded ones included; ``dump`` makes a record's published bytes (None:
    no versions, each ""). A record met twice keeps the version it was first met with."""
    held: dict[str, str] = {}
    records: Sequence[Any]
    if isinstance(model, type) and issubclass(model, Page):
        items = canonical.get("data") if isinstance(canonical, dict) else None
        records = items if isinstance(items, list) else ()
        plan = _plan(model.item_model)
    else:
        records, plan = (canonical,), _plan(model)
    for record in records:
        for kind, path in plan:
            found = record
            for name in path:
                found = found.get(name) if isinstance(found, dict) else None
            if not isinstance(found, dict):
                continue
            record_id = found.get("id")
            if isinstance(record_id, str) and 0 < len(record_id) <= ID_MAX:
                ref = kind + ":" + record_id
                if ref not in held:
                    held[ref] = "" if dump is None else _versions(kind, ref, found, dump, held)
    return held


@functools.cache
def _plan(model: type[CanonicalModel]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Where the records of a ``model`` record are: each kind, and the path of field
    names from the record to it (the record itself first, then what it embeds)."""
    plan: list[tuple[str, tuple[str, ...]]] = []

    def visit(current: type[CanonicalModel], path: tuple[str, ...]) -> None:
        kind = _KIND_OF.get(current)
        if kind is not None:
            plan.append((kind, path))
        for name, embedded in current._nested:
            visit(embedded, (*path, name))

    visit(model, ())
    return tuple(plan)


def _versions(kind: str, ref: str, record: dict[str, Any], dump: Any, held: dict[str, str]) -> str:
    """The version of ``record`` without the fields some views leave out; each of
    those this view carries noted in ``held`` with its own version."""
    fields = VIEW_FIELDS.get(kind)
    if not fields:
        return version_of(dump(record))
    for name in fields:
        value = record.get(name)
        if value is not None:
            held.setdefault(ref + FIELD_SEPARATOR + name, version_of(dump(value)))
    return version_of(dump({name: v for name, v in record.items() if name not in fields}))

"""The bodies of the record routes: the page envelope of the list routes (the model
each route publishes is in its declaration, gateway.routing).

``total``, ``page`` and ``limit`` come from the upstream; ``totalPages``, ``hasNext`` and
``hasPrevious`` are derived from them (see :class:`Page`). :func:`canonical_body` is the
gateway's one-pass canonicalisation of a whole body, the same rules as
the model's ``model_validate`` without building model instances.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from gateway.normalise.coercions import CanonicalError, json_type, to_boolean, to_integer
from gateway.normalise.schema import (
    Account,
    CanonicalModel,
    Client,
    Expense,
    NormaliseContext,
    User,
    canonicalise,
    canonicalise_items,
    context_of,
    pydantic_error,
)

Item = TypeVar("Item", bound=CanonicalModel)

ENVELOPE = ("data", "total", "page", "limit", "totalPages", "hasNext", "hasPrevious")
_DERIVED = ("totalPages", "hasNext", "hasPrevious")
NOT_ASKED_FOR = "not the record asked for"


class Page(BaseModel, Generic[Item]):
    """The page envelope of the list routes, keys in the reference's order.

    ``total``, ``page`` and ``limit`` come from the upstream (``page`` and ``limit``
    fall back to the request's when absent); ``data`` holds at most ``limit`` items,
    and no more than the request asked for; ``totalPages``, ``hasNext`` and
    ``hasPrevious`` are derived from them whenever the upstream omits them, sends them
    in another type, or contradicts itself.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    data: list[Item]
    total: int = Field(ge=0, description="Total number of items")
    page: int = Field(ge=1, description="Current page number")
    limit: int = Field(ge=1, description="Items per page")
    totalPages: int = Field(ge=0, description="ceil(total / limit)")
    hasNext: bool = Field(description="page < totalPages")
    hasPrevious: bool = Field(description="page > 1")

    item_model: ClassVar[type[CanonicalModel]]

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        try:
            return canonical_page(cls.item_model, data, context_of(info), nested=False)
        except CanonicalError as exc:
            raise pydantic_error(exc) from None


def canonical_page(
    item_model: type[CanonicalModel],
    data: dict[str, Any],
    context: NormaliseContext,
    *,
    nested: bool,
) -> dict[str, Any]:
    """Bring a page envelope to canonical form (items too, with ``nested``)."""
    if context.track_variants:
        for key in ENVELOPE:
            context.saw(f"Page.{key}", json_type(data[key]) if key in data else "missing")
    extras = data.keys() - set(ENVELOPE)
    if extras:
        context.coerced("Page", "extra-field-dropped")
        context.dropped.update(f"Page.{key}" for key in extras)
    items = data.get("data")
    if type(items) is not list:
        raise CanonicalError("data", f"a JSON {json_type(items)} where an array is expected")
    # before any item is looked at: a page far larger than asked for costs no more
    bound = page_bound(data.get("limit"), context.limit)
    if bound is not None and len(items) > bound:
        raise CanonicalError("data", too_many_items(len(items), bound))
    if nested:
        try:
            canonicalise_items(item_model, items, context)
        except CanonicalError as exc:
            raise exc.within("data") from None
    out: dict[str, Any] = {"data": items}
    for key in ("total", "page", "limit"):
        value = data.get(key)
        if value is None:
            fallback = None if key == "total" else getattr(context, key)
            if fallback is None:
                raise CanonicalError(key, "missing, and it cannot be derived")
            out[key] = fallback
            context.coerced(f"Page.{key}", "missing->request")
            continue
        try:
            out[key], kind = to_integer(value)
        except ValueError as exc:
            raise CanonicalError(key, str(exc)) from None
        if kind is not None:
            context.coerced(f"Page.{key}", kind)
    total, page, limit = out["total"], out["page"], out["limit"]
    if total < 0 or page < 1 or limit < 1:
        bad = "total" if total < 0 else "page" if page < 1 else "limit"
        raise CanonicalError(bad, f"{out[bad]} is out of range")
    total_pages = -(-total // limit)
    derived = {
        "totalPages": total_pages,
        "hasNext": page < total_pages,
        "hasPrevious": page > 1,
    }
    for key, expected in derived.items():
        sent = data.get(key)
        if sent is None:
            context.coerced(f"Page.{key}", "missing->derived")
        elif sent is not expected and not (
            key == "totalPages" and type(sent) is int and sent == expected
        ):
            convert = to_integer if key == "totalPages" else to_boolean
            try:
                value, kind = convert(sent)
            except ValueError:
                context.coerced(f"Page.{key}", "invalid->derived")
            else:
                if kind is not None:
                    context.coerced(f"Page.{key}", kind)
                if value != expected:
                    context.coerced(f"Page.{key}", "inconsistent->derived")
        out[key] = expected
    return out


def too_many_items(count: int, bound: int) -> str:
    """The reason a page of ``count`` items is refused."""
    return f"{count} items, more than the page's limit of {bound}"


def page_bound(sent: Any, asked: int | None) -> int | None:
    """The most items a page may hold: the request's ``limit`` (``asked``), or the
    envelope's own (``sent``) when that is a valid one and smaller; None when neither
    is known."""
    bound = asked
    if sent is not None:
        try:
            limit, _ = to_integer(sent)
        except ValueError:
            return bound  # a limit that is not one is refused later, with its reason
        if limit >= 1 and (bound is None or limit < bound):
            bound = limit
    return bound


class UserPage(Page[User]):
    """A page of users."""

    item_model = User


class ClientPage(Page[Client]):
    """A page of clients and providers."""

    item_model = Client


class ExpensePage(Page[Expense]):
    """A page of expenses."""

    item_model = Expense


class AccountPage(Page[Account]):
    """A page of accounts."""

    item_model = Account


# What a route answers with: a page of records or one record.
RecordModel = type[Page[Any]] | type[CanonicalModel]


def canonical_body(model: RecordModel, data: Any, context: NormaliseContext) -> Any:
    """The canonical form of a parsed body of ``model``, every level, in one pass.

    The same rules as ``model.model_validate`` without building
    model instances: the gateway's hot path. A page may not hold more items than its
    limit; a single record must be the one ``context.record_id`` names, when it is
    given (``CanonicalModel.is_record``). Raises CanonicalError.
    """
    if type(data) is not dict:
        raise CanonicalError("(body)", f"a JSON {json_type(data)} where an object is expected")
    if issubclass(model, Page):
        return canonical_page(model.item_model, data, context, nested=True)
    record = canonicalise(model, data, context, nested=True)
    if context.record_id is not None and not model.is_record(record, context.record_id):
        raise CanonicalError("id", NOT_ASKED_FOR)
    return record

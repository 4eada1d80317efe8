"""The published schema: User, Client, Account, Bank and Expense (the page envelope and
the model of each route are in gateway.normalise.pages).

The upstream is inconsistent (a percentage that is a number in one place and a string
in another, fields present in one representation and absent in the next, decimals as
numbers or as text). These models accept every variant and hold the canonical form,
so that ``model_dump()`` is the published body:

- every field of the reference is present; what the upstream did not send is null,
  except each record's ``id``, which is never null: a record without one breaks the
  contract (the answer is a 502 upstream-contract naming it);
- decimal quantities are strings in plain notation, padded to the scale of the
  reference's samples and never rounded; they arrive as ``Decimal`` (the JSON is
  parsed losslessly) or as numeric text, and never pass through ``float``;
- ``Client.taxRetentionPercentage`` is a JSON number, ``Bank.country`` an integer;
- UUIDs are lower-case canonical; dates ``YYYY-MM-DD``; ``paidAt`` UTC with ``Z``;
- enumerations are upper case; an unknown value passes through, counted;
- fields the reference does not define are dropped; text is never altered.

Each model does its coercions in one ``before`` validator, which records every
coercion it performs in the :class:`NormaliseContext` passed as validation context.
A value that cannot be brought to its canonical type raises a ``PydanticCustomError``
of type ``canonical`` whose context names the field, so the error path is exact.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Annotated, Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from gateway.normalise.coercions import (
    CANONICAL_UUID,
    DATE_PATTERN,
    INSTANT_PATTERN,
    KNOWN_DATES,
    REQUIRED_REASON,
    UUID_PATTERN,
    CanonicalError,
    Coercion,
    DecimalCheck,
    FastCheck,
    decimal_pattern,
    enumeration,
    is_canonical_instant,
    is_known_date,
    json_type,
    scaled_decimal,
    text_list,
    to_date,
    to_instant,
    to_integer,
    to_number,
    to_uuid,
)
from gateway.normalise.rules import compiled, compiled_available, compiled_in_use

SCHEMA_VERSION = "1.0.0"

# Known values of the enumerations. Client, Account and Expense types are closed in
# the reference; it shows only PAID and ADMIN for status and role, and the other
# values are those the reference upstream uses (docs/reference-upstream.md).
CLIENT_TYPES = frozenset({"CLIENT", "PROVIDER"})
ACCOUNT_TYPES = frozenset({"CASH", "BANK"})
EXPENSE_STATUSES = frozenset({"PAID", "PENDING", "CANCELLED"})
USER_ROLES = frozenset({"ADMIN", "ACCOUNTANT", "VIEWER"})


@dataclass(slots=True)
class NormaliseContext:
    """What one normalisation saw and did.

    ``coercions`` counts (field, kind) such as ("Client.taxRetentionPercentage",
    "string->number"). ``unknown_values`` and ``dropped`` keep names and values for the
    logs and the probe; ``variants`` (only with ``track_variants``) counts the JSON type
    of every value seen, by field, for the probe's report. ``page`` and ``limit`` are the
    request's, used when the upstream's envelope leaves them out (and ``limit`` bounds
    the items of a page); ``record_id`` is the id a single-record request asked for,
    which the record must answer to.
    """

    page: int | None = None
    limit: int | None = None
    record_id: str | None = None
    track_variants: bool = False
    coercions: Counter[tuple[str, str]] = field(default_factory=Counter)
    unknown_values: set[tuple[str, str]] = field(default_factory=set)
    dropped: set[str] = field(default_factory=set)
    variants: dict[str, Counter[str]] = field(default_factory=dict)

    def coerced(self, name: str, kind: str) -> None:
        self.coercions[(name, kind)] += 1

    def saw(self, name: str, variant: str) -> None:
        self.variants.setdefault(name, Counter())[variant] += 1


class _Step(NamedTuple):
    """How one field with a rule is brought to canonical form."""

    name: str
    qualified: str  # "Expense.amount"
    fast: FastCheck | None  # true for a string already canonical
    coerce: Coercion


def context_of(info: ValidationInfo) -> NormaliseContext:
    context = info.context
    return context if isinstance(context, NormaliseContext) else NormaliseContext()


def pydantic_error(exc: CanonicalError) -> PydanticCustomError:
    return PydanticCustomError(
        "canonical",
        "{field}: {reason}",
        {"field": ".".join(map(str, exc.path)), "reason": exc.reason},
    )


def _nullable(kind: str, description: str, **schema: Any) -> Any:
    """A field that is always present and may be null, with its published schema."""
    return Field(
        default=None, description=description, json_schema_extra={"x-canonical": kind, **schema}
    )


def _required(kind: str, description: str, **schema: Any) -> Any:
    """A field that is always present and never null (every record's id): a record
    without it breaks the contract, and the whole answer is a 502 upstream-contract."""
    return Field(description=description, json_schema_extra={"x-canonical": kind, **schema})


class CanonicalModel(BaseModel):
    """A record of the published schema: every field present, coerced in one pass.

    ``_rules`` maps a field to (fast check, coercion); a field without a rule is text
    (a string, kept as it is) or, when its annotation is a CanonicalModel, an embedded
    record. :func:`canonicalise` applies the rules to a parsed dict in place; the
    ``before`` validator runs it, so that ``model_validate`` accepts every variant.
    """

    model_config = ConfigDict(extra="ignore", frozen=True, validate_default=False)

    _rules: ClassVar[dict[str, tuple[FastCheck | None, Coercion]]] = {}
    _derived: ClassVar[frozenset[str]] = frozenset()
    _required: ClassVar[tuple[str, ...]] = ()
    _embedded: ClassVar[dict[str, str]] = {}
    _order: ClassVar[tuple[str, ...]] = ()
    _names: ClassVar[frozenset[str]] = frozenset()
    _qualified: ClassVar[dict[str, str]] = {}
    _texts: ClassVar[tuple[str, ...]] = ()
    _steps: ClassVar[tuple[_Step, ...]] = ()
    _nested: ClassVar[tuple[tuple[str, type[CanonicalModel]], ...]] = ()
    _plan: ClassVar[compiled.Plan | None] = None  # made by compiled_plan, on first use

    @classmethod
    def _prepare(cls, embedded: dict[str, type[CanonicalModel]]) -> None:
        cls._order = tuple(cls.model_fields)
        cls._required = tuple(n for n, f in cls.model_fields.items() if f.is_required())
        cls._names = frozenset(cls._order)
        cls._qualified = {name: f"{cls.__name__}.{name}" for name in cls._order}
        cls._texts = tuple(n for n in cls._order if n not in cls._rules and n not in embedded)
        cls._steps = tuple(
            _Step(name, cls._qualified[name], *cls._rules[name])
            for name in cls._order
            if name in cls._rules
        )
        cls._nested = tuple(embedded.items())
        cls._plan = None

    @classmethod
    def _complete(
        cls, values: dict[str, Any], context: NormaliseContext, missing: frozenset[str]
    ) -> dict[str, Any]:
        """Fill what one field implies about another (Account: bankCode from bank.code).

        ``missing`` names the fields of ``_derived`` that the upstream left out; their
        "missing->null" is counted here, where it is known whether they stay null.
        Only null fields of ``_derived`` are filled: when none is null this must do
        nothing, and the compiled canonicaliser does not call it then.
        """
        return values

    @classmethod
    def is_record(cls, record: dict[str, Any], asked: str) -> bool:
        """Whether ``record``, canonical, is the one a request for the id ``asked``
        names: its id is ``asked``, compared as the upstream compares its ids."""
        return bool(record["id"] == asked)

    @model_validator(mode="before")
    @classmethod
    def _canonical(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        try:
            return canonicalise(cls, dict(data), context_of(info), nested=False)
        except CanonicalError as exc:
            raise pydantic_error(exc) from None


def compiled_plan(model: type[CanonicalModel]) -> compiled.Plan:
    """The compiled canonicaliser's form of ``model``'s rules, with those of its embedded
    records; made on first use, so that a process running the Python rules never needs
    the compiled module. RuntimeError when it was not built."""
    plan = model._plan
    if plan is None:
        if not compiled_available():
            raise RuntimeError(
                "the compiled canonicaliser (gateway.normalise.compiled) was not built"
            )
        plan = compiled.Plan(
            model.__name__,
            model._order,
            tuple(model._qualified[name] for name in model._order),
            model._derived,
            model._required,
            model._texts,
            tuple(_compiled_step(step) for step in model._steps),
            tuple((name, compiled_plan(embedded)) for name, embedded in model._nested),
            model._complete if "_complete" in vars(model) else None,
        )
        model._plan = plan
    return plan


def _compiled_step(step: _Step) -> compiled.Step:
    """The compiled canonicaliser's form of a step: its check said as one of the checks
    written in C where there is one, else the Python check, called from C."""
    fast = step.fast
    argument: Any = None
    check, scale, max_scale = compiled.CHECK_CALL, 0, 0
    if step.coerce is text_list:
        check = compiled.CHECK_TEXT_LIST
    elif fast is None:
        check = compiled.CHECK_NONE
    elif fast == CANONICAL_UUID.fullmatch:
        check = compiled.CHECK_UUID
    elif fast is is_canonical_instant:
        check = compiled.CHECK_INSTANT
    elif fast is is_known_date:
        check, argument = compiled.CHECK_MEMBER, KNOWN_DATES
    elif isinstance(fast, DecimalCheck):
        check, scale, max_scale = compiled.CHECK_DECIMAL, fast.scale, fast.max_scale
    elif isinstance(owner := getattr(fast, "__self__", None), frozenset):  # known.__contains__
        check, argument = compiled.CHECK_MEMBER, owner
    else:
        argument = fast
    return compiled.Step(step.name, step.qualified, check, argument, step.coerce, scale, max_scale)


def canonicalise(
    model: type[CanonicalModel], data: dict[str, Any], context: NormaliseContext, *, nested: bool
) -> dict[str, Any]:
    """Bring one parsed record to canonical form, in place where it can; returns it.

    With ``nested`` the embedded records are canonicalised too (the gateway's path),
    by the compiled canonicaliser when it is the one in use (gateway.normalise.rules)
    and the probe is not tracking variants (which only the Python rules do); without,
    they are left to pydantic, which validates them with their own model. Raises
    CanonicalError locating the first value that cannot be made canonical.
    """
    if nested and not context.track_variants and compiled_in_use():
        return compiled.canonicalise(compiled_plan(model), data, context)
    return canonicalise_python(model, data, context, nested=nested)


def canonicalise_items(
    model: type[CanonicalModel], items: list[Any], context: NormaliseContext
) -> None:
    """:func:`canonicalise` (``nested``) each record of a list, in place; a
    CanonicalError's path starts with the record's index."""
    if not context.track_variants and compiled_in_use():
        compiled.canonicalise_items(compiled_plan(model), items, context)
        return
    for index, item in enumerate(items):
        if type(item) is not dict:
            raise CanonicalError(index, f"a JSON {json_type(item)} where an object is expected")
        try:
            items[index] = canonicalise_python(model, item, context, nested=True)
        except CanonicalError as exc:
            raise exc.within(index) from None


def canonicalise_python(
    model: type[CanonicalModel], data: dict[str, Any], context: NormaliseContext, *, nested: bool
) -> dict[str, Any]:
    """:func:`canonicalise` in Python: the rules as written, the reference that the
    compiled canonicaliser is held to (tests/normalise/test_compiled.py)."""
    if context.track_variants:
        for name, qualified in model._qualified.items():
            context.saw(qualified, json_type(data[name]) if name in data else "missing")
    missing: frozenset[str] = frozenset()
    if tuple(data) != model._order:
        data, missing = _reshape(model, data, context)
    for name in model._required:
        if data[name] is None:
            raise CanonicalError(name, REQUIRED_REASON)
    for name in model._texts:
        value = data[name]
        if value is not None and type(value) is not str:
            raise CanonicalError(name, f"a JSON {json_type(value)} where text is expected")
    coercions = context.coercions
    for name, qualified, fast, coerce in model._steps:
        value = data[name]
        if value is None or (fast is not None and type(value) is str and fast(value)):
            continue
        try:
            canonical, kind = coerce(value)
        except ValueError as exc:
            raise CanonicalError(name, str(exc)) from None
        if kind is not None:
            if kind == "unknown-value":
                context.unknown_values.add((qualified, canonical))
            coercions[(qualified, kind)] += 1
        data[name] = canonical
    for name, embedded in model._nested:
        value = data[name]
        if value is None:
            continue
        if type(value) is not dict:
            raise CanonicalError(name, f"a JSON {json_type(value)} where an object is expected")
        if nested:
            try:
                data[name] = canonicalise_python(embedded, value, context, nested=True)
            except CanonicalError as exc:
                raise exc.within(name) from None
    return model._complete(data, context, missing)


def _reshape(
    model: type[CanonicalModel], data: dict[str, Any], context: NormaliseContext
) -> tuple[dict[str, Any], frozenset[str]]:
    """Every field, in the reference's order; missing ones null, unknown ones dropped.

    Also returns the missing fields that the model may derive (counted by _complete)."""
    name = model.__name__
    for key in data.keys() - model._names:
        context.coerced(name, "extra-field-dropped")
        context.dropped.add(f"{name}.{key}")
    shaped: dict[str, Any] = {}
    derived: list[str] = []
    for key, qualified in model._qualified.items():
        if key in data:
            shaped[key] = data[key]
        else:
            shaped[key] = None
            if key in model._derived:
                derived.append(key)
            else:
                context.coerced(qualified, "missing->null")
    return shaped, frozenset(derived)


def _enum_rule(known: frozenset[str]) -> tuple[FastCheck, Coercion]:
    return known.__contains__, enumeration(known)


_UUID_RULE: tuple[FastCheck, Coercion] = (CANONICAL_UUID.fullmatch, to_uuid)


def published_pattern(pattern: str) -> str:
    """A canonical form of gateway.normalise.coercions as a JSON Schema ``pattern``, which
    matches anywhere unless anchored."""
    return f"^{pattern}$"


# The published patterns are the checks' own (gateway.normalise.coercions); a decimal's
# without the bounds of its quick check, which a longer canonical decimal exceeds.
_DECIMAL_4 = published_pattern(decimal_pattern(4))
_DECIMAL_2 = published_pattern(decimal_pattern(2))
_UUID = published_pattern(UUID_PATTERN)
_DATE = published_pattern(DATE_PATTERN)
_INSTANT = published_pattern(INSTANT_PATTERN)


class User(CanonicalModel):
    """A user of the organisation."""

    id: str = _required("uuid", "UUID, lower-case canonical form", pattern=_UUID)
    username: str | None = _nullable("text", "Login name")
    mail: str | None = _nullable("text", "E-mail address")
    role: str | None = _nullable("enum", "Upper case; known: " + ", ".join(sorted(USER_ROLES)))
    phone: str | None = _nullable("text", "Telephone number")
    accounts: list[str] | None = _nullable("text[]", "Names of the accounts the user can access")

    _rules: ClassVar[dict[str, tuple[FastCheck | None, Coercion]]] = {
        "id": _UUID_RULE,
        "role": _enum_rule(USER_ROLES),
        "accounts": (None, text_list),
    }


Percentage = Annotated[
    Decimal | None,
    WithJsonSchema({"type": ["number", "null"]}),
]


class Client(CanonicalModel):
    """A client or provider."""

    id: str = _required("uuid", "UUID, lower-case canonical form", pattern=_UUID)
    name: str | None = _nullable("text", "Name")
    description: str | None = _nullable(
        "text", "Description; null where the upstream leaves it out (the client list)"
    )
    vatNumber: str | None = _nullable("text", "VAT number")
    type: str | None = _nullable("enum", "CLIENT or PROVIDER (upper case)")
    taxRetentionPercentage: Percentage = _nullable(
        "number", "Tax retention percentage, a JSON number whatever form the upstream sent"
    )

    _rules: ClassVar[dict[str, tuple[FastCheck | None, Coercion]]] = {
        "id": _UUID_RULE,
        "type": _enum_rule(CLIENT_TYPES),
        "taxRetentionPercentage": (None, to_number),
    }


class Bank(CanonicalModel):
    """The bank of a bank account."""

    name: str | None = _nullable("text", "Bank name")
    country: int | None = _nullable("integer", "Numeric country identifier")
    code: str | None = _nullable("text", "Bank code")
    swiftCode: str | None = _nullable("text", "SWIFT code; may be null")

    _rules: ClassVar[dict[str, tuple[FastCheck | None, Coercion]]] = {"country": (None, to_integer)}


class Account(CanonicalModel):
    """A cash or bank account."""

    id: str = _required("text", "Account id as the upstream sent it (not a UUID)")
    name: str | None = _nullable("text", "Name")
    accountNumber: str | None = _nullable("text", "Account number")
    description: str | None = _nullable("text", "Description")
    type: str | None = _nullable("enum", "CASH or BANK (upper case)")
    bank: Bank | None = _nullable("object", "The bank; null where the upstream sent only bankCode")
    bankCode: str | None = _nullable(
        "text", "Bank code; filled from bank.code when the upstream sent only the bank"
    )
    liquidityThreshold: str | None = _nullable(
        "decimal", "Decimal as text, at least 2 decimals", pattern=_DECIMAL_2
    )
    lastBalance: str | None = _nullable(
        "decimal",
        "Decimal as text, at least 4 decimals; null where the upstream leaves it out"
        " (the account embedded in an expense)",
        pattern=_DECIMAL_4,
    )

    _rules: ClassVar[dict[str, tuple[FastCheck | None, Coercion]]] = {
        "type": _enum_rule(ACCOUNT_TYPES),
        "liquidityThreshold": scaled_decimal(2),
        "lastBalance": scaled_decimal(4),
    }

    _derived: ClassVar[frozenset[str]] = frozenset({"bankCode"})

    @classmethod
    def is_record(cls, record: dict[str, Any], asked: str) -> bool:
        """The upstream takes an account's id or its name in the path, either in any
        case (docs/reference-upstream.md): the record is the one asked for when one of
        them is ``asked``, compared without case."""
        folded = asked.casefold()
        return any(
            type(value) is str and value.casefold() == folded
            for value in (record["id"], record["name"])
        )

    @classmethod
    def _complete(
        cls, values: dict[str, Any], context: NormaliseContext, missing: frozenset[str]
    ) -> dict[str, Any]:
        bank = values.get("bank")
        code = bank.get("code") if isinstance(bank, dict) else None
        if values.get("bankCode") is None and isinstance(code, str):
            values["bankCode"] = code
            context.coerced("Account.bankCode", "filled-from-bank.code")
        elif "bankCode" in missing:
            context.coerced("Account.bankCode", "missing->null")
        return values


class Expense(CanonicalModel):
    """An expense, with its account, client and user."""

    id: str = _required("uuid", "UUID, lower-case canonical form", pattern=_UUID)
    paymentId: str | None = _nullable("text", "Payment identifier")
    currencyCode: str | None = _nullable("text", "Three-letter currency code")
    amount: str | None = _nullable(
        "decimal", "Decimal as text, at least 4 decimals, never rounded", pattern=_DECIMAL_4
    )
    paidAt: str | None = _nullable(
        "instant", "ISO 8601 in UTC with Z; milliseconds when present", pattern=_INSTANT
    )
    method: str | None = _nullable("text", "Payment method")
    description: str | None = _nullable("text", "Description")
    category: str | None = _nullable("text", "Category")
    issueDate: str | None = _nullable("date", "YYYY-MM-DD", pattern=_DATE)
    dueDate: str | None = _nullable("date", "YYYY-MM-DD", pattern=_DATE)
    type: str | None = _nullable("enum", "CASH or BANK (upper case)")
    status: str | None = _nullable(
        "enum", "Upper case; known: " + ", ".join(sorted(EXPENSE_STATUSES))
    )
    account: Account | None = _nullable("object", "The account")
    client: Client | None = _nullable("object", "The client or provider")
    user: User | None = _nullable("object", "The user")

    @classmethod
    def is_record(cls, record: dict[str, Any], asked: str) -> bool:
        """An expense's id is a UUID, the same in any case or spelling that names it:
        compared in canonical form."""
        try:
            canonical, _ = to_uuid(asked)
        except ValueError:
            return False
        return bool(record["id"] == canonical)

    _rules: ClassVar[dict[str, tuple[FastCheck | None, Coercion]]] = {
        "id": _UUID_RULE,
        "amount": scaled_decimal(4),
        "paidAt": (is_canonical_instant, to_instant),
        "issueDate": (is_known_date, to_date),
        "dueDate": (is_known_date, to_date),
        "type": _enum_rule(ACCOUNT_TYPES),
        "status": _enum_rule(EXPENSE_STATUSES),
    }


User._prepare({})
Client._prepare({})
Bank._prepare({})
Account._prepare({"bank": Bank})
Expense._prepare({"account": Account, "client": Client, "user": User})

"""Validation of record requests: every rule, its message, and the canonical form."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config.settings import UpstreamSettings
from gateway.errors import InvalidParameters
from gateway.records.routes import QueryMemo, RecordQuery, encode_segment, parse_record_query
from gateway.routing.routes import Route
from gateway.routing.standard import ACCOUNT, ACCOUNTS, EXPENSE, EXPENSES, MAX_PAGE, USERS


def parse(
    route: Route, query: list[tuple[str, str]], path: str | None = None, max_limit: int = 100
) -> RecordQuery:
    return parse_record_query(route, path, query, max_limit=max_limit)


def problems_of(
    route: Route, query: list[tuple[str, str]], path: str | None = None
) -> dict[str, str]:
    with pytest.raises(InvalidParameters) as caught:
        parse(route, query, path)
    return {p.parameter: p.message for p in caught.value.problems}


def test_defaults_are_filled_and_order_is_fixed() -> None:
    assert parse(USERS, []).params == (("page", "1"), ("limit", "10"))
    same = [parse(USERS, q).canonical() for q in ([], [("page", "1")], [("limit", "10")])]
    assert same == ["users||page=1&limit=10"] * 3
    reordered = parse(EXPENSES, [("type", "bank"), ("limit", "5"), ("concept", "taxi")])
    assert reordered.params == (
        ("page", "1"),
        ("limit", "5"),
        ("concept", "taxi"),
        ("type", "BANK"),
    )


@pytest.mark.parametrize("value", ["0", "-1", "abc", "", "1.5", "١", "99999999999", "1000000000"])
def test_page_must_be_a_positive_integer(value: str) -> None:
    assert problems_of(USERS, [("page", value)]) == {
        "page": f"must be an integer from 1 to {MAX_PAGE}"
    }


@pytest.mark.parametrize("value", ["0", "101", "x", ""])
def test_limit_is_bounded_by_max_limit(value: str) -> None:
    assert problems_of(USERS, [("limit", value)]) == {"limit": "must be an integer from 1 to 100"}


def test_limit_bound_follows_settings() -> None:
    assert parse(USERS, [("limit", "500")], max_limit=500).params[1] == ("limit", "500")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2024-02-30", "is not a real calendar date"),
        ("2023-02-29", "is not a real calendar date"),
        ("2024-13-01", "is not a real calendar date"),
        ("2024-1-01", "must be a date in the form YYYY-MM-DD"),
        ("01/02/2024", "must be a date in the form YYYY-MM-DD"),
        ("", "must be a date in the form YYYY-MM-DD"),
    ],
)
def test_dates_must_be_real_calendar_dates(value: str, message: str) -> None:
    assert problems_of(EXPENSES, [("dateTo", value)]) == {"dateTo": message}


def test_leap_day_is_a_date() -> None:
    assert ("dateFrom", "2024-02-29") in parse(EXPENSES, [("dateFrom", "2024-02-29")]).params


def test_date_from_after_date_to() -> None:
    problems = problems_of(EXPENSES, [("dateFrom", "2024-03-02"), ("dateTo", "2024-03-01")])
    assert problems == {"dateFrom": "must not be after dateTo"}
    same_day = parse(EXPENSES, [("dateFrom", "2024-03-01"), ("dateTo", "2024-03-01")])
    assert ("dateTo", "2024-03-01") in same_day.params


@pytest.mark.parametrize(
    ("value", "canonical"),
    [("12.50", "12.5"), ("100", "100"), ("1E2", "100"), ("-0.0", "0"), (".5", "0.5")],
)
def test_amount_is_a_finite_decimal(value: str, canonical: str) -> None:
    assert ("amount", canonical) in parse(EXPENSES, [("amount", value)]).params


@pytest.mark.parametrize("value", ["NaN", "inf", "-Infinity", "1,000", "12.5.1", "", "1e999999"])
def test_amount_rejects_what_is_not_a_finite_number(value: str) -> None:
    assert problems_of(EXPENSES, [("amount", value)]) == {
        "amount": "must be a finite decimal number such as 12.50"
    }


@pytest.mark.parametrize("value", ["1e999", "1E40", ".1e-39", "1" * 41, "-0.00" + "1" * 39])
def test_amount_too_long_once_written_out_is_refused_for_its_length(value: str) -> None:
    """A number the document's pattern takes, refused for what its description says:
    more than 40 digits once written out (not for not being a number).

    Held for docs/openapi.md, "What a fuzzer finds".
    """
    assert problems_of(EXPENSES, [("amount", value)]) == {
        "amount": "must have at most 40 digits once written out"
    }
    assert ("amount", "1" + "0" * 39) in parse(EXPENSES, [("amount", "1E39")]).params


def test_type_any_case_in_upper_case_out() -> None:
    assert ("type", "CASH") in parse(ACCOUNTS, [("type", "cAsh")]).params
    assert problems_of(ACCOUNTS, [("type", "CARD")]) == {"type": "must be CASH or BANK"}


@pytest.mark.parametrize("name", ["concept", "account", "status", "user"])
def test_text_filters(name: str) -> None:
    assert problems_of(EXPENSES, [(name, "")]) == {name: "must not be empty"}
    assert problems_of(EXPENSES, [(name, "x" * 201)]) == {name: "must be at most 200 characters"}
    assert problems_of(EXPENSES, [(name, "a\x00b")]) == {
        name: "must not contain control characters"
    }
    assert (name, "Café ñ 200") in parse(EXPENSES, [(name, "Café ñ 200")]).params


def test_bank_code_is_validated_and_renamed_upstream() -> None:
    assert problems_of(ACCOUNTS, [("bankCode", "\x1b[31m")]) == {
        "bankCode": "must not contain control characters"
    }
    query = parse(ACCOUNTS, [("bankCode", "007")])
    names = UpstreamSettings(base_url="http://upstream", bank_code_param="bank_code").param_names
    assert query.upstream_params(names) == [
        ("page", "1"),
        ("limit", "10"),
        ("bank_code", "007"),
    ]


def test_unknown_and_repeated_parameters_are_named_with_the_allowed_list() -> None:
    problems = problems_of(USERS, [("page", "1"), ("page", "2"), ("sort", "name")])
    assert problems == {
        "page": "given more than once; allowed once each: page, limit",
        "sort": "unknown query parameter; allowed: page, limit",
    }
    assert problems_of(EXPENSE, [("page", "1")], "3f2c1a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f") == {
        "page": "unknown query parameter; allowed: none"
    }


def test_every_bad_parameter_is_reported_at_once() -> None:
    problems = problems_of(
        EXPENSES, [("page", "0"), ("limit", "x"), ("amount", "abc"), ("type", "card")]
    )
    assert set(problems) == {"page", "limit", "amount", "type"}


def test_expense_id_is_a_uuid_sent_in_canonical_lower_case() -> None:
    query = parse(EXPENSE, [], "3F2C1A9E-8B7D-4C6E-9F10-2A3B4C5D6E7F")
    assert query.upstream_path() == "/expenses/3f2c1a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f"
    assert parse(EXPENSE, [], "3f2c1a9e8b7d4c6e9f102a3b4c5d6e7f").path_value == (
        "3f2c1a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f"
    )
    for bad in ("not-a-uuid", "3f2c1a9e-8b7d-4c6e-9f10-2a3b4c5d6e7", "../users"):
        assert set(problems_of(EXPENSE, [], bad)) == {"expenseId"}


@pytest.mark.parametrize(
    ("account_id", "path"),
    [
        ("Caja chica Bogotá", "/accounts/Caja%20chica%20Bogot%C3%A1"),
        ("Tesorería EUR/USD", "/accounts/Tesorer%C3%ADa%20EUR%2FUSD"),
        ("a/../b", "/accounts/a%2F..%2Fb"),
        ("..", "/accounts/%2E%2E"),
        (".", "/accounts/%2E"),
        ("x?y=1#z", "/accounts/x%3Fy%3D1%23z"),
        ("ACC-001", "/accounts/ACC-001"),
    ],
)
def test_account_id_is_one_encoded_segment(account_id: str, path: str) -> None:
    assert parse(ACCOUNT, [], account_id).upstream_path() == path


def test_account_id_rules() -> None:
    assert problems_of(ACCOUNT, [], "") == {"accountId": "must not be empty"}
    assert problems_of(ACCOUNT, [], "a" * 201) == {"accountId": "must be at most 200 characters"}
    assert problems_of(ACCOUNT, [], "a\nb") == {"accountId": "must not contain control characters"}


@given(st.text(min_size=1, max_size=200).filter(lambda s: s.strip(".") != ""))
def test_any_account_id_stays_in_one_segment(value: str) -> None:
    encoded = encode_segment(value)
    assert "/" not in encoded
    assert "?" not in encoded
    assert "#" not in encoded
    from urllib.parse import unquote

    assert unquote(encoded) == value


def test_default_limit_never_exceeds_max_limit() -> None:
    assert parse(USERS, [], max_limit=5).params == (("page", "1"), ("limit", "5"))


@pytest.mark.parametrize(
    "value",
    ["99999999999999999999999999999", "12345678901234567890.123456789012"],
)
def test_amount_is_never_rounded_on_its_way_upstream(value: str) -> None:
    assert ("amount", value) in parse(EXPENSES, [("amount", value)]).params


@pytest.mark.parametrize(("name", "value"), [("concept", "20\ufffd"), ("user", "\ufffd")])
def test_text_that_was_not_valid_percent_encoded_utf8_is_refused(name: str, value: str) -> None:
    assert problems_of(EXPENSES, [(name, value)]) == {
        name: "is not valid UTF-8 once percent-decoded"
    }


def test_an_account_id_that_was_not_valid_utf8_is_refused() -> None:
    assert problems_of(ACCOUNT, [], "caja\ufffd") == {
        "accountId": "is not valid UTF-8 once percent-decoded"
    }


def test_the_query_memo_forgets_its_oldest_query_past_its_size() -> None:
    """The memo of validated queries keeps the last ``size`` (4,096 by default, the
    docs/caching.md's figure) and forgets the oldest first, never all at once."""
    assert QueryMemo().size == 4096
    memo = QueryMemo(size=3)
    queries = [f"limit={n}" for n in range(1, 6)]
    for query in queries:
        pairs = [("limit", query.partition("=")[2])]
        memo.parse(EXPENSES, None, query, pairs.copy, max_limit=100)
    assert len(memo) == 3
    remembered = [q for q in queries if memo.known(EXPENSES, None, q, 100) is not None]
    assert remembered == queries[2:]
    known = memo.known(EXPENSES, None, "limit=5", 100)
    assert known is not None
    assert dict(known.params)["limit"] == "5"

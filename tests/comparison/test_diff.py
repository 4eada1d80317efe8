"""The field-by-field comparison of two answers, on bodies of the reference upstream's
shape; and the tally's arithmetic."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.comparison.diff import (
    OTHER_FIELD,
    STATUS_FIELD,
    Answer,
    Difference,
    NotComparable,
    answer_of,
    compare,
    field_label,
    schema_fields,
)
from gateway.comparison.tally import EXAMPLES_KEPT, Tally
from gateway.demo.dataset import generate_dataset
from gateway.demo.representations import expense_json
from gateway.routing.standard import ROUTES

IDS = [f"0b9f0f1e-1111-4a4a-9a9a-{n:012d}" for n in range(1, 6)]


def expense(n: int, **fields: Any) -> dict[str, Any]:
    return {
        "id": IDS[n],
        "amount": "17385.6800",
        "status": "PAID",
        "paymentId": f"pay-{n}",
        "account": {"id": "cash", "type": "CASH", "bank": {"code": "B1", "country": 34}},
        **fields,
    }


def page(*items: dict[str, Any], total: int | None = None) -> dict[str, Any]:
    return {"data": list(items), "total": len(items) if total is None else total, "page": 1}


def answer(route: str, body: dict[str, Any]) -> Answer:
    return answer_of(ROUTES.route(route), 200, orjson.dumps(body), {"limit": "10"})


def diff(route: str, mine: dict[str, Any], theirs: dict[str, Any]) -> list[tuple[str, str]]:
    declared = ROUTES.route(route)
    return [
        (d.field, d.kind) for d in compare(declared, answer(route, mine), answer(route, theirs))
    ]


def test_the_same_answer_has_no_difference() -> None:
    body = page(expense(0), expense(1))
    assert diff("expenses", body, copy.deepcopy(body)) == []


def test_an_amount_in_whole_units_is_a_value_difference_shown_as_published() -> None:
    differences = compare(
        ROUTES.route("expenses"),
        answer("expenses", page(expense(0))),
        answer("expenses", page(expense(0, amount="17386"))),
    )
    assert differences == [Difference("data[].amount", "value", "17385.6800", "17386.0000")]


def test_the_same_items_in_another_order_are_one_order_difference() -> None:
    assert diff("expenses", page(expense(0), expense(1)), page(expense(1), expense(0))) == [
        ("data", "order")
    ]


def test_an_order_difference_shows_the_ids_from_where_the_orders_part() -> None:
    mine = page(*(expense(n) for n in range(5)))
    theirs = page(expense(0), expense(1), expense(3), expense(2), expense(4))
    differences = compare(
        ROUTES.route("expenses"), answer("expenses", mine), answer("expenses", theirs)
    )
    assert differences == [Difference("data", "order", IDS[2:], [IDS[3], IDS[2], IDS[4]])]


def test_an_item_left_out_is_a_length_difference_and_a_missing_item_not_every_later_one() -> None:
    mine = page(expense(0), expense(1), expense(2))
    theirs = page(expense(0), expense(2), total=3)
    differences = compare(
        ROUTES.route("expenses"), answer("expenses", mine), answer("expenses", theirs)
    )
    assert differences == [
        Difference("data", "length", 3, 2),
        Difference("data[]", "missing", IDS[1], None),
    ]


def test_an_item_added_is_extra() -> None:
    assert diff("expenses", page(expense(0), total=2), page(expense(0), expense(1))) == [
        ("data", "length"),
        ("data[]", "extra"),
    ]


def test_a_dropped_bank_is_missing_with_the_bank_code_the_schema_derives_from_it() -> None:
    dropped = expense(0)
    dropped["account"] = {"id": "cash", "type": "CASH"}
    assert diff("expenses", page(expense(0)), page(dropped)) == [
        ("data[].account.bank", "missing"),
        ("data[].account.bankCode", "missing"),
    ]


def test_a_value_where_the_primary_has_none_is_extra() -> None:
    assert diff("expense", expense(0, method=None), expense(0, method="card")) == [
        ("method", "extra")
    ]


def test_an_enumeration_spelt_otherwise_is_a_value_difference_with_the_values_as_sent() -> None:
    differences = compare(
        ROUTES.route("expense"),
        answer("expense", expense(0)),
        answer("expense", expense(0, status="paid")),
    )
    assert differences == [Difference("status", "value", "PAID", "paid")]


def test_another_json_type_is_a_type_difference() -> None:
    # the published schema fixes every field's type, so only a body outside it (which
    # answer_of refuses) could differ in type; the comparison itself still says so
    with pytest.raises(NotComparable, match="accountNumber"):
        answer("account", {"id": "a", "name": "Caja", "accountNumber": 12})
    mine = Answer(200, {}, {"total": 3, "data": []})
    theirs = Answer(200, {}, {"total": "3", "data": {}})
    assert [(d.field, d.kind) for d in compare(ROUTES.route("accounts"), mine, theirs)] == [
        ("total", "type"),
        ("data", "type"),
    ]


def test_lists_without_ids_are_compared_by_position() -> None:
    user = {"id": IDS[0], "username": "ana", "accounts": ["a", "b"]}
    assert diff("users", page(user), page({**user, "accounts": ["b", "a"]})) == [
        ("data[].accounts", "order")
    ]
    assert diff("users", page(user), page({**user, "accounts": ["a", "c"]})) == [
        ("data[].accounts[]", "value")
    ]
    assert diff("users", page(user), page({**user, "accounts": ["a"]})) == [
        ("data[].accounts", "length")
    ]


def test_statuses_are_compared_first() -> None:
    ok = answer("account", {"id": "a", "name": "Caja"})
    assert compare(ROUTES.route("account"), ok, Answer(404)) == [
        Difference(STATUS_FIELD, "value", 200, 404)
    ]
    assert compare(ROUTES.route("account"), Answer(404), Answer(404)) == []


def test_a_body_that_is_not_json_or_not_the_schema_cannot_be_compared() -> None:
    with pytest.raises(NotComparable, match="not JSON"):
        answer_of(ROUTES.route("users"), 200, b"<html>", {})
    with pytest.raises(NotComparable, match=r"data\[0\]\.id"):
        answer_of(ROUTES.route("expenses"), 200, b'{"data": [{"id": "zz"}], "total": 1}', {})


def test_field_labels_are_the_published_schemas_paths_only() -> None:
    assert "data[].account.bank.code" in schema_fields(ROUTES.route("expenses"))
    assert "account.bank.code" in schema_fields(ROUTES.route("expense"))
    assert field_label(ROUTES.route("expenses"), "data[].amount") == "data[].amount"
    assert field_label(ROUTES.route("expenses"), "data[].secret") == OTHER_FIELD
    assert field_label(ROUTES.route("users"), "data[].amount") == OTHER_FIELD


def _published(route: str, items: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"data": items, "total": len(items), "page": 1, "limit": 10})


@given(st.data())
def test_every_reference_page_equals_itself_and_a_change_of_one_amount_is_found(
    data: st.DataObject,
) -> None:
    dataset = _DATASET
    expenses = data.draw(
        st.lists(st.sampled_from(dataset), min_size=1, max_size=8, unique_by=lambda e: e["id"])
    )
    body = _published("expenses", expenses)
    mine = answer_of(ROUTES.route("expenses"), 200, body, {})
    assert (
        compare(ROUTES.route("expenses"), mine, answer_of(ROUTES.route("expenses"), 200, body, {}))
        == []
    )
    changed = copy.deepcopy(expenses)
    victim = data.draw(st.integers(0, len(changed) - 1))
    changed[victim]["amount"] = "0.0001"
    theirs = answer_of(ROUTES.route("expenses"), 200, _published("expenses", changed), {})
    assert [(d.field, d.kind) for d in compare(ROUTES.route("expenses"), mine, theirs)] == [
        ("data[].amount", "value")
    ]


# expenses as the reference upstream sends them
_DATASET = [orjson.loads(orjson.dumps(expense_json(e))) for e in generate_dataset(42).expenses[:60]]


# the tally


def _differences(*fields: str) -> list[Difference]:
    return [Difference(name, "value", 1, 2) for name in fields]


def test_the_tally_counts_outcomes_and_keeps_five_examples_per_field() -> None:
    tally = Tally(primary="http://a", candidate="http://b")
    assert tally.record("users", "r0", []) == "identical"
    for n in range(1, 8):
        assert tally.record("users", f"r{n}", _differences("total")) == "different"
    tally.candidate_failed("users", "timeout")
    tally.skipped("users")
    report = tally.report()
    users = report["routes"]["users"]
    assert (users["compared"], users["identical"], users["different"]) == (8, 1, 7)
    assert users["identicalShare"] == 0.125
    assert (users["candidateErrors"], users["skipped"]) == ({"timeout": 1}, 1)
    assert users["fields"][0]["total"] == 7
    assert len(users["fields"][0]["examples"]) == EXAMPLES_KEPT
    assert [e["requestId"] for e in users["fields"][0]["examples"]] == [
        f"r{n}" for n in range(1, 6)
    ]
    assert tally.regressions == 8
    assert report["totals"]["compared"] == 8


def test_fields_that_differ_between_two_primary_answers_are_noise_reported_apart() -> None:
    tally = Tally(primary="http://a", candidate="http://b")
    seen = _differences("data[].paymentId", "data[].amount")
    assert tally.needs_recheck("expenses", seen)
    tally.learn_noise("expenses", seen, _differences("data[].paymentId"), "r1")
    assert not tally.needs_recheck("expenses", seen)
    assert tally.record("expenses", "r1", seen) == "different"
    assert tally.record("expenses", "r2", _differences("data[].paymentId")) == "noise"
    expenses = tally.report()["routes"]["expenses"]
    assert [f["field"] for f in expenses["fields"]] == ["data[].amount"]
    assert [f["field"] for f in expenses["noise"]] == ["data[].paymentId"]
    assert expenses["noise"][0]["total"] == 2
    assert expenses["noise"][0]["evidence"][0]["requestId"] == "r1"
    assert expenses["noiseOnly"] == 1
    assert tally.regressions == 1

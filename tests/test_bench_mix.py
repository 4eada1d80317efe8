"""The mix workload's keys (bench/mix.py): how many tokens and keys, over which routes,
with which weights, and which token each load-client connection carries; and that
every target is a distinct request the reference upstream answers with 200."""

from __future__ import annotations

import collections
from pathlib import Path
from urllib.parse import parse_qsl, unquote

import mix
import pytest
from pytest_aiohttp import AiohttpClient

from gateway.demo import create_demo_app
from gateway.records.routes import parse_record_query
from gateway.routing.standard import ROUTES

SIX_ROUTES = {"users", "clients", "expenses", "expense", "accounts", "account"}


def test_the_mix_has_24_tokens_and_6000_distinct_keys_over_the_six_routes() -> None:
    keys = mix.every_key()
    assert len({key.token for key in keys}) == 24
    assert len({(key.token, key.target) for key in keys}) == len(keys) == 6000
    assert {key.route for key in keys} == SIX_ROUTES
    per_token = collections.Counter(key.token for key in keys)
    assert set(per_token.values()) == {250}


def test_each_token_draws_its_keys_zipf_by_position() -> None:
    keys = mix.every_key()
    for index in (0, 23):
        mine = [key for key in keys if key.token_index == index]
        assert [key.position for key in mine] == list(range(1, 251))
        assert [key.weight for key in mine] == [1 / position for position in range(1, 251)]
        share = mine[0].weight / sum(key.weight for key in mine)
        assert 0.16 < share < 0.17  # 1 / H(250)
    # the global rank interleaves the tokens' positions
    assert sorted(key.rank for key in keys) == list(range(1, 6001))
    first = next(key for key in keys if key.token_index == 5 and key.position == 2)
    assert first.rank == 24 + 5 + 1


def test_tokens_ask_for_different_records_from_the_same_pool() -> None:
    zero, one = ({target for _, target in mix.token_targets(t)} for t in (0, 1))
    assert zero != one
    assert zero & one  # services overlap in part
    assert mix.token_targets(3) == mix.token_targets(3)  # seeded: the same every run
    assert mix.token_targets(3, seed=mix.SEED + 1) != mix.token_targets(3)


def test_connection_i_carries_token_i_mod_24() -> None:
    assigned = [mix.connection_token(i) for i in range(mix.CONNECTIONS)]
    assert assigned[:3] == [0, 1, 2]
    assert assigned[24] == 0
    assert collections.Counter(assigned) == dict.fromkeys(range(24), 2)


def test_no_two_targets_are_one_request_to_the_gateway() -> None:
    """The gateway canonicalises queries; nginx and Varnish key on the raw target. Two
    spellings of one request would be one key for the gateway and two for them."""
    routes = {route.name: route for route in ROUTES}
    canonical = set()
    targets = [target for values in mix.targets().values() for target in values]
    for target in targets:
        path, _, query = target.partition("?")
        parts = path.strip("/").split("/")
        route = routes[parts[0] if len(parts) == 1 else parts[0].removesuffix("s")]
        value = unquote(parts[1]) if len(parts) > 1 else None
        parsed = parse_record_query(route, value, parse_qsl(query), max_limit=100)
        canonical.add(parsed.canonical_text)
    assert len(canonical) == len(targets)


def test_most_single_accounts_need_no_escape_and_a_few_do() -> None:
    accounts = [key.target for key in mix.every_key() if key.route == "account"]
    escaped = [target for target in accounts if "%" in target]
    assert 0 < len(escaped) < len(accounts) / 4
    assert "/accounts/Tesorer%C3%ADa%20EUR%2FUSD" in mix.targets()["account"]


async def test_every_target_answers_200_with_records_from_the_reference_upstream(
    aiohttp_client: AiohttpClient,
) -> None:
    app = create_demo_app(tokens=frozenset(mix.tokens()), seed=mix.UPSTREAM_SEED)
    client = await aiohttp_client(app)
    authorization = {"Authorization": f"Bearer {mix.tokens()[7]}"}
    for route, targets in mix.targets().items():
        for target in targets:
            async with client.get(target, headers=authorization) as response:
                assert response.status == 200, target
                body = await response.json()
            if route in ("expense", "account"):
                assert body["id"], target
            else:
                assert body["data"], target  # a page that exists, not past the last


def test_the_keys_file_lists_each_token_then_its_weighted_targets(tmp_path: Path) -> None:
    keys = mix.every_key()
    path = tmp_path / "keys.txt"
    mix.write_keys(path, keys)
    lines = path.read_text().splitlines()
    assert lines[0].startswith("#")
    assert lines[1] == "token Bearer bench-mix-00"
    weight, target = lines[2].split(" ")
    assert float(weight) == 1.0
    assert target == keys[0].target
    assert lines[3].split(" ")[0] == repr(0.5)
    assert sum(line.startswith("token ") for line in lines) == 24
    assert len(lines) == 1 + 24 + 6000


def test_keys_out_of_token_order_are_refused(tmp_path: Path) -> None:
    keys = mix.every_key()
    mix.write_keys(tmp_path / "ok.txt", [keys[0], keys[300]])  # tokens 0 and 1
    with pytest.raises(ValueError, match="token by token"):
        mix.write_keys(tmp_path / "bad.txt", [keys[0], keys[600]])

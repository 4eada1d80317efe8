"""POST /admin/records/changed, as docs/purging.md describes it: a change feed's notice
purges what DELETE /admin/cache?record= purges, with the admin token or signed with
admin.change_feed_secret; a signature that is wrong, late or used before is refused, and
nothing is purged unless every reference is valid."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.demo import RequestLog

from ..conftest import GatewayFactory, base_url, near_of, redis_cache, until
from ..redis_server import RedisServer

Client = TestClient[web.Request, web.Application]
TOKEN = "admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "change-feed-secret-0123456789abcdef-xyz"
JSON = {"Content-Type": "application/json"}
CALLER = {"Authorization": "Bearer demo-token"}


def signed(body: bytes, secret: str = SECRET, at: float | None = None) -> dict[str, str]:
    """The headers of a notice signed as docs/purging.md says, written out here (not
    with the gateway's own function), so that a change of the scheme fails this test."""
    stamp = str(int(time.time() if at is None else at))
    message = b"v1\n" + stamp.encode() + b"\n" + body
    digest = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return {**JSON, "X-Gateway-Timestamp": stamp, "X-Gateway-Signature": f"v1={digest}"}


async def gateway(
    factory: GatewayFactory, upstream: TestServer, cache: dict[str, Any], **admin: str
) -> Client:
    client = await factory(base_url(upstream), cache=cache, admin=admin)
    if cache.get("backend") == "redis":
        await until(lambda: near_of(client).live)
    return client


async def x_cache(client: Client, path: str) -> str:
    response = await client.get(path, headers=CALLER)
    assert response.status == 200, await response.text()
    await response.read()
    return response.headers["X-Cache"]


async def first_expense(client: Client) -> str:
    response = await client.get("/expenses?limit=2", headers=CALLER)
    assert response.status == 200
    return str(orjson.loads(await response.read())["data"][0]["id"])


async def notify(client: Client, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    response = await client.post("/admin/records/changed", data=body, headers=headers)
    return response.status, orjson.loads(await response.read())


async def scrape(client: Client) -> str:
    return await (await client.get("/metrics")).text()


async def test_a_signed_notice_purges_the_record_on_every_instance_once(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str
) -> None:
    cache = redis_cache(redis_url)
    first = await gateway(gateway_factory, upstream, cache, change_feed_secret=SECRET)
    second = await gateway(gateway_factory, upstream, cache, token=TOKEN, change_feed_secret=SECRET)
    expense = await first_expense(second)
    assert await x_cache(second, f"/expenses/{expense}") == "MISS"
    assert await x_cache(second, "/users") == "MISS"
    assert len(near_of(second)) == 3
    body = orjson.dumps({"records": [f"expense:{expense.upper()}"]})
    headers = signed(body)

    status, answer = await notify(first, body, headers)
    assert status == 200, answer
    assert answer == {
        "purged": "records",
        "records": [f"expense:{expense}"],
        "mode": "hard",
        "entries": 2,  # the page and the expense
        "backend": "redis",
        "instances": {"told": 2, "confirmed": 2},
    }
    assert len(near_of(second)) == 1  # its copy of /users stays
    assert await x_cache(second, "/expenses?limit=2") == "MISS"
    assert await x_cache(second, f"/expenses/{expense}") == "MISS"
    assert await x_cache(second, "/users") == "HIT"

    # the same notice again, to either instance: refused, nothing purged again
    for client in (first, second):
        status, problem = await notify(client, body, headers)
        assert status == 409, problem
        assert problem["type"] == "urn:records-gateway:problem:notice-replayed"
    assert await x_cache(second, "/expenses?limit=2") == "HIT"
    assert 'gateway_change_notices_total{outcome="replayed"} 1.0' in await scrape(first)
    assert 'gateway_change_notices_total{outcome="purged"} 1.0' in await scrape(first)
    # signed again, it is a new notice
    await asyncio.sleep(1.05)
    status, answer = await notify(second, body, signed(body))
    assert (status, answer["entries"]) == (200, 2)


async def test_a_notice_with_the_admin_token_needs_no_signature_and_may_be_soft(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    client = await gateway(gateway_factory, upstream, {"backend": "memory"}, token=TOKEN)
    expense = await first_expense(client)
    body = orjson.dumps({"records": [f"expense:{expense}"], "soft": True})
    for _ in range(2):  # the admin token's holder may send one notice twice
        status, answer = await notify(client, body, {**ADMIN, **JSON})
        assert (status, answer["mode"], answer["entries"]) == (200, "soft", 1), answer
    before = len(upstream_log.entries)
    # marked stale: served stale while one refresh runs
    assert await x_cache(client, "/expenses?limit=2") == "STALE"
    await until(lambda: len(upstream_log.entries) == before + 1)


async def test_a_notice_without_a_valid_signature_is_refused_and_purges_nothing(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway(
        gateway_factory, upstream, {"backend": "memory"}, token=TOKEN, change_feed_secret=SECRET
    )
    expense = await first_expense(client)
    body = orjson.dumps({"records": [f"expense:{expense}"]})
    good = signed(body)
    stamp, signature = good["X-Gateway-Timestamp"], good["X-Gateway-Signature"]
    refused: dict[str, tuple[bytes, dict[str, str], str]] = {
        "no credentials": (body, JSON, "Authorization: Bearer <admin.token>"),
        "a caller's token": (body, {**JSON, **CALLER}, "Authorization: Bearer <admin.token>"),
        "another secret": (body, signed(body, SECRET[::-1]), "is not the body's signature"),
        "the admin token as the secret": (body, signed(body, TOKEN), "is not the body's"),
        "another body": (body.replace(b"]", b', "user:x"]'), good, "is not the body's"),
        "another timestamp": (
            body,
            {**good, "X-Gateway-Timestamp": str(int(stamp) + 1)},
            "is not the body's signature",
        ),
        "too old": (body, signed(body, at=time.time() - 320), "s in the past; a signed"),
        "from the future": (body, signed(body, at=time.time() + 320), "s in the future"),
        "no timestamp": (
            body,
            {**JSON, "X-Gateway-Signature": signature},
            "one X-Gateway-Timestamp and one X-Gateway-Signature",
        ),
        "no signature": (body, {**JSON, "X-Gateway-Timestamp": stamp}, "one X-Gateway"),
        "uppercase hex": (
            body,
            {**good, "X-Gateway-Signature": signature.upper().replace("V1=", "v1=")},
            "v1= and 64 lowercase hex digits",
        ),
        "a timestamp in milliseconds with a fraction": (
            body,
            {**good, "X-Gateway-Timestamp": stamp + ".5"},
            "whole seconds since the Unix epoch",
        ),
    }
    for case, (sent, headers, message) in refused.items():
        status, problem = await notify(client, sent, headers)
        assert status == 401, case
        assert problem["type"] == "urn:records-gateway:problem:unauthenticated", case
        assert message in problem["detail"], (case, problem)
    assert await x_cache(client, "/expenses?limit=2") == "HIT"
    metrics = await scrape(client)
    assert f'gateway_change_notices_total{{outcome="unauthenticated"}} {len(refused)}.0' in metrics
    assert 'outcome="purged"' not in metrics
    # the valid one still goes through
    assert (await notify(client, body, good))[0] == 200


async def test_without_a_feed_secret_a_signed_notice_is_refused(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway(gateway_factory, upstream, {"backend": "memory"}, token=TOKEN)
    body = orjson.dumps({"records": ["user:0c6f8d3e-1111-4000-8000-000000000001"]})
    status, problem = await notify(client, body, {**signed(body), **ADMIN})
    assert status == 401
    assert "admin.change_feed_secret is unset" in problem["detail"]


async def test_with_the_feed_secret_alone_only_signed_notices_get_in(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway(
        gateway_factory, upstream, {"backend": "memory"}, change_feed_secret=SECRET
    )
    body = orjson.dumps({"records": ["user:0c6f8d3e-1111-4000-8000-000000000001"]})
    assert (await notify(client, body, signed(body)))[0] == 200
    # every other admin path, and every other method, is 401 to everyone
    for method, path in (
        ("DELETE", "/admin/cache"),
        ("GET", "/admin/config"),
        ("GET", "/admin/records/changed"),
        ("GET", "/admin/nowhere"),
    ):
        response = await client.request(method, path, headers={**signed(b""), **ADMIN})
        assert response.status == 401, path


async def test_an_invalid_notice_names_each_bad_reference_and_purges_nothing(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    client = await gateway(gateway_factory, upstream, {"backend": "memory"}, token=TOKEN)
    expense = await first_expense(client)
    good = f"expense:{expense}"
    headers = {**ADMIN, **JSON}
    refused: dict[bytes, list[tuple[str, str]]] = {
        orjson.dumps({"records": [good, "expence:1", 5, "account:"]}): [
            ("records[1]", "'expence:1': the kind must be one of"),
            ("records[2]", "must be a string"),
            ("records[3]", "'account:': the id is empty"),
        ],
        orjson.dumps({"records": [good], "soft": "yes"}): [("soft", "must be true or false")],
        orjson.dumps({"records": [good], "tags": []}): [("tags", "unknown field")],
        orjson.dumps({"records": []}): [("records", "a non-empty list")],
        orjson.dumps({"record": good}): [
            ("record", "unknown field"),
            ("records", "a non-empty list"),
        ],
        orjson.dumps([good]): [("body", "must be a JSON object")],
        b'{"records": [': [("body", "must be a JSON object")],
        b"\xff\xfe": [("body", "must be a JSON object")],
        orjson.dumps({"records": [good] * 1001}): [("records", "names 1001 records; at most 1000")],
    }
    for body, expected in refused.items():
        status, problem = await notify(client, body, headers)
        assert status == 400, body[:60]
        assert problem["type"] == "urn:records-gateway:problem:invalid-parameters"
        got = [(error["parameter"], error["message"]) for error in problem["errors"]]
        assert [name for name, _ in got] == [name for name, _ in expected], got
        for (_, message), (_, part) in zip(got, expected, strict=True):
            assert part in message, (message, part)
    status, problem = await notify(client, orjson.dumps({"records": [good]}), ADMIN)
    assert status == 415, problem
    assert problem["type"] == "urn:records-gateway:problem:unsupported-media-type"
    response = await client.post(
        f"/admin/records/changed?record={good}",
        data=orjson.dumps({"records": [good]}),
        headers=headers,
    )
    assert response.status == 400
    assert await x_cache(client, "/expenses?limit=2") == "HIT"
    assert len(upstream_log.entries) == 1
    assert 'gateway_change_notices_total{outcome="invalid"} 11.0' in await scrape(client)


async def test_an_oversized_notice_is_refused_before_it_is_read_whole(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway(
        gateway_factory, upstream, {"backend": "memory"}, token=TOKEN, change_feed_secret=SECRET
    )
    big = orjson.dumps({"records": ["account:" + "x" * 200] * 1300})
    assert len(big) > 256 * 1024
    status, problem = await notify(client, big, {**ADMIN, **JSON})
    assert status == 413
    assert problem["type"] == "urn:records-gateway:problem:content-too-large"

    async def chunks() -> Any:  # no Content-Length: counted as it comes
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    response = await client.post("/admin/records/changed", data=chunks(), headers=signed(big))
    assert response.status == 413
    # within the bound, a notice of many references is taken
    many = orjson.dumps({"records": [f"account:A-{n}" for n in range(1000)]})
    status, answer = await notify(client, many, signed(many))
    assert (status, len(answer["records"])) == (200, 1000)


async def test_a_signed_notice_during_a_redis_stall_is_not_taken(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    cache = redis_cache(own_redis.url, redis_timeout_ms=50)
    client = await gateway(gateway_factory, upstream, cache, change_feed_secret=SECRET)
    expense = await first_expense(client)
    body = orjson.dumps({"records": [f"expense:{expense}"]})
    own_redis.freeze()
    try:
        status, problem = await notify(client, body, signed(body))
    finally:
        own_redis.thaw()
    assert status == 503, problem
    assert problem["type"] == "urn:records-gateway:problem:notice-not-taken"
    assert "nothing was purged" in problem["detail"]
    assert 'gateway_change_notices_total{outcome="unknown"} 1.0' in await scrape(client)


def docs_block(language: str, after: str) -> str:
    """The first ``language`` code block of docs/purging.md after the line ``after``."""
    page = (Path(__file__).parents[2] / "docs" / "purging.md").read_text()
    rest = page[page.index(after) :]
    start = rest.index(f"```{language}\n") + len(language) + 4
    return rest[start : rest.index("```", start)]


async def test_the_feed_written_as_the_docs_show_it_is_taken_once(
    gateway_factory: GatewayFactory, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await gateway(
        gateway_factory, upstream, {"backend": "memory"}, change_feed_secret=SECRET
    )
    expense = await first_expense(client)
    monkeypatch.setenv("CHANGE_FEED_SECRET", SECRET)
    feed: dict[str, Any] = {}
    exec(docs_block("python", "A feed in Python"), feed)
    address = str(client.make_url("")).rstrip("/")
    answer = await asyncio.to_thread(feed["notify"], [f"expense:{expense}"], gateway=address)
    assert (answer["records"], answer["entries"]) == ([f"expense:{expense}"], 1)
    assert await x_cache(client, "/expenses?limit=2") == "MISS"


@pytest.mark.skipif(
    not (shutil.which("openssl") and shutil.which("curl")), reason="needs openssl and curl"
)
async def test_the_shell_example_of_the_docs_is_taken(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway(
        gateway_factory, upstream, {"backend": "memory"}, change_feed_secret=SECRET
    )
    script = docs_block("sh", "The same from a shell").replace(
        "http://127.0.0.1:8080", str(client.make_url("")).rstrip("/")
    )
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-euc",
        script,
        env={**os.environ, "CHANGE_FEED_SECRET": SECRET},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    answer = json.loads(out)
    assert answer["records"] == ["expense:3f6c1a52-8d0e-4f7b-9a41-2b5d0c7e9f13"], answer


async def test_two_notices_of_the_same_records_in_one_second_are_told_apart_by_their_id(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway(
        gateway_factory, upstream, {"backend": "memory"}, change_feed_secret=SECRET
    )
    expense = await first_expense(client)
    at = time.time()
    notices = [
        orjson.dumps({"records": [f"expense:{expense}"], "id": f"change-{n}"}) for n in (1, 2)
    ]
    for body in notices:
        status, answer = await notify(client, body, signed(body, at=at))
        assert status == 200, answer
    # without an id, the second is the first again
    bare = orjson.dumps({"records": [f"expense:{expense}"]})
    assert (await notify(client, bare, signed(bare, at=at)))[0] == 200
    status, problem = await notify(client, bare, signed(bare, at=at))
    assert status == 409
    assert "told apart by their id" in problem["detail"]
    too_long = orjson.dumps({"records": [f"expense:{expense}"], "id": "x" * 201})
    status, problem = await notify(client, too_long, signed(too_long, at=at))
    assert (status, problem["errors"][0]["parameter"]) == (400, "id")


async def test_a_signed_notice_out_of_its_window_is_refused_before_its_body_is_read(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    """Nothing of the body is read for fields that cannot be right: a request with a
    stale timestamp is answered 401 while its body is still being sent."""
    client = await gateway(
        gateway_factory, upstream, {"backend": "memory"}, change_feed_secret=SECRET
    )
    never_ends = asyncio.Event()

    async def body() -> Any:
        yield b'{"records": ['
        await never_ends.wait()

    headers = signed(b"", at=time.time() - 400)
    async with asyncio.timeout(5):
        response = await client.post("/admin/records/changed", data=body(), headers=headers)
    assert response.status == 401
    never_ends.set()

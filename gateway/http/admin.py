"""Admin routes under /admin, present only when ``admin.token`` (or
``admin.change_feed_secret``) is set.

Without the admin token every request under /admin is answered 401 before anything
else: neither the methods a path takes (405 and ``Allow``) nor which paths exist
(404) are shown to anyone else. The one exception is a change notice signed with
``admin.change_feed_secret`` (``POST /admin/records/changed``,
``gateway.http.change_feed``): it is judged by its signature.

``DELETE /admin/cache`` purges every entry of this namespace and of the upstream in
use; ``DELETE /admin/cache?route=expenses`` purges one route for every token. With the
redis backend the purge is seen by every instance sharing the Redis and the upstream;
the memory backend's purge drops what it holds of every upstream.

With several workers (``server.workers``) the worker that takes a purge, a reload or a
shadow reset applies it and sends it to the others (``gateway.ops.siblings``); it
answers 200 once every worker confirmed, and otherwise a 503 problem that says how many
workers it reached (``workers``: ``told``, ``confirmed``). A purge that Redis shares
needs no message: every worker is an instance Redis tells.
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from gateway.cache.backend import Purged, RecordsPurged
from gateway.comparison.shadow import Shadow
from gateway.config.live import LiveConfig, ReloadResult
from gateway.config.settings import ShadowSettings, describe_validation_error
from gateway.errors import (
    AuthenticationRequired,
    CacheUnavailable,
    InvalidParameters,
    ParameterProblem,
)
from gateway.http.binding import UPSTREAMS
from gateway.http.change_feed import (
    BODY_MAX_BYTES,
    CHANGES_MAX,
    WINDOW_S,
    TooLarge,
    Unsigned,
    check_signature,
    is_signed,
    parse_notice,
    read_body,
    replay_name,
    shown,
    signature_fields,
)
from gateway.http.edge import REQUEST_ID, Handler
from gateway.http.problems import problem_response
from gateway.http.records import RECORDS
from gateway.http.service import METRICS
from gateway.normalise.holdings import BadReference, parse_ref
from gateway.ops.siblings import Reach, Siblings
from gateway.ops.traffic import Traffic

log = logging.getLogger("gateway.admin")
LIVE = web.AppKey("live", LiveConfig)
SHADOW = web.AppKey("shadow", Shadow)
SIBLINGS = web.AppKey("siblings", Siblings)


def check_admin(request: web.Request) -> None:
    """Raise AuthenticationRequired unless the request carries the admin token."""
    token = request.app[LIVE].settings.admin.token
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if (
        token is None
        or scheme.lower() != "bearer"
        or not hmac.compare_digest(
            given.strip().encode("utf-8", "surrogateescape"), token.get_secret_value().encode()
        )
    ):
        raise AuthenticationRequired("the admin routes need 'Authorization: Bearer <admin.token>'")


# the most records one purge names
RECORDS_MAX = 100
_PURGE_PARAMETERS = ("route", "record", "mode")
_MODES = ("hard", "soft")


async def purge_cache(request: web.Request) -> web.StreamResponse:
    """DELETE /admin/cache[?route=NAME | ?record=KIND:ID...[&mode=soft]]."""
    check_admin(request)
    if "record" in request.query:
        return await _purge_records(request)
    route = _route_asked(request)
    backend = request.app[UPSTREAMS].current.cache.backend
    logged: dict[str, object] = {"event": "cache_purge", "purged_route": route or "*"}
    try:
        purged = await backend.purge(route)
    except CacheUnavailable as exc:
        return _purge_unconfirmed(request, exc, logged)
    log.info("cache purged", extra={**logged, **purged._asdict()})
    body: dict[str, object] = {"purged": route or "all", "backend": backend.name}
    return await _purge_answer(request, body, purged, {"action": "purge", "route": route})


def _route_asked(request: web.Request) -> str | None:
    """The route a purge names (None: everything); raises InvalidParameters."""
    query = request.query
    route = query.get("route")
    problems = [
        ParameterProblem(name, "unknown query parameter; allowed: " + ", ".join(_PURGE_PARAMETERS))
        for name in query
        if name not in _PURGE_PARAMETERS
    ]
    if query.getall("mode", ["hard"]) != ["hard"]:
        problems.append(ParameterProblem("mode", "a purge by route is hard; soft goes with record"))
    if len(query.getall("route", [])) > 1:
        problems.append(ParameterProblem("route", "given more than once; purge one route"))
    names = request.app[RECORDS].routes.names()
    if route is not None and route not in names:
        problems.append(ParameterProblem("route", "must be one of " + ", ".join(names)))
    if problems:
        raise InvalidParameters(problems)
    return route


def _purge_unconfirmed(
    request: web.Request, exc: CacheUnavailable, logged: dict[str, object]
) -> web.StreamResponse:
    """The 503 of a purge the cache did not confirm (retried in the background)."""
    log.warning(
        "cache purge outcome unknown; retried in the background",
        extra={**logged, "error": str(exc)},
    )
    return _purge_outcome_unknown(
        request,
        f"the cache did not confirm the purge ({exc}): it may have happened or not."
        " This instance dropped its own copies and retries the purge in the"
        " background for a few seconds; send it again to be sure",
    )


async def _purge_answer(
    request: web.Request,
    body: dict[str, object],
    purged: Purged | RecordsPurged,
    sibling_message: dict[str, object],
) -> web.StreamResponse:
    """The answer of a purge done here: with a shared backend, the instances told and
    confirmed; with one in this process, once every other worker of the instance did
    it (``sibling_message``), or a 503 that says how many did."""
    if request.app[UPSTREAMS].current.cache.backend.capabilities.shared:
        if purged.told is not None:
            body["instances"] = {"told": purged.told, "confirmed": purged.confirmed}
    else:
        reach = await _tell_siblings(request, sibling_message)
        if reach is not None and not reach.everywhere:
            return _purge_outcome_unknown(
                request,
                f"{reach.confirmed} of {reach.told} workers confirmed the purge; the"
                " others may still serve what it purged. Send it again to be sure",
                workers=reach.as_json(),
            )
        if reach is not None:
            body["workers"] = reach.as_json()
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def _records_asked(request: web.Request) -> tuple[list[str], bool]:
    """The canonical references of a purge by record, and whether it is soft; raises
    InvalidParameters, naming each bad one, before anything is purged."""
    query = request.query
    problems = [
        ParameterProblem(
            name,
            "a purge is by route or by record, not both"
            if name == "route"
            else "unknown query parameter; allowed: record, mode",
        )
        for name in dict.fromkeys(query)
        if name not in ("record", "mode")
    ]
    texts = query.getall("record")
    if len(texts) > RECORDS_MAX:
        raise InvalidParameters(
            [ParameterProblem("record", f"given {len(texts)} times; at most {RECORDS_MAX}")]
        )
    refs: dict[str, None] = {}
    for text in texts:
        try:
            refs[str(parse_ref(text))] = None
        except BadReference as exc:
            problems.append(ParameterProblem("record", f"{shown(text)}: {exc}"))
    modes = query.getall("mode", [])
    if len(modes) > 1 or (modes and modes[0] not in _MODES):
        problems.append(ParameterProblem("mode", "must be given once, hard or soft"))
    if problems:
        raise InvalidParameters(problems)
    return list(refs), modes == ["soft"]


async def _purge_records(request: web.Request) -> web.StreamResponse:
    """DELETE /admin/cache?record=KIND:ID...[&mode=soft]: every entry of every caller
    that holds one of the records, removed (or marked stale) for every instance."""
    refs, soft = _records_asked(request)
    return await _purge_refs(request, refs, soft, {})


async def records_changed(request: web.Request) -> web.StreamResponse:
    """POST /admin/records/changed: a change notice (``gateway.http.change_feed``),
    with the admin token or signed with ``admin.change_feed_secret``; its records
    purged as :func:`_purge_records` purges them."""
    metrics = request.app[METRICS]
    try:
        body, digest = await _notice_body(request)
        if request.content_type != "application/json":
            raise _NoticeRefused(
                "invalid",
                415,
                "unsupported-media-type",
                "The notice is not JSON",
                "a change notice is sent as Content-Type: application/json",
            )
        _no_query(request)
        notice = parse_notice(body)
        if digest is not None:
            await _taken_once(request, digest)
    except _NoticeRefused as refused:
        metrics.change_notice(refused.outcome)
        return problem_response(request, **refused.problem, request_id=request[REQUEST_ID])
    except AuthenticationRequired:
        metrics.change_notice("unauthenticated")
        raise
    except InvalidParameters:
        metrics.change_notice("invalid")
        raise
    answer = await _purge_refs(request, notice.records, notice.soft, {"by": "notice"})
    metrics.change_notice("purged" if answer.status == 200 else "unknown")
    return answer


class _NoticeRefused(Exception):
    """A change notice answered with a problem before anything is purged, counted as
    ``outcome``."""

    def __init__(self, outcome: str, status: int, slug: str, title: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.problem: dict[str, Any] = {
            "status": status,
            "slug": slug,
            "title": title,
            "detail": detail,
        }


async def _notice_body(request: web.Request) -> tuple[bytes, str | None]:
    """A notice's body, once its sender is known: the admin token, or a signature
    (then its digest too), its fields checked before the body is read; raises
    AuthenticationRequired or _NoticeRefused."""
    signed = None
    secret = None
    if is_signed(request):
        held = request.app[LIVE].settings.admin.change_feed_secret
        secret = None if held is None else held.get_secret_value()
        try:
            signed = signature_fields(request, secret)
        except Unsigned as exc:
            raise AuthenticationRequired(str(exc)) from None
    else:
        check_admin(request)
    try:
        body = await read_body(request)
    except TooLarge:
        raise _NoticeRefused(
            "invalid",
            413,
            "content-too-large",
            "The notice is too large",
            f"a change notice's body is at most {BODY_MAX_BYTES} bytes;"
            f" send at most {CHANGES_MAX} records a notice",
        ) from None
    if signed is None or secret is None:
        return body, None
    try:
        return body, check_signature(signed, secret, body)
    except Unsigned as exc:
        raise AuthenticationRequired(str(exc)) from None


async def _taken_once(request: web.Request, digest: str) -> None:
    """Claim a signed notice for the fleet; raises _NoticeRefused when it was taken
    before, or the cache cannot say."""
    backend = request.app[UPSTREAMS].current.cache.backend
    try:
        first = await backend.claim(replay_name(digest), 2 * WINDOW_S + 60)
    except CacheUnavailable as exc:
        raise _NoticeRefused(
            "unknown",
            503,
            "notice-not-taken",
            "The notice was not taken",
            f"the cache did not answer whether this notice was taken before ({exc}):"
            " nothing was purged. Sign it again and send it again",
        ) from None
    if not first:
        raise _NoticeRefused(
            "replayed",
            409,
            "notice-replayed",
            "The notice was taken before",
            "a notice with this signature was taken before, and is not taken again. A"
            " retry is signed again, with its own timestamp; two notices of the same"
            " records in the same second are told apart by their id",
        )


async def _purge_refs(
    request: web.Request, refs: list[str], soft: bool, logged_too: dict[str, object]
) -> web.StreamResponse:
    """Purge the entries that hold ``refs`` for every instance; the answer says how
    many, or a 503 when the purge is not confirmed everywhere."""
    backend = request.app[UPSTREAMS].current.cache.backend
    if backend.capabilities.stores and not backend.capabilities.purges_records:
        raise InvalidParameters(
            [ParameterProblem("record", f"the cache backend {backend.name} cannot purge by record")]
        )
    mode = "soft" if soft else "hard"
    logged: dict[str, object] = {
        "event": "cache_purge",
        "purged_records": refs,
        "mode": mode,
        **logged_too,
    }
    metrics = request.app[METRICS]
    started = time.perf_counter()
    try:
        purged = await backend.purge_records(refs, soft=soft)
    except CacheUnavailable as exc:
        metrics.purged_records(mode, None, time.perf_counter() - started)
        return _purge_unconfirmed(request, exc, logged)
    entries = len(purged.keys)
    if purged.told is not None and (purged.confirmed or 0) < purged.told:
        # a process Redis told did not confirm: it may still serve what was purged
        metrics.purged_records(mode, None, time.perf_counter() - started)
        return _purge_outcome_unknown(
            request,
            f"{purged.confirmed} of {purged.told} processes confirmed the purge within"
            " 1 s; the others may still serve what it purged. Send it again to be sure",
            instances={"told": purged.told, "confirmed": purged.confirmed},
        )
    metrics.purged_records(mode, entries, time.perf_counter() - started)
    told = {"told": purged.told, "confirmed": purged.confirmed}
    log.info("cache purged by record", extra={**logged, "entries": entries, **told})
    body: dict[str, object] = {
        "purged": "records",
        "records": refs,
        "mode": mode,
        "entries": entries,
        "backend": backend.name,
    }
    message = {"action": "purge_records", "records": refs, "soft": soft}
    return await _purge_answer(request, body, purged, message)


async def _tell_siblings(request: web.Request, message: dict[str, object]) -> Reach | None:
    """Send ``message`` to the other workers of this instance (None: it has no others)."""
    siblings = request.app.get(SIBLINGS)
    if siblings is None:
        return None
    return await siblings.tell(message)


def _not_everywhere(request: web.Request, reach: Reach, what: str) -> web.StreamResponse:
    return problem_response(
        request,
        status=503,
        slug="workers-not-confirmed",
        title="Not every worker confirmed the change",
        detail=(
            f"{what} is in force in {reach.confirmed} of {reach.told} workers; the others did"
            " not confirm it in time. Send it again to be sure"
        ),
        request_id=request[REQUEST_ID],
        extra={"workers": reach.as_json()},
    )


async def apply_from_sibling(app: web.Application, message: dict[str, object]) -> bool:
    """Apply here an admin action another worker of the instance took
    (``gateway.ops.siblings``); whether it is in force here."""
    action = message.get("action")
    if action == "purge":
        route = message.get("route")
        if route is not None and route not in app[RECORDS].routes.names():
            return False
        await app[UPSTREAMS].current.cache.backend.purge(route if isinstance(route, str) else None)
        log.info("cache purged", extra={"event": "cache_purge", "purged_route": route or "*"})
        return True
    if action == "purge_records":
        refs = message.get("records")
        if not isinstance(refs, list) or not all(isinstance(ref, str) for ref in refs):
            return False
        purged = await app[UPSTREAMS].current.cache.backend.purge_records(
            refs, soft=message.get("soft") is True
        )
        log.info(
            "cache purged by record",
            extra={"event": "cache_purge", "purged_records": refs, "entries": len(purged.keys)},
        )
        return True
    if action == "reload":
        values = message.get("live")
        return isinstance(values, dict) and app[LIVE].adopt(values).ok
    if action == "shadow_reset":
        app[SHADOW].take_reset()
        log.info("shadow report reset", extra={"event": "shadow_reset"})
        return True
    return False


def _purge_outcome_unknown(
    request: web.Request, detail: str, **extra: object
) -> web.StreamResponse:
    """The 503 of a purge that may or may not be in force everywhere."""
    return problem_response(
        request,
        status=503,
        slug="purge-outcome-unknown",
        title="The purge's outcome is unknown",
        detail=detail,
        request_id=request[REQUEST_ID],
        extra={"outcome": "unknown", **extra},
    )


async def effective_config(request: web.Request) -> web.StreamResponse:
    """GET /admin/config: the effective configuration, secrets redacted."""
    check_admin(request)
    body = orjson.dumps(request.app[LIVE].effective())
    return web.Response(body=body, content_type="application/json")


async def reload_config(request: web.Request) -> web.StreamResponse:
    """POST /admin/reload: what SIGHUP does; 422 when the new configuration is refused."""
    check_admin(request)
    result = await request.app[LIVE].reload()
    return await _reloaded(request, result, "the reloaded configuration", {})


async def _reloaded(
    request: web.Request, result: ReloadResult, what: str, extra: dict[str, object]
) -> web.StreamResponse:
    """The answer to a reload this worker took (``result``): 422 when it was refused;
    otherwise the other workers take the live keys it applied, and the answer (with
    ``extra``) counts them, a 503 when one did not confirm ``what``."""
    if not result.ok:
        return problem_response(
            request,
            status=422,
            slug="config-refused",
            title="The new configuration was refused",
            detail=f"the running configuration stays: {result.error}",
            request_id=request[REQUEST_ID],
        )
    body = {**result.as_json(), **extra}
    reach = await _tell_siblings(
        request, {"action": "reload", "live": request.app[LIVE].live_values()}
    )
    if reach is not None and not reach.everywhere:
        return _not_everywhere(request, reach, what)
    if reach is not None:
        body["workers"] = reach.as_json()
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def shadow_report(request: web.Request) -> web.StreamResponse:
    """GET /admin/shadow: the shadow traffic's report (gateway.comparison.tally)."""
    check_admin(request)
    _no_query(request)
    body = request.app[SHADOW].report()
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def fleet_readiness(request: web.Request) -> web.StreamResponse:
    """GET /admin/fleet: every instance sharing the cache, with its readiness as it last
    announced it (every few seconds); without a shared cache, this process alone."""
    check_admin(request)
    _no_query(request)
    binding = request.app[UPSTREAMS].current
    if binding.fleet is not None:
        instances = binding.fleet.instances()
        shared = True
    else:
        instances = [{"instance": "this process", "mine": True, **binding.readiness.summary()}]
        shared = False
    body = {"shared": shared, "instances": instances}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def shadow_answers(request: web.Request) -> web.StreamResponse:
    """GET /admin/shadow/answers/{requestId}: the primary's and the candidate's whole
    published answers of a request that differed, as kept by the report (the first few
    of each route), for seeing them side by side."""
    check_admin(request)
    _no_query(request)
    kept = request.app[SHADOW].answers(request.match_info["requestId"])
    if kept is None:
        return problem_response(
            request,
            status=404,
            slug="not-found",
            title="No answers kept",
            detail="the report keeps the answers of the first requests that differed on"
            " each route, since it began: not of this request",
            request_id=request[REQUEST_ID],
        )
    return web.Response(body=orjson.dumps(kept), content_type="application/json")


# what PUT /admin/shadow takes: the candidate and the share mirrored
_SHADOW_FIELDS = {"baseUrl": "base_url", "sampleRatio": "sample_ratio"}
_SHADOW_BODY_MAX = 4096


async def set_shadow(request: web.Request) -> web.StreamResponse:
    """PUT /admin/shadow: point the shadow traffic at another candidate, change its
    share, or turn it off (``sampleRatio`` 0), as a reload of those keys would, on
    every worker; a reload from the file later sets them as the file says."""
    check_admin(request)
    _no_query(request)
    try:
        raw = await read_body(request)
    except TooLarge:
        raw = b" " * (_SHADOW_BODY_MAX + 1)
    wanted = _shadow_change(raw)
    live = request.app[LIVE]
    current = live.settings
    shadow = current.upstream.shadow.model_dump()
    shadow.update({_SHADOW_FIELDS[name]: value for name, value in wanted.items()})
    try:
        changed = ShadowSettings.model_validate(shadow)
    except ValidationError as exc:
        wrong = describe_validation_error(exc).removeprefix("(root): ")
        field, _, message = wrong.partition(": ")
        named = {"base_url": "baseUrl", "sample_ratio": "sampleRatio"}.get(field, "body")
        raise InvalidParameters([ParameterProblem(named, message or wrong)]) from None
    upstream = current.upstream.model_copy(update={"shadow": changed})
    result = live.take(current.model_copy(update={"upstream": upstream}))
    now = {"baseUrl": changed.base_url, "sampleRatio": changed.sample_ratio}
    return await _reloaded(request, result, "the shadow's change", {"shadow": now})


def _shadow_change(raw: bytes) -> dict[str, Any]:
    """The fields of a PUT /admin/shadow body; raises InvalidParameters naming what is
    wrong with it."""
    if len(raw) > _SHADOW_BODY_MAX:
        raise InvalidParameters([ParameterProblem("body", f"at most {_SHADOW_BODY_MAX} bytes")])
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not data:
        raise InvalidParameters(
            [ParameterProblem("body", "must be a JSON object with baseUrl or sampleRatio")]
        )
    problems = [
        ParameterProblem(str(name)[:80], "unknown field; allowed: baseUrl, sampleRatio")
        for name in data
        if name not in _SHADOW_FIELDS
    ]
    url, ratio = data.get("baseUrl"), data.get("sampleRatio")
    if url is not None and not isinstance(url, str):
        problems.append(ParameterProblem("baseUrl", "must be a URL (a string) or null"))
    if "sampleRatio" in data and (isinstance(ratio, bool) or not isinstance(ratio, int | float)):
        problems.append(ParameterProblem("sampleRatio", "must be a number from 0 to 1"))
    if problems:
        raise InvalidParameters(problems)
    return data


async def reset_shadow(request: web.Request) -> web.StreamResponse:
    """DELETE /admin/shadow: forget every comparison; the report starts again."""
    check_admin(request)
    _no_query(request)
    request.app[SHADOW].reset()
    log.info("shadow report reset", extra={"event": "shadow_reset"})
    body: dict[str, object] = {"reset": True}
    reach = await _tell_siblings(request, {"action": "shadow_reset"})
    if reach is not None and not reach.everywhere:
        return _not_everywhere(request, reach, "the reset")
    if reach is not None:
        body["workers"] = reach.as_json()
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def _no_query(request: web.Request) -> None:
    problems = [
        ParameterProblem(name, "unknown query parameter; none allowed") for name in request.query
    ]
    if problems:
        raise InvalidParameters(problems)


async def ttl_advice(request: web.Request) -> web.StreamResponse:
    """GET /admin/ttl: per route, the TTL now, the evidence of how often its answers
    change, and the TTL advised (gateway.ops.ttl_advice); never applied by itself."""
    check_admin(request)
    _no_query(request)
    policy, advice, traffic = request.app[METRICS].ttl_advice()
    body = {
        "maxStaleShare": policy.max_stale_share,
        "minTtl": policy.min_ttl_s,
        "maxTtl": policy.max_ttl_s,
        "routes": [
            {**item.as_json(), "traffic": traffic.get(item.route, Traffic()).as_json()}
            for item in advice
        ],
    }
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def unknown_admin_path(request: web.Request) -> web.StreamResponse:
    """Any method on a path under /admin that no admin route takes: 404, but only to
    the admin token's holder (401 to anyone else), so that no one learns without it
    which admin paths exist."""
    check_admin(request)
    raise web.HTTPNotFound()


# /admin and every path below it; the admin routes' own paths are matched first
ADMIN_PATHS = "/admin{tail:(/.*)?}"

# (path, route name, handlers by method); registered only when admin.token is set.
ADMIN_ROUTES: tuple[tuple[str, str, dict[str, Handler]], ...] = (
    ("/admin/cache", "admin-cache", {"DELETE": purge_cache}),
    ("/admin/config", "admin-config", {"GET": effective_config}),
    ("/admin/fleet", "admin-fleet", {"GET": fleet_readiness}),
    ("/admin/records/changed", "admin-records-changed", {"POST": records_changed}),
    ("/admin/reload", "admin-reload", {"POST": reload_config}),
    (
        "/admin/shadow",
        "admin-shadow",
        {"GET": shadow_report, "PUT": set_shadow, "DELETE": reset_shadow},
    ),
    ("/admin/shadow/answers/{requestId}", "admin-shadow-answers", {"GET": shadow_answers}),
    ("/admin/ttl", "admin-ttl", {"GET": ttl_advice}),
)

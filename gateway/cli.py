"""The command line: ``records-gateway`` (or ``python -m gateway``) and its subcommands.

serve          run the gateway
demo-upstream  run the reference upstream alone
check-config   validate the configuration and print it, secrets redacted
probe          check the configured upstream against the published schema
shadow-report  print the running gateway's report of its shadow traffic
shadow         point the running gateway's shadow traffic at a candidate, or turn it off
fleet          print every instance sharing the running gateway's cache, with its readiness
running-config print the running gateway's configuration in force, secrets redacted
ttl-advice     print the running gateway's TTL advice per route
compare        send the same requests to the configured upstream and to a candidate,
               and report every field in which their answers differ

What stops a command is said in one place, :func:`main`: one line on stderr naming
what and where (the key, the file, the address), never a traceback, and the exit
status. ``serve`` writes that line in the format of its logs (a JSON object with
``log.format = "json"``); the other commands write ``records-gateway COMMAND: ...``.

    0  done (probe and compare: and found nothing)
    1  the command failed: it cannot start (an address it cannot listen on, a folder
       it cannot write), cannot do its work (the upstream or the gateway cannot be
       reached), or found what it looks for (probe, compare)
    2  a usage or configuration error: a key, a flag, a file they name

An exception that is none of these is a bug and keeps its traceback (``serve`` logs it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import gateway.cache.registry  # noqa: F401  (declares the shipped cache backends to the settings)
from gateway import __version__
from gateway.config.settings import (
    Settings,
    UpstreamSettings,
    load_settings,
    log_format_of,
    redacted,
)
from gateway.errors import ConfigError, StartError
from gateway.probe.caller_token import TOKEN_ENV, caller_token

if TYPE_CHECKING:
    from gateway.demo.changes import ChangeRates
    from gateway.demo.drift import Drift
    from gateway.ops.logs import LogFormat
    from gateway.probe.conformance import ProbeReport
    from gateway.upstream.client import UpstreamClient

EXIT_FAILED = 1
EXIT_CONFIG = 2
# a request id, as the gateway makes and takes them (X-Request-ID)
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
# the largest shadow report shadow-report reads (a gateway's is far smaller)
_REPORT_MAX_BYTES = 16 * 1024 * 1024


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="records-gateway",
        description="Caching, normalising gateway for the Financial Records Read API.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the gateway")
    _config_option(serve)
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides server.port)")
    serve.add_argument(
        "--workers", type=int, help="processes sharing the port (overrides server.workers)"
    )
    serve.add_argument("--log-format", choices=("json", "text"), help="overrides log.format")
    serve.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), help="overrides log.level"
    )
    serve.add_argument(
        "--demo",
        action="store_true",
        help="also run the reference upstream in this process and point the gateway at it",
    )

    demo = commands.add_parser("demo-upstream", help="run the reference upstream alone")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=9090)
    demo.add_argument("--latency-ms", type=float, default=0.0, help="added to every answer")
    demo.add_argument("--seed", type=int, default=42, help="seed of the generated data set")
    demo.add_argument(
        "--token",
        action="append",
        dest="tokens",
        metavar="TOKEN",
        help="an accepted bearer token (repeatable; default: demo-token)",
    )
    demo.add_argument(
        "--tls-cert", type=Path, metavar="PEM", help="serve HTTPS with this certificate"
    )
    demo.add_argument("--tls-key", type=Path, metavar="PEM", help="the private key of --tls-cert")
    demo.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="PEM",
        help="require of every caller a client certificate this CA issued (mutual TLS)",
    )
    demo.add_argument(
        "--drift",
        action="append",
        metavar="KIND",
        help="answer unlike the data set in this known way, as a candidate twin (repeatable):"
        " amount-scale, order, drop-bank, enum-case or noise",
    )
    demo.add_argument(
        "--change-rate",
        action="append",
        dest="change_rates",
        metavar="KIND=PER_MINUTE",
        help="each record of KIND (users, clients, expenses or accounts) changes at random,"
        " PER_MINUTE times a minute on average, deterministically from --seed (repeatable)",
    )

    check = commands.add_parser("check-config", help="validate and print the configuration")
    _config_option(check)

    probe = commands.add_parser(
        "probe",
        help="call every route of the upstream once and report how it fits the published schema",
    )
    _config_option(probe)
    _token_options(probe, "bearer token for the upstream (never printed)")
    probe.add_argument("--json", action="store_true", help="print the report as JSON")

    shadow = commands.add_parser(
        "shadow-report",
        help="print the running gateway's report of its shadow traffic (GET /admin/shadow)",
    )
    _config_option(shadow)
    shadow.add_argument("--json", action="store_true", help="print the report as JSON")
    shadow.add_argument(
        "--answers",
        metavar="REQUEST_ID",
        help="print the primary's and the candidate's whole answers of one of the report's"
        " examples (GET /admin/shadow/answers/REQUEST_ID) instead",
    )

    running = commands.add_parser(
        "running-config",
        help="print the running gateway's configuration in force, secrets redacted"
        " (GET /admin/config)",
    )
    _config_option(running)

    fleet = commands.add_parser(
        "fleet",
        help="print every instance sharing the running gateway's cache, with its readiness"
        " (GET /admin/fleet)",
    )
    _config_option(fleet)
    fleet.add_argument("--json", action="store_true", help="print the instances as JSON")

    switch = commands.add_parser(
        "shadow",
        help="point the running gateway's shadow traffic at a candidate, change its share,"
        " or turn it off (PUT /admin/shadow), on every worker",
        description="Set upstream.shadow.base_url and sample_ratio of the running gateway as"
        " a reload of those keys would (a reload from the file later sets them as the file"
        " says). The candidate gets the callers' own tokens. Exit 0 when every worker took"
        " it, 1 otherwise, 2 on a usage or configuration error.",
    )
    _config_option(switch)
    what = switch.add_mutually_exclusive_group(required=True)
    what.add_argument("--candidate", metavar="URL", help="the candidate upstream's base URL")
    what.add_argument("--off", action="store_true", help="turn the shadow traffic off")
    switch.add_argument(
        "--ratio", type=float, metavar="SHARE", help="the share of upstream calls mirrored (0 to 1)"
    )
    switch.add_argument("--json", action="store_true", help="print the answer as JSON")

    ttl = commands.add_parser(
        "ttl-advice",
        help="print the running gateway's TTL advice per route (GET /admin/ttl)",
    )
    _config_option(ttl)
    ttl.add_argument("--json", action="store_true", help="print the advice as JSON")

    purge = commands.add_parser(
        "purge",
        help="purge the running gateway's cache (DELETE /admin/cache): records, a route,"
        " or everything",
        description="Purge the cache of the gateway the configuration describes, for every"
        " instance that shares it. Exit 0 when the purge is in force everywhere, 1 when"
        " the gateway says otherwise (send it again), 2 on a usage or configuration error.",
    )
    _config_option(purge)
    target = purge.add_mutually_exclusive_group()
    target.add_argument(
        "--record",
        action="append",
        metavar="KIND:ID",
        help="every entry that holds this record (expense, account, client or user); repeatable",
    )
    target.add_argument("--route", metavar="NAME", help="every entry of one route")
    target.add_argument("--all", action="store_true", help="every entry")
    purge.add_argument(
        "--soft",
        action="store_true",
        help="with --record: mark the entries stale (served while refreshed) instead",
    )
    purge.add_argument("--json", action="store_true", help="print the answer as JSON")

    compare = commands.add_parser(
        "compare",
        help="send the same requests to the configured upstream (twice) and to a candidate"
        " and report every field in which their answers differ",
        description="Send the same requests to the configured upstream (upstream.base_url,"
        " asked twice to tell noise from differences) and to a candidate upstream, and"
        " report every field in which the candidate's answers differ, noise apart. Exit 0"
        " when nothing but noise differs, 1 otherwise, 2 on a usage or configuration error.",
    )
    _config_option(compare)
    compare.add_argument(
        "--candidate",
        required=True,
        metavar="URL",
        help="base URL of the candidate upstream; for https, TLS keys from [upstream.shadow]",
    )
    _token_options(
        compare, "bearer token, sent to BOTH upstreams (never printed, never in the report)"
    )
    compare.add_argument(
        "--requests",
        type=Path,
        metavar="FILE",
        help="one path?query a line as sent to the gateway (/expenses?type=BANK);"
        " default: a sample made from the configured upstream's own data",
    )
    compare.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def _config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=Path, metavar="PATH", help="TOML config file (see config.example.toml)"
    )


def _token_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--token-file`` or ``--token``, else the environment (gateway.probe.caller_token)."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help=f"file holding the {what}; a trailing line break is dropped",
    )
    source.add_argument(
        "--token",
        metavar="T",
        help=f"the {what}; other users of the machine can read it in the process list"
        f" for the whole run: prefer --token-file or {TOKEN_ENV}",
    )


def _caller_token(args: argparse.Namespace) -> str:
    """The caller token of probe and compare; exit 2 naming its source when there is
    none that can be used."""
    try:
        return caller_token(args.token, args.token_file, os.environ)
    except ConfigError as exc:
        _fail(str(exc), EXIT_CONFIG)


class CommandFailed(Exception):
    """What stops a command that is neither its configuration nor its start (a usage
    error, a gateway that cannot be asked): the line :func:`main` prints and the exit
    status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int) -> NoReturn:
    raise CommandFailed(message, code)


async def _probe(settings: Settings, token: str) -> ProbeReport:
    from gateway.probe.conformance import run_probe
    from gateway.upstream.client import UpstreamClient
    from gateway.upstream.link import UpstreamLink

    async with UpstreamLink(settings.upstream) as link:
        upstream = UpstreamClient(link, settings.upstream)
        await _reachable(upstream)
        return await run_probe(upstream, token)


async def _reachable(upstream: UpstreamClient) -> None:
    """Fail (exit 1) when the upstream cannot be reached at all (refused, a name that
    does not resolve, TLS, no answer in time): one line, not a report of the same
    failure on every route. One that answers, even 5xx, is for the report."""
    from gateway.errors import UpstreamFailed, UpstreamUnavailable

    try:
        await upstream.check()
    except UpstreamUnavailable as exc:
        why = exc.detail.removeprefix("readiness check: ")
        _fail(
            f"the upstream at {upstream.base_url} (upstream.base_url): {why}",
            EXIT_FAILED,
        )
    except UpstreamFailed:
        pass  # it answers: how each route does is the report's


async def _check_reachable(settings: UpstreamSettings) -> None:
    from gateway.upstream.client import UpstreamClient
    from gateway.upstream.link import UpstreamLink

    async with UpstreamLink(settings) as link:
        await _reachable(UpstreamClient(link, settings))


async def _admin_get(
    settings: Settings,
    path: str,
    *,
    method: str = "GET",
    query: Sequence[tuple[str, str]] = (),
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``method`` ``path`` (an admin route) of the gateway the settings describe (on
    this machine when it listens on every address), as JSON. Fails with exit 2 without
    an admin token, with exit 1 when the gateway cannot be asked or answers other
    than 200 (its problem's detail said)."""
    import aiohttp
    from yarl import URL

    token = settings.admin.token
    if token is None:
        _fail("admin.token is not set, so the gateway has no admin routes", EXIT_CONFIG)
    host = settings.server.host
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    url = URL.build(scheme="http", host=host, port=settings.server.port, path=path, query=query)
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.request(method, url, headers=headers, json=body) as response,
        ):
            status = response.status
            answered = b""
            async for chunk in response.content.iter_chunked(64 * 1024):
                answered += chunk
                if len(answered) > _REPORT_MAX_BYTES:
                    _fail(f"{url} answered more than a report's size", EXIT_FAILED)
    except (aiohttp.ClientError, TimeoutError) as exc:
        _fail(f"cannot ask the gateway at {url}: {exc or type(exc).__name__}", EXIT_FAILED)
    try:
        data = json.loads(answered)
    except ValueError:
        data = None
    if status != 200 or not isinstance(data, dict):
        detail = data.get("detail") if isinstance(data, dict) else None
        _fail(f"{url} answered {status}: {detail or answered[:200]!r}", EXIT_FAILED)
    return data


def _print_report(
    report: dict[str, Any], as_json: bool, text: Callable[[dict[str, Any]], str]
) -> None:
    """Print what an admin route answered, as JSON or as ``text`` makes it (exit 1
    when it is not the report expected)."""
    try:
        print(json.dumps(report, indent=2) if as_json else text(report))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        _fail(f"the gateway's answer is not the report expected ({exc!r})", EXIT_FAILED)


def _check_config(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    print(json.dumps(redacted(settings), indent=2, sort_keys=False))
    return 0


def _probe_command(args: argparse.Namespace) -> int:
    from gateway.probe.report import to_json, to_text

    settings = load_settings(args.config)
    report = asyncio.run(_probe(settings, _caller_token(args)))
    print(to_json(report) if args.json else to_text(report))
    return report.exit_code


def _shadow_report(args: argparse.Namespace) -> int:
    from gateway.comparison import terminal

    settings = load_settings(args.config)
    if args.answers is not None:
        if not _REQUEST_ID.fullmatch(args.answers):
            _fail("--answers: a request id is 1 to 128 of A-Z a-z 0-9 . _ -", EXIT_CONFIG)
        path = "/admin/shadow/answers/" + args.answers
        answers = asyncio.run(_admin_get(settings, path))
        _print_report(answers, args.json, terminal.answers_text)
        return 0
    shadow = asyncio.run(_admin_get(settings, "/admin/shadow"))
    _print_report(shadow, args.json, terminal.to_text)
    return 0


def _running_config(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    answer = asyncio.run(_admin_get(settings, "/admin/config"))
    _print_report(answer, True, str)
    return 0


def _fleet(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    answer = asyncio.run(_admin_get(settings, "/admin/fleet"))
    _print_report(answer, args.json, _fleet_text)
    return 0


def _fleet_text(answer: dict[str, Any]) -> str:
    lines = [f"{'instance':<40} {'status':<9} {'circuit':<10} {'seen':>6}  components"]
    for item in answer["instances"]:
        parts = ", ".join(f"{name} {status}" for name, status in item["components"].items())
        seen = f"{item['secondsAgo']:.0f} s" if "secondsAgo" in item else "now"
        name = item["instance"] + (" (this)" if item["mine"] else "")
        circuit = item.get("circuit") or "-"
        lines.append(f"{name:<40} {item['status']:<9} {circuit:<10} {seen:>6}  {parts}")
    return "\n".join(lines)


def _shadow(args: argparse.Namespace) -> int:
    """The ``shadow`` command: what PUT /admin/shadow takes, from the flags."""
    settings = load_settings(args.config)
    change: dict[str, Any] = {"sampleRatio": 0.0} if args.off else {"baseUrl": args.candidate}
    if args.ratio is not None:
        if args.off:
            _fail("--ratio: not with --off", EXIT_CONFIG)
        change["sampleRatio"] = args.ratio
    answer = asyncio.run(_admin_get(settings, "/admin/shadow", method="PUT", body=change))
    _print_report(answer, args.json, _shadow_text)
    return 0


def _shadow_text(answer: dict[str, Any]) -> str:
    shadow = answer["shadow"]
    state = "off" if not shadow["baseUrl"] or not shadow["sampleRatio"] else "on"
    return (
        f"shadow traffic {state}: candidate {shadow['baseUrl'] or '-'},"
        f" {shadow['sampleRatio']:.0%} of upstream calls; applied: "
        + (", ".join(answer["applied"]) or "nothing changed")
    )


def _ttl_advice(args: argparse.Namespace) -> int:
    from gateway.ops.ttl_advice import to_table

    settings = load_settings(args.config)
    advice = asyncio.run(_admin_get(settings, "/admin/ttl"))
    _print_report(advice, args.json, to_table)
    return 0


def _purge(args: argparse.Namespace) -> int:
    """The ``purge`` command: exit 2 before any request when what to purge is not
    said or a reference is bad; exit 1 when the gateway does not answer 200 (a purge
    whose outcome is unknown among them: send it again)."""
    from gateway.normalise.holdings import BadReference, parse_ref

    query: list[tuple[str, str]] = []
    if args.record:
        for text in args.record:
            try:
                query.append(("record", str(parse_ref(text))))
            except BadReference as exc:
                _fail(f"--record {text!r}: {exc}", EXIT_CONFIG)
        if args.soft:
            query.append(("mode", "soft"))
    elif args.soft:
        _fail("--soft goes with --record", EXIT_CONFIG)
    elif args.route is not None:
        query.append(("route", args.route))
    elif not args.all:
        _fail("say what to purge: --record KIND:ID, --route NAME or --all", EXIT_CONFIG)
    settings = load_settings(args.config)
    answer = asyncio.run(_admin_get(settings, "/admin/cache", method="DELETE", query=query))
    _print_report(answer, args.json, _purge_text)
    return 0


def _purge_text(answer: dict[str, Any]) -> str:
    """One line of what a purge reached."""
    if answer["purged"] == "records":
        what = f"{answer['entries']} entries holding {', '.join(answer['records'])}"
        what += " marked stale" if answer["mode"] == "soft" else " purged"
    else:
        what = f"purged {answer['purged']}"
    reached = answer.get("instances") or answer.get("workers")
    if reached is not None:
        kind = "instances" if "instances" in answer else "workers"
        what += f"; {reached['confirmed']} of {reached['told']} {kind} confirmed"
    return what


def _compare(args: argparse.Namespace) -> int:
    """The ``compare`` command: exit 2 before any request when the candidate's URL,
    the requests file or the configuration is wrong; exit 1 when the configured
    upstream cannot be reached at all."""
    from gateway.probe.replay import (
        bearer,
        candidate_settings,
        compare_upstreams,
        to_json,
        to_text,
    )
    from gateway.probe.sample import read_requests

    settings = load_settings(args.config)
    max_limit = settings.limits.max_limit
    token = _caller_token(args)
    try:
        bearer(token)
        candidate = candidate_settings(settings.upstream, args.candidate)
        queries = (
            None if args.requests is None else read_requests(args.requests, max_limit=max_limit)
        )
    except ConfigError as exc:
        _fail(str(exc), EXIT_CONFIG)
    asyncio.run(_check_reachable(settings.upstream))
    comparison = asyncio.run(
        compare_upstreams(
            settings.upstream,
            candidate,
            token,
            max_limit=max_limit,
            queries=queries,
            source="generated" if args.requests is None else str(args.requests),
        )
    )
    print(to_json(comparison) if args.json else to_text(comparison))
    return comparison.exit_code


def _demo_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The reference upstream's TLS context from its flags (exit 2 when they do not
    load, naming the file that does not)."""
    from gateway.demo.server import tls_context

    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            _fail("--tls-client-ca needs --tls-cert and --tls-key", EXIT_CONFIG)
        return None
    if args.tls_cert is None or args.tls_key is None:
        _fail("--tls-cert and --tls-key go together", EXIT_CONFIG)
    for flag, path in (
        ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key),
        ("--tls-client-ca", args.tls_client_ca),
    ):
        if path is None:
            continue
        try:
            path.open("rb").close()
        except OSError as exc:
            _fail(f"{flag} {path}: cannot be read ({exc.strerror or exc})", EXIT_CONFIG)
    try:
        return tls_context(args.tls_cert, args.tls_key, args.tls_client_ca)
    except (OSError, ssl.SSLError) as exc:
        _fail(f"the TLS files do not load: {exc}", EXIT_CONFIG)


def _demo_drift(args: argparse.Namespace) -> Drift:
    """The reference upstream's drift from its flags (exit 2 for an unknown kind)."""
    from gateway.demo.drift import Drift

    try:
        return Drift.of(args.drift or ())
    except ValueError as exc:
        _fail(str(exc), EXIT_CONFIG)


def _demo_change_rates(args: argparse.Namespace) -> ChangeRates:
    """The reference upstream's change rates from its flags (exit 2 for a bad one)."""
    from gateway.demo.changes import ChangeRates

    try:
        return ChangeRates.parse(args.change_rates or ())
    except ValueError as exc:
        _fail(f"--change-rate: {exc}", EXIT_CONFIG)


def _demo_upstream(args: argparse.Namespace) -> int:
    from gateway.demo import CannotListen, run_demo_upstream
    from gateway.process.worker import cannot_listen

    try:
        run_demo_upstream(
            host=args.host,
            port=args.port,
            latency_ms=args.latency_ms,
            seed=args.seed,
            tokens=frozenset(args.tokens or ["demo-token"]),
            tls=_demo_tls(args),
            drift=_demo_drift(args),
            change_rates=_demo_change_rates(args),
        )
    except CannotListen as exc:
        raise cannot_listen(args.host, args.port, exc.error, "--host, --port") from None
    return 0


def _serve(args: argparse.Namespace) -> int:
    from gateway.config.live import ConfigSource
    from gateway.process.supervisor import main_serve

    overrides = _serve_overrides(args)
    settings = load_settings(args.config, overrides)
    return main_serve(settings, ConfigSource(args.config, overrides), demo=args.demo)


def _serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings serve's flags set (over the file and the environment)."""
    server: dict[str, Any] = {}
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    if args.workers is not None:
        server["workers"] = args.workers
    logging_: dict[str, Any] = {}
    if args.log_format is not None:
        logging_["format"] = args.log_format
    if args.log_level is not None:
        logging_["level"] = args.log_level
    overrides: dict[str, Any] = {"server": server} if server else {}
    if logging_:
        overrides["log"] = logging_
    return overrides


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": _serve,
    "demo-upstream": _demo_upstream,
    "check-config": _check_config,
    "probe": _probe_command,
    "shadow-report": _shadow_report,
    "shadow": _shadow,
    "fleet": _fleet,
    "running-config": _running_config,
    "ttl-advice": _ttl_advice,
    "compare": _compare,
    "purge": _purge,
}


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the console script and of ``python -m gateway``: run the command,
    and say what stopped it in one line (see the module's docstring)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        code = _COMMANDS[args.command](args)
    except (ConfigError, StartError) as exc:
        from gateway.ops.logs import report_stop

        report_stop(_log_format(args), exc, command=args.command)
        code = EXIT_CONFIG if isinstance(exc, ConfigError) else EXIT_FAILED
    except CommandFailed as exc:
        from gateway.ops.logs import report_failure

        prefix = f"records-gateway {args.command}"
        report_failure(_log_format(args), str(exc), prefix=prefix, event="failed")
        code = exc.code
    if code:
        raise SystemExit(code)


def _log_format(args: argparse.Namespace) -> LogFormat | None:
    """The format of the line that says why ``args.command`` stops: serve's logs' (read
    alone when the settings do not load); None, a plain line, for the other commands."""
    if args.command != "serve":
        return None
    return log_format_of(args.config, _serve_overrides(args))

"""TLS to the upstream: the reference upstream served over HTTPS with a CA the test
makes (trustme), a private CA trusted through ``upstream.ca_file``, mutual TLS with a
client certificate, ``tls_verify = false``, files that do not load, and a reload that
reads the files again."""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestClient
from cryptography.hazmat.primitives import serialization
from pytest_aiohttp import AiohttpClient

from gateway.cli import CommandFailed, _probe
from gateway.config.live import ConfigSource
from gateway.config.settings import load_settings
from gateway.demo import REQUEST_LOG
from gateway.demo.server import DemoServer, start_demo_server, tls_context
from gateway.errors import ConfigError
from gateway.http.admin import SHADOW
from gateway.http.app import create_app
from gateway.http.binding import UPSTREAMS

from ..conftest import AUTH, TOKEN, gateway_client, make_settings
from ..test_cli import free_port, run_cli

Client = TestClient[web.Request, web.Application]
ADMIN = "admin-token-0123456789abcdef"


@dataclass
class Pki:
    """A server CA and its certificate for 127.0.0.1, a client CA and a client
    certificate it issued, and a CA nobody uses, all as PEM files."""

    directory: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_ca: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    encrypted_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca, client_ca, other_ca = trustme.CA(), trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = client_ca.issue_cert("records-gateway@example.test")
    files = Pki(
        directory,
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
        directory / "client-ca.pem",
        directory / "client.pem",
        directory / "client.key",
        directory / "other-ca.pem",
        directory / "client-encrypted.key",
    )
    ca.cert_pem.write_to_path(str(files.ca))
    server.cert_chain_pems[0].write_to_path(str(files.server_cert))
    server.private_key_pem.write_to_path(str(files.server_key))
    client_ca.cert_pem.write_to_path(str(files.client_ca))
    client.cert_chain_pems[0].write_to_path(str(files.client_cert))
    client.private_key_pem.write_to_path(str(files.client_key))
    other_ca.cert_pem.write_to_path(str(files.other_ca))
    key = serialization.load_pem_private_key(client.private_key_pem.bytes(), password=None)
    files.encrypted_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pass phrase"),
        )
    )
    return files


@pytest.fixture
async def https_upstream(pki: Pki) -> AsyncIterator[DemoServer]:
    """The reference upstream over HTTPS, its certificate from ``pki.ca``."""
    async with await start_demo_server(tls=tls_context(pki.server_cert, pki.server_key)) as server:
        yield server


@pytest.fixture
async def mtls_upstream(pki: Pki) -> AsyncIterator[DemoServer]:
    """The reference upstream over HTTPS requiring a client certificate of ``pki.client_ca``."""
    context = tls_context(pki.server_cert, pki.server_key, pki.client_ca)
    async with await start_demo_server(tls=context) as server:
        yield server


async def start(aiohttp_client: AiohttpClient, url: str, **upstream: Any) -> Client:
    settings = make_settings(url, upstream=upstream, cache={"backend": "none"})
    return await gateway_client(aiohttp_client, create_app(settings))


async def users(client: Client) -> tuple[int, Any]:
    response = await client.get("/users", headers=AUTH)
    return response.status, await response.json(content_type=None)


async def test_an_upstream_behind_a_private_ca_is_reached_through_ca_file(
    aiohttp_client: AiohttpClient, https_upstream: DemoServer, pki: Pki
) -> None:
    assert https_upstream.url.startswith("https://")
    client = await start(aiohttp_client, https_upstream.url, ca_file=str(pki.ca))
    status, body = await users(client)
    assert status == 200
    assert body["data"][0]["username"]


async def test_an_unknown_ca_is_a_502_that_says_the_certificate_was_not_trusted(
    aiohttp_client: AiohttpClient, https_upstream: DemoServer, pki: Pki
) -> None:
    # the system's trust store (no ca_file), then a ca_file of another CA: it replaces
    # the system's store rather than adding to it
    """Held for docs/deployment.md, "When the upstream fails": presents a certificate the gateway
    does not trust.
    """
    for upstream in ({}, {"ca_file": str(pki.other_ca)}):
        client = await start(aiohttp_client, https_upstream.url, **upstream)
        status, body = await users(client)
        assert status == 502
        assert body["type"] == "urn:records-gateway:problem:upstream-unavailable"
        assert "the upstream's TLS certificate was not trusted" in body["detail"]
        assert TOKEN not in str(body)


async def test_ca_file_replaces_the_system_trust_store_rather_than_adding_to_it(
    aiohttp_client: AiohttpClient,
    https_upstream: DemoServer,
    pki: Pki,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a "system" trust store (OpenSSL's default paths) that trusts the upstream's CA
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    system = ssl.create_default_context()
    url = https_upstream.url + "/users"
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=AUTH, ssl=system) as got,
    ):
        assert got.status == 200, "the system store trusts the upstream"
    # with ca_file naming another CA, the system's store is not consulted
    client = await start(aiohttp_client, https_upstream.url, ca_file=str(pki.other_ca))
    status, body = await users(client)
    assert status == 502
    assert "not trusted" in body["detail"]


async def test_an_upstream_that_requires_a_client_certificate_gets_one(
    aiohttp_client: AiohttpClient, mtls_upstream: DemoServer, pki: Pki
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": asks for a client certificate the
    gateway does not send.
    """
    with_cert = await start(
        aiohttp_client,
        mtls_upstream.url,
        ca_file=str(pki.ca),
        client_cert_file=str(pki.client_cert),
        client_key_file=str(pki.client_key),
    )
    assert (await users(with_cert))[0] == 200

    without = await start(aiohttp_client, mtls_upstream.url, ca_file=str(pki.ca))
    status, body = await users(without)
    assert status == 502
    assert body["type"] == "urn:records-gateway:problem:upstream-unavailable"
    assert "set upstream.client_cert_file and upstream.client_key_file" in body["detail"]


async def test_tls_verify_false_reaches_any_certificate_and_warns_at_start(
    aiohttp_client: AiohttpClient,
    https_upstream: DemoServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.upstream")
    client = await start(aiohttp_client, https_upstream.url, tls_verify=False)
    assert (await users(client))[0] == 200
    warnings = [r for r in caplog.records if getattr(r, "event", None) == "upstream_tls"]
    assert len(warnings) == 1
    assert warnings[0].levelname == "WARNING"
    assert "tls_verify is false" in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"ca_file": "garbage"}, "upstream.ca_file"),
        ({"ca_file": "missing"}, "upstream.ca_file"),
        ({"client_cert_file": "garbage", "client_key_file": "client_key"}, "client_cert_file"),
        ({"client_cert_file": "client_cert", "client_key_file": "missing"}, "client_key_file"),
        ({"client_cert_file": "client_cert", "client_key_file": "server_key"}, "client_key_file"),
        (
            {"client_cert_file": "client_cert", "client_key_file": "encrypted_key"},
            "client_key_file",
        ),
        ({"client_cert_file": "client_cert"}, "upstream.client_cert_file"),
        ({"client_key_file": "client_key"}, "upstream.client_key_file"),
    ],
)
def test_a_tls_file_that_does_not_load_is_a_configuration_error_naming_its_key(
    pki: Pki, keys: dict[str, str], named: str
) -> None:
    garbage = pki.directory / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    paths = {"garbage": garbage, "missing": pki.directory / "missing.pem"}
    upstream = {key: str(paths.get(name) or getattr(pki, name)) for key, name in keys.items()}
    with pytest.raises(ConfigError) as raised:
        load_settings(None, {"upstream": {"base_url": "https://127.0.0.1:1", **upstream}})
    assert str(raised.value).startswith(f"upstream.{named.removeprefix('upstream.')}: ")


def test_tls_keys_need_an_https_upstream(pki: Pki) -> None:
    with pytest.raises(ConfigError, match=r"^upstream\.ca_file: used only with an https://"):
        load_settings(
            None, {"upstream": {"base_url": "http://127.0.0.1:1", "ca_file": str(pki.ca)}}
        )


async def test_serve_exits_2_naming_the_tls_key_that_does_not_load(
    pki: Pki, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[upstream]\nbase_url = "https://127.0.0.1:1"\nca_file = "{pki.directory / "nope.pem"}"\n'
    )
    for command in ("serve", "check-config", "probe"):
        extra = ("--token", "x") if command == "probe" else ()
        code, _, err = await run_cli(command, "--config", str(config), *extra)
        assert code == 2, command
        assert "upstream.ca_file:" in err
        assert "Traceback" not in err


async def test_a_reload_reads_the_ca_file_again(
    aiohttp_client: AiohttpClient, https_upstream: DemoServer, pki: Pki, tmp_path: Path
) -> None:
    ca_file = tmp_path / "upstream-ca.pem"
    ca_file.write_bytes(pki.ca.read_bytes())
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[upstream]\nbase_url = "{https_upstream.url}"\nca_file = "{ca_file}"\n'
        f'[cache]\nbackend = "none"\n[admin]\ntoken = "{ADMIN}"\n'
    )
    source = ConfigSource(config)
    client = await gateway_client(aiohttp_client, create_app(source.load(), source=source))
    assert (await users(client))[0] == 200
    link = client.app[UPSTREAMS].current.pipeline.upstream._link
    context = link._ssl
    response = await client.post("/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
    assert response.status == 200
    assert link._ssl is context, "nothing changed: the context and its pooled connections stay"

    # the same path, another CA's certificate in it: trusted after the reload only
    ca_file.write_bytes(pki.other_ca.read_bytes())
    assert (await users(client))[0] == 200
    response = await client.post("/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
    assert response.status == 200
    status, body = await users(client)
    assert status == 502
    assert "not trusted" in body["detail"]

    # a file that no longer loads: the reload is refused, the running context stays
    ca_file.write_bytes(pki.ca.read_bytes())
    assert (
        await client.post("/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
    ).status == 200
    assert (await users(client))[0] == 200
    ca_file.write_text("not a certificate")
    response = await client.post("/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
    body = await response.json(content_type=None)
    assert response.status == 422
    assert "upstream.ca_file:" in body["detail"]
    assert (await users(client))[0] == 200


async def test_the_probe_uses_the_same_tls_settings(https_upstream: DemoServer, pki: Pki) -> None:
    trusted = load_settings(
        None, {"upstream": {"base_url": https_upstream.url, "ca_file": str(pki.ca)}}
    )
    report = await _probe(trusted, TOKEN)
    assert report.exit_code == 0
    untrusted = load_settings(None, {"upstream": {"base_url": https_upstream.url}})
    with pytest.raises(CommandFailed) as failed:
        await _probe(untrusted, TOKEN)
    assert failed.value.code == 1
    assert str(failed.value) == (
        f"the upstream at {https_upstream.url} (upstream.base_url): the upstream's TLS"
        " certificate was not trusted (unable to get local issuer certificate)"
    )


async def test_demo_upstream_serves_https_and_asks_for_client_certificates(pki: Pki) -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "gateway", "demo-upstream", "--port", str(port)),
        *("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)),
        *("--tls-client-ca", str(pki.client_ca)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert line.decode().strip() == f"reference upstream listening on https://127.0.0.1:{port}"
        trusted = ssl.create_default_context(cafile=str(pki.ca))
        mutual = ssl.create_default_context(cafile=str(pki.ca))
        mutual.load_cert_chain(str(pki.client_cert), str(pki.client_key))
        url = f"https://127.0.0.1:{port}/users"
        async with aiohttp.ClientSession() as session:
            async with session.get(url, headers=AUTH, ssl=mutual) as response:
                assert response.status == 200
            with pytest.raises(aiohttp.ClientError):
                async with session.get(url, headers=AUTH, ssl=trusted) as response:
                    await response.read()
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def test_tls_keys_go_with_a_new_base_url(
    aiohttp_client: AiohttpClient, https_upstream: DemoServer, pki: Pki, tmp_path: Path
) -> None:
    """Held for docs/switching-upstreams.md, "4. Switch": the TLS keys go with the URL; a file that
    does not load refuses the reload.
    """
    async with await start_demo_server() as plain:
        config = tmp_path / "gateway.toml"
        tail = f'[cache]\nbackend = "none"\n[admin]\ntoken = "{ADMIN}"\n'
        config.write_text(f'[upstream]\nbase_url = "{plain.url}"\n' + tail)
        source = ConfigSource(config)
        client = await gateway_client(aiohttp_client, create_app(source.load(), source=source))
        assert (await users(client))[0] == 200
        admin = {"Authorization": f"Bearer {ADMIN}"}

        # to the upstream behind a private CA, with that CA: both applied together
        config.write_text(
            f'[upstream]\nbase_url = "{https_upstream.url}"\nca_file = "{pki.ca}"\n' + tail
        )
        response = await client.post("/admin/reload", headers=admin)
        result = await response.json()
        assert result["applied"] == ["upstream.base_url", "upstream.ca_file"]
        assert result["needsRestart"] == []
        assert (await users(client))[0] == 200
        assert len(https_upstream.app[REQUEST_LOG].for_path("/users")) == 1

        # and back to plain HTTP, which takes no TLS keys
        config.write_text(f'[upstream]\nbase_url = "{plain.url}"\n' + tail)
        response = await client.post("/admin/reload", headers=admin)
        result = await response.json()
        assert result["applied"] == ["upstream.base_url", "upstream.ca_file"]
        assert (await users(client))[0] == 200
        assert len(plain.app[REQUEST_LOG].for_path("/users")) == 2
        assert len(https_upstream.app[REQUEST_LOG].for_path("/users")) == 1


async def test_a_new_base_url_whose_ca_file_does_not_load_is_refused(
    aiohttp_client: AiohttpClient, https_upstream: DemoServer, pki: Pki, tmp_path: Path
) -> None:
    """Held for docs/switching-upstreams.md, "4. Switch": the TLS keys go with the URL; a file that
    does not load refuses the reload.
    """
    async with await start_demo_server() as plain:
        config = tmp_path / "gateway.toml"
        tail = f'[cache]\nbackend = "none"\n[admin]\ntoken = "{ADMIN}"\n'
        config.write_text(f'[upstream]\nbase_url = "{plain.url}"\n' + tail)
        source = ConfigSource(config)
        client = await gateway_client(aiohttp_client, create_app(source.load(), source=source))
        broken = tmp_path / "broken-ca.pem"
        broken.write_text("not a certificate")
        config.write_text(
            f'[upstream]\nbase_url = "{https_upstream.url}"\nca_file = "{broken}"\n' + tail
        )
        response = await client.post("/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
        assert response.status == 422
        assert "upstream.ca_file:" in (await response.json(content_type=None))["detail"]
        assert (await users(client))[0] == 200
        assert len(plain.app[REQUEST_LOG].for_path("/users")) == 1
        assert len(https_upstream.app[REQUEST_LOG]) == 0


async def test_a_reload_reads_the_shadow_candidates_ca_file_again(
    aiohttp_client: AiohttpClient, https_upstream: DemoServer, pki: Pki, tmp_path: Path
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": a reload
    reads the candidate's TLS files again.
    """
    ca_file = tmp_path / "candidate-ca.pem"
    ca_file.write_bytes(pki.ca.read_bytes())
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with await start_demo_server() as primary:
        config = tmp_path / "gateway.toml"
        config.write_text(
            f'[upstream]\nbase_url = "{primary.url}"\n'
            f'[upstream.shadow]\nbase_url = "{https_upstream.url}"\nsample_ratio = 1.0\n'
            f'ca_file = "{ca_file}"\n[admin]\ntoken = "{ADMIN}"\n'
        )
        source = ConfigSource(config)
        client = await gateway_client(aiohttp_client, create_app(source.load(), source=source))

        async def report_after(target: str) -> dict[str, Any]:
            assert (await client.get(target, headers=AUTH)).status == 200
            async with asyncio.timeout(10):
                while client.app[SHADOW].in_flight:
                    await asyncio.sleep(0.01)
            response = await client.get("/admin/shadow", headers=admin)
            totals: dict[str, Any] = (await response.json())["totals"]
            return totals

        assert (await report_after("/users?page=1"))["identical"] == 1
        # the same path, another CA in it: the candidate is no longer trusted
        ca_file.write_bytes(pki.other_ca.read_bytes())
        assert (await client.post("/admin/reload", headers=admin)).status == 200
        assert (await report_after("/users?page=2"))["candidateErrors"] == 1
        await client.close()

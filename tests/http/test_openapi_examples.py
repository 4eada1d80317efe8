"""The examples of the OpenAPI document are real answers, and valid where they stand.

gateway/http/openapi_examples.json holds answers of the gateway in front of the
reference upstream; these tests ask again and fail when an answer changed (`make
openapi-examples` records them anew), and hold every example of the document to the
schema of the response or parameter it illustrates.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from gateway.config.settings import Settings
from gateway.http.openapi import EXAMPLES_FILE, openapi_document

from .openapi_examples import encode, record

Gateway = TestClient[web.Request, web.Application]
_BASE = "https://records-gateway.invalid/openapi.json"


async def test_the_examples_are_what_the_gateway_answers_now(gateway: Gateway) -> None:
    """Held for docs/openapi.md, "How it is checked"."""
    recorded = EXAMPLES_FILE.read_text(encoding="utf-8")
    assert encode(await record(gateway)) == recorded, "run `make openapi-examples`"


def _validator(document: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    registry: Registry[Any] = Registry().with_resource(_BASE, DRAFT202012.create_resource(document))
    resolved = {"$ref": _BASE + schema["$ref"]} if "$ref" in schema else schema
    return Draft202012Validator(
        resolved, registry=registry, format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def _media_examples(document: dict[str, Any]) -> list[tuple[str, dict[str, Any], Any]]:
    """(where, schema, example) of every example of a response body."""
    responses = [
        (f"components.responses.{name}", response)
        for name, response in document["components"]["responses"].items()
    ]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                responses.append((f"{method} {path} {status}", response))
    return [
        (f"{where} ({name})", media["schema"], example)
        for where, response in responses
        for media in response.get("content", {}).values()
        for name, example in media.get("examples", {}).items()
    ]


def test_every_example_is_a_recorded_answer_valid_under_its_schema() -> None:
    """Held for docs/openapi.md, "How it is checked"."""
    document = openapi_document(Settings.model_validate({"admin": {"token": "a" * 20}}))
    recorded = json.loads(EXAMPLES_FILE.read_text(encoding="utf-8"))
    bodies = [example["body"] for example in recorded.values()]
    examples = _media_examples(document)
    # every recorded answer is shown, once
    shown = [example["value"] for _, _, example in examples]
    assert len(shown) == len(bodies)
    assert all(body in shown for body in bodies)
    for where, schema, example in examples:
        assert example["value"] in bodies, where
        _validator(document, schema).validate(example["value"])
        assert example["summary"].split(" ")[0] in ("GET", "POST")
    # each problem example stands under the status it was answered with
    for name, response in document["components"]["responses"].items():
        for media in response.get("content", {}).values():
            for example in media.get("examples", {}).values():
                status = example["value"]["status"]
                assert (
                    name
                    == {
                        400: "BadRequest",
                        401: "Unauthenticated",
                        404: "NotFound",
                        405: "MethodNotAllowed",
                    }[status]
                )


def test_every_parameter_has_a_valid_example_from_the_recorded_answers() -> None:
    document = openapi_document(Settings())
    recorded = json.loads(EXAMPLES_FILE.read_text(encoding="utf-8"))
    expense = recorded["expense"]["body"]
    for name, parameter in document["components"]["parameters"].items():
        if parameter["in"] == "header":
            continue
        assert "example" in parameter, name
        _validator(document, parameter["schema"]).validate(parameter["example"])
    parameters = document["components"]["parameters"]
    assert parameters["expenseId"]["example"] == expense["id"]
    assert parameters["accountId"]["example"] == recorded["account"]["body"]["id"]
    assert parameters["amount"]["example"] == expense["amount"]

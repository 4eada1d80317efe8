"""The configuration reference, written from the settings model: every key with its
type, default, bounds, whether a reload applies it, its environment variable and its
description (the docstring under the key in :mod:`gateway.config.settings`).

Two texts are made from it: the documentation site's configuration page
(:func:`reference_markdown`, at build time) and ``config.example.toml``
(:func:`example_toml`, written by ``make config-example`` and compared with the file by
the tests), so that neither can drift from the model.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.config.live import applied_by_reload
from gateway.config.settings import Settings

ENV_PREFIX = "GATEWAY_"


@dataclass(frozen=True, slots=True)
class Key:
    """One key of the configuration, as the reference shows it."""

    dotted: str
    type: str
    default: Any
    bounds: tuple[str, ...]
    live: bool
    secret: bool
    description: str
    example: Any = None

    @property
    def section(self) -> str:
        return self.dotted.rpartition(".")[0]

    @property
    def name(self) -> str:
        return self.dotted.rpartition(".")[2]

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dotted.upper().replace(".", "__")


@dataclass(frozen=True, slots=True)
class Section:
    """A table of the configuration file (``[cache.ttl_s]``) and the keys directly in it."""

    dotted: str
    summary: str
    keys: tuple[Key, ...]


def sections(model: type[BaseModel] = Settings) -> list[Section]:
    """Every section of ``model`` that holds keys, in the model's order."""
    return list(_sections(model, ""))


def _sections(model: type[BaseModel], prefix: str) -> Iterator[Section]:
    keys: list[Key] = []
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{name}"
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            nested.append((dotted, annotation))
        else:
            keys.append(_key(dotted, info))
    if keys:
        yield Section(prefix.rstrip("."), _summary(model), tuple(keys))
    for dotted, sub in nested:
        yield from _sections(sub, f"{dotted}.")


def _summary(model: type[BaseModel]) -> str:
    """The first paragraph of a section model's docstring, on one line."""
    doc = model.__doc__ or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _key(dotted: str, info: FieldInfo) -> Key:
    default = info.get_default(call_default_factory=True)
    examples = info.examples or [None]
    return Key(
        dotted=dotted,
        type=_type_text(info.annotation),
        default=None if default is PydanticUndefined else default,
        bounds=tuple(_bounds(info)),
        live=applied_by_reload(dotted),
        secret=_is_secret(info.annotation),
        description=" ".join((info.description or "").split()),
        example=examples[0],
    )


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types of a union (``X | None``), or the one type."""
    if get_origin(annotation) in (Union, types.UnionType):
        return get_args(annotation)
    return (annotation,)


def _is_secret(annotation: Any) -> bool:
    return SecretStr in _members(annotation)


def _type_text(annotation: Any) -> str:
    words = []
    for member in _members(annotation):
        if member is type(None):
            continue
        if get_origin(member) is Literal:
            words.append(" | ".join(json.dumps(value) for value in get_args(member)))
        elif get_origin(member) is tuple:
            words.append(f"list of {_type_text(get_args(member)[0])}")
        elif member is SecretStr:
            words.append("secret string")
        elif member is Path:
            words.append("path")
        else:
            words.append(getattr(member, "__name__", str(member)))
    text = " | ".join(words)
    return f"{text} (optional)" if type(None) in _members(annotation) else text


_BOUNDS: tuple[tuple[type[Any], str, str], ...] = (
    (annotated_types.Ge, "ge", "at least {}"),
    (annotated_types.Gt, "gt", "above {}"),
    (annotated_types.Le, "le", "at most {}"),
    (annotated_types.Lt, "lt", "below {}"),
    (annotated_types.MinLen, "min_length", "at least {} character(s)"),
    (annotated_types.MaxLen, "max_length", "at most {} characters"),
)


def _bounds(info: FieldInfo) -> Iterator[str]:
    for constraint in info.metadata:
        for kind, attribute, text in _BOUNDS:
            if isinstance(constraint, kind):
                yield text.format(_number(getattr(constraint, attribute)))
        pattern = getattr(constraint, "pattern", None)
        if isinstance(pattern, str):
            yield f"matches `{pattern}`"


def _number(value: Any) -> str:
    return f"{value:_}".replace("_", ",") if isinstance(value, int) else str(value)


def toml_value(value: Any) -> str:
    """``value`` as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return json.dumps(str(value))


# --- the site's page ----------------------------------------------------------------


def reference_markdown(model: type[BaseModel] = Settings) -> str:
    """The configuration reference page, in Markdown."""
    lines = [
        "# Configuration reference",
        "",
        "Every key of the configuration file, written from the settings model when the",
        "site is built. Settings come from, highest priority first: the command's flags,",
        "the environment (`GATEWAY_<SECTION>__<KEY>`), the TOML file named by `--config`,",
        "then the defaults below. `records-gateway check-config --config FILE` checks a",
        "file without starting anything. A key *applied by a reload* changes while the",
        "gateway serves (`SIGHUP` or `POST /admin/reload`); a reload reports a change of",
        "any other key as needing a restart. `config.example.toml` holds every key at",
        "its default.",
        "",
    ]
    for section in sections(model):
        lines += [f"## `[{section.dotted}]`", "", section.summary, ""]
        for key in section.keys:
            lines += _key_markdown(key)
    return "\n".join(lines)


def _key_markdown(key: Key) -> list[str]:
    facts = [
        f"**Type** {key.type}",
        f"**Default** {_default_text(key)}",
        *([f"**Bounds** {', '.join(key.bounds)}"] if key.bounds else []),
        "**Applied by** " + ("a reload" if key.live else "a restart"),
        f"**Environment** `{key.env}`" + (" (as JSON)" if key.type.startswith("list") else ""),
    ]
    return [f"### `{key.dotted}`", "", " · ".join(facts), "", key.description, ""]


def _default_text(key: Key) -> str:
    if key.default is None:
        return "unset"
    return f"`{toml_value(key.default)}`"


# --- config.example.toml ------------------------------------------------------------

_EXAMPLE_HEAD = """\
# records-gateway configuration. Every key is optional: the value shown is the default;
# a key commented out is unset by default, shown with an example.
# Any key can also be set in the environment: GATEWAY_<SECTION>__<KEY>, for example
#   GATEWAY_UPSTREAM__BASE_URL=https://records.example.com/v2
# Priority: command-line flags > environment > this file > defaults.
# A reload (SIGHUP, POST /admin/reload) applies the keys that say so; every other key
# needs a restart. Check a file with: records-gateway check-config --config config.toml
# Written from the settings model by `make config-example`; the documentation's
# configuration reference says the same, with each key's bounds.
"""


def example_toml(model: type[BaseModel] = Settings, width: int = 88) -> str:
    """``config.example.toml``: every key at its default, its description above it."""
    out = [_EXAMPLE_HEAD]
    for section in sections(model):
        out.append(f"\n[{section.dotted}]\n")
        out += _comment(section.summary, width)
        for key in section.keys:
            out += _comment(key.description + (" A reload applies it." if key.live else ""), width)
            out.append(_assignment(key) + "\n")
    return "".join(out)


def _assignment(key: Key) -> str:
    if key.default is not None and not key.secret:
        return f"{key.name} = {toml_value(key.default)}"
    shown = key.example if key.example is not None else ""
    return f"# {key.name} = {toml_value(shown)}"


def _comment(text: str, width: int) -> list[str]:
    lines: list[str] = []
    line = "#"
    for word in text.split():
        if len(line) + 1 + len(word) > width and line != "#":
            lines.append(line + "\n")
            line = "#"
        line += " " + word
    if line != "#":
        lines.append(line + "\n")
    return lines


def main(argv: list[str]) -> int:
    """``python -m gateway.config.reference example|markdown [PATH]``: writes one of the
    two texts to PATH, or to standard output."""
    if not argv or argv[0] not in ("example", "markdown"):
        print("usage: python -m gateway.config.reference example|markdown [PATH]")
        return 2
    text = example_toml() if argv[0] == "example" else reference_markdown()
    if len(argv) > 1:
        Path(argv[1]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

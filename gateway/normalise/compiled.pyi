"""Types of the compiled record canonicaliser (gateway/normalise/compiled.pyx).

The module is optional (a build without a C compiler leaves it out): import it through
gateway.normalise.rules, which is None in its place then.
"""

from collections.abc import Callable
from typing import Any

CHECK_NONE: int
CHECK_UUID: int
CHECK_DECIMAL: int
CHECK_INSTANT: int
CHECK_MEMBER: int
CHECK_CALL: int
CHECK_TEXT_LIST: int

class Step:
    name: str
    qualified: str
    check: int
    scale: int
    max_scale: int
    argument: Any
    coerce: Callable[[Any], tuple[Any, str | None]]
    def __init__(
        self,
        name: str,
        qualified: str,
        check: int,
        argument: Any,
        coerce: Callable[[Any], tuple[Any, str | None]],
        scale: int = 0,
        max_scale: int = 0,
    ) -> None: ...

class Plan:
    model_name: str
    order: tuple[str, ...]
    names: frozenset[str]
    qualified: tuple[str, ...]
    derived: frozenset[str]
    required: tuple[str, ...]
    texts: tuple[str, ...]
    steps: tuple[Step, ...]
    nested: tuple[tuple[str, Plan], ...]
    complete: Callable[[dict[str, Any], Any, frozenset[str]], dict[str, Any]] | None
    def __init__(
        self,
        model_name: str,
        order: tuple[str, ...],
        qualified: tuple[str, ...],
        derived: frozenset[str],
        required: tuple[str, ...],
        texts: tuple[str, ...],
        steps: tuple[Step, ...],
        nested: tuple[tuple[str, Plan], ...],
        complete: Callable[[dict[str, Any], Any, frozenset[str]], dict[str, Any]] | None,
    ) -> None: ...

def check(step: Step, value: object) -> bool: ...
def canonicalise(plan: Plan, data: dict[str, Any], context: Any) -> dict[str, Any]: ...
def canonicalise_items(plan: Plan, items: list[Any], context: Any) -> None: ...
def holds_float(value: object) -> bool: ...
def shape(value: object) -> tuple[bool, int]: ...
def members(body: bytes) -> int: ...

"""The cache backends ``cache.backend`` may name, as far as the settings need to know
them: each is declared here when the cache layer registers it
(``gateway.cache.registry.BackendRegistry.register``), so that a backend is one module
and one registration, and the settings check a name against what is registered.

The settings ask two things: whether a name is registered, and whether its entries are
shared between processes (then the keys need ``cache.key_secret``). Settings checked
before any backend is registered (the cache layer not imported by the entry point) are
a mistake of the program, not of the configuration: they raise RuntimeError rather
than let a shared backend go without its key secret.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BackendKind:
    """What the settings need to know of a registered backend: ``shared``, whether its
    entries are seen by other processes."""

    shared: bool


class BackendCatalogue:
    """The registered backends' kinds, by name, in the order they were registered."""

    def __init__(self) -> None:
        self._kinds: dict[str, BackendKind] = {}

    def declare(self, name: str, kind: BackendKind) -> None:
        """Declare (or declare again) the backend ``cache.backend = name`` selects."""
        self._kinds[name] = kind

    def withdraw(self, name: str) -> None:
        """Forget the backend of that name (one registered for a while only)."""
        self._kinds.pop(name, None)

    def kind(self, name: str) -> BackendKind | None:
        """The kind of the backend of that name; None when none is registered."""
        self._require_some()
        return self._kinds.get(name)

    def _require_some(self) -> None:
        if not self._kinds:
            raise RuntimeError(
                "no cache backend is registered: import gateway.cache.registry before"
                " settings are checked"
            )

    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def refusal(self, name: str) -> str | None:
        """Why ``name`` is refused (it is not registered), worded as the settings word
        a value outside a choice; None when it is registered."""
        self._require_some()
        if name in self._kinds:
            return None
        quoted = [repr(known) for known in self._kinds]
        if len(quoted) == 1:
            return f"Input should be {quoted[0]}"
        return f"Input should be {', '.join(quoted[:-1])} or {quoted[-1]}"


BACKENDS = BackendCatalogue()

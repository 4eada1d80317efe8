"""The tests here run on uvloop, the event loop the gateway serves on."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
import uvloop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], uvloop.Loop]]:
    return {"uvloop": uvloop.new_event_loop}

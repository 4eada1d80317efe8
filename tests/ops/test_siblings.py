"""The workers of one instance telling each other an admin action (gateway.ops.siblings),
over real Unix sockets; docs/operations.md, "Workers"."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from gateway.ops.siblings import Reach, Siblings


async def test_every_sibling_applies_the_message_and_a_missing_one_is_not_confirmed(
    tmp_path: Path,
) -> None:
    received: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    workers = [Siblings(tmp_path, index=index, count=4, timeout_s=1) for index in range(3)]

    def applier(index: int) -> Any:
        async def apply(message: dict[str, Any]) -> bool:
            received[index].append(message)
            return message.get("action") != "refused-by-2" or index != 2

        return apply

    for index in (1, 2):
        await workers[index].listen(applier(index))
    try:
        # worker 3 never listens: told, not confirmed
        reach = await workers[0].tell({"action": "purge", "route": None})
        assert reach == Reach(told=4, confirmed=3)
        assert not reach.everywhere
        assert received == {1: [{"action": "purge", "route": None}]} | {
            2: [{"action": "purge", "route": None}]
        }
        # a sibling that refuses the action is not counted as confirming it
        assert await workers[0].tell({"action": "refused-by-2"}) == Reach(told=4, confirmed=2)
    finally:
        for worker in workers:
            await worker.close()
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".sock")]


async def test_the_report_is_degraded_while_a_worker_runs_another_configuration(
    tmp_path: Path,
) -> None:
    first, second = (Siblings(tmp_path, index=index, count=2) for index in range(2))
    first.publish_fingerprint("aaa")
    second.publish_fingerprint("aaa")
    assert first.report("aaa")["status"] == "ok"
    second.publish_fingerprint("bbb")
    report = first.report("aaa")
    assert (report["status"], report["configurations"]) == ("degraded", {"aaa": 1, "bbb": 1})


async def test_a_sibling_that_does_not_answer_is_given_up_after_the_documented_3_s(
    tmp_path: Path,
) -> None:
    """docs/operations.md, "Workers", and docs/deployment.md: a worker that does not confirm within
    3 s makes the answer a 503. The default bound is 3 s; a sibling that takes the
    message and never answers is, once the bound passed, told but not confirmed."""
    assert Siblings(tmp_path, index=0, count=2).timeout_s == 3.0
    stuck = asyncio.Event()
    taken: list[dict[str, Any]] = []

    async def never(message: dict[str, Any]) -> bool:
        taken.append(message)
        await stuck.wait()
        return True

    asker, silent = (Siblings(tmp_path, index=index, count=2, timeout_s=0.2) for index in (0, 1))
    await silent.listen(never)
    try:
        assert await asker.tell({"action": "shadow_reset"}) == Reach(told=2, confirmed=1)
        assert taken == [{"action": "shadow_reset"}]
    finally:
        stuck.set()
        await silent.close()

"""The work queue: no duplicate, no concurrent, no lost reconcile."""

from __future__ import annotations

import asyncio

from kubeinfer_operator.workqueue import Key, WorkQueue

A: Key = ("default", "a")
B: Key = ("default", "b")


def test_events_for_a_waiting_key_collapse_into_one_reconcile() -> None:
    async def scenario() -> list[Key]:
        seen: list[Key] = []

        async def process(key: Key) -> None:
            seen.append(key)

        queue = WorkQueue(process)
        for key in (A, A, B, A):
            queue.add(key)
        worker = asyncio.create_task(queue.worker())
        await asyncio.sleep(0.05)
        worker.cancel()
        return seen

    assert asyncio.run(scenario()) == [A, B]


def test_a_key_changed_while_reconciling_is_reconciled_again_never_concurrently() -> None:
    async def scenario() -> tuple[int, int]:
        running, most, calls = 0, 0, 0
        release = asyncio.Event()

        async def process(key: Key) -> None:
            nonlocal running, most, calls
            calls += 1
            running += 1
            most = max(most, running)
            if calls == 1:
                await release.wait()
            running -= 1

        queue = WorkQueue(process)
        workers = [asyncio.create_task(queue.worker()) for _ in range(3)]
        queue.add(A)
        await asyncio.sleep(0.01)
        queue.add(A)  # an event arrives mid-reconcile
        queue.add(A)
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.sleep(0.05)
        for worker in workers:
            worker.cancel()
        return calls, most

    assert asyncio.run(scenario()) == (2, 1)


def test_a_failed_reconcile_is_retried_with_growing_delays() -> None:
    async def scenario() -> int:
        attempts = 0

        async def process(key: Key) -> None:
            nonlocal attempts
            attempts += 1
            if attempts < 3:
                raise RuntimeError("apiserver said 503")

        queue = WorkQueue(process, base_delay=0.01)
        worker = asyncio.create_task(queue.worker())
        queue.add(A)
        await asyncio.sleep(0.2)
        worker.cancel()
        return attempts

    assert asyncio.run(scenario()) == 3
    delays = [
        WorkQueue(lambda key: asyncio.sleep(0), base_delay=0.5, max_delay=60).retry_delay(n)
        for n in (1, 2, 3, 10)
    ]
    assert delays == [0.5, 1.0, 2.0, 60.0]


def test_an_event_goes_before_a_resync_pass_and_is_not_run_twice() -> None:
    async def scenario() -> list[Key]:
        seen: list[Key] = []

        async def process(key: Key) -> None:
            seen.append(key)

        queue = WorkQueue(process)
        many = [("default", f"idle-{i}") for i in range(5)]
        for key in [*many, A]:
            queue.add(key, background=True)  # a resync pass
        queue.add(B)  # a user's change
        queue.add(A)  # an event for a key the pass already queued: promoted, not duplicated
        worker = asyncio.create_task(queue.worker())
        await asyncio.sleep(0.05)
        worker.cancel()
        return seen

    assert asyncio.run(scenario()) == [B, A, *[("default", f"idle-{i}") for i in range(5)]]

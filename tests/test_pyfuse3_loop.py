"""The vendored pyfuse3 patch's session loop runs each request's handler itself up to its first
wait (``coro.send(None)``) and, only if it waits, hands the reading turn to another task and
awaits the rest through ``pyfuse3.finish_started``. That must be exactly ``await`` from there
on: every value trio sends (a thread's result) and every exception it throws or delivers
(cancellation) reaches the handler, and the handler's own result or exception comes back.
(Through a mount: a request that waits leaves the others answered, tests/test_mount_release.py
and test_mount_s3.py's hung-store test.)"""

from __future__ import annotations

import pyfuse3
import pytest
import trio

async def _started(coro):
    """What the session loop does: run ``coro`` to its first suspension, then await the rest."""
    try:
        trap = coro.send(None)
    except StopIteration as stop:
        return "no wait", stop.value
    return "waited", await pyfuse3.finish_started(coro, trap)


def test_a_handler_that_waits_gets_every_value_back_and_returns_its_own():
    async def handler(x):
        await trio.sleep(0)
        y = await trio.to_thread.run_sync(lambda: x * 2)  # a result sent in by trio
        await trio.lowlevel.checkpoint()
        return y + 1

    assert trio.run(_started, handler(20)) == ("waited", 41)


def test_a_handler_that_never_waits_is_answered_without_suspending():
    async def handler():
        return 7

    assert trio.run(_started, handler()) == ("no wait", 7)


def test_cancellation_reaches_the_handler_and_its_cleanup_runs():
    seen = []

    async def handler():
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            seen.append("cancelled")
            raise
        finally:
            seen.append("cleanup")

    async def main():
        with trio.move_on_after(0.05) as scope:
            await _started(handler())
        return scope.cancelled_caught

    assert trio.run(main) is True
    assert seen == ["cancelled", "cleanup"]


def test_an_error_after_the_first_wait_comes_back_as_itself():
    class Boom(Exception):
        pass

    async def handler():
        await trio.sleep(0)
        await trio.to_thread.run_sync(lambda: None)
        raise Boom("after two waits")

    with pytest.raises(Boom, match="after two waits"):
        trio.run(_started, handler())


def test_an_error_thrown_into_the_handler_can_be_handled_there():
    async def handler():
        try:
            await trio.to_thread.run_sync(_raise_oserror)  # trio throws the thread's error in
        except OSError as e:
            return f"handled {e.errno}"

    assert trio.run(_started, handler()) == ("waited", "handled 5")


def _raise_oserror():
    raise OSError(5, "EIO from a thread")

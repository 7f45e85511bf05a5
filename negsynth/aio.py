"""Run a coroutine to completion from synchronous code, whether or not an event loop is running.

Where one runs in this thread (a Jupyter notebook, an async web handler) ``asyncio.run`` refuses;
there the coroutine runs on a fresh loop in a worker thread and the caller blocks until it is done,
so ``run_pipeline(...)`` in a notebook cell behaves as in a script.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _quiet_cancelled_connect(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Drop the ``InvalidStateError`` traceback CPython < 3.12 logs when a Ctrl-C cancels a socket
    connect as it completes (fixed in 3.12); nothing is lost, every other error is still shown."""
    handle = context.get("handle")
    if isinstance(context.get("exception"), asyncio.InvalidStateError) and "_sock_connect_cb" in repr(handle):
        return
    loop.default_exception_handler(context)


async def _with_handler(coro: Coroutine[Any, Any, T]) -> T:
    asyncio.get_running_loop().set_exception_handler(_quiet_cancelled_connect)
    return await coro


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, or the same on a worker thread when this thread's loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_with_handler(coro))
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(_with_handler(coro))
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name="negsynth-loop", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]

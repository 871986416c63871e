"""The asyncio loop the agent loop runs tools, environments and interactions on, and the threads of
plain (sync) tool functions.

User code runs here, and user code misbehaves. What it may do, and what then happens:

* a sync tool function that never returns: it runs in a daemon thread of its own, so the call times
  out (``multi_turn.tool_timeout_s``), the other calls go on, and the process can still exit (a thread
  of asyncio's default executor would be joined at exit, and a few hung ones starve every later call);
* code that blocks the loop itself (``time.sleep`` in an ``async def``, a sync ``step`` that hangs):
  no timeout can fire there, so the caller's watchdog stops the run, naming the task that blocks;
* ``sys.exit()`` or a ``KeyboardInterrupt`` raised inside a tool: the run stops naming it (before, the
  loop's thread died with it and the rollout waited forever).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import weakref

from verl.errors import VerlError

THREADS = 32
"""Sync tool calls that run at once per loop (asyncio's default executor allows min(32, CPUs + 4))."""
_slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class UserCodeExited(VerlError):
    """A tool, environment or interaction raised SystemExit or KeyboardInterrupt: the run stops."""


class EventLoop:
    """One asyncio loop in a background thread for all tool calls of a worker: tools that keep
    loop-bound state (connections, subprocesses) see the same loop every turn, and it works where
    the caller already runs a loop (a notebook). ``stall_s``: how long the loop may be unresponsive
    (a task blocking it) before :meth:`run` stops the run."""

    def __init__(self, stall_s: float = 30.0):
        self.stall_s = stall_s
        self.loop = asyncio.new_event_loop()
        self._outcome: dict = {}  # what ended the loop's thread, if anything
        self.broken: str | None = None  # set once the loop is stuck or gone: nothing more runs on it
        # The thread holds the loop, not this object: the loop, its thread, selector and wake-up socket end
        # when the owner (an AgentLoop) is collected (before, every AgentLoop built and dropped left a thread and
        # 3 descriptors for the life of the process). Not at the interpreter's exit: a daemon thread ends with
        # the process, without waiting for a tool.
        self.thread = threading.Thread(target=_serve, args=(self.loop, self._outcome), daemon=True, name="verl-tools")
        self.thread.start()
        weakref.finalize(self, _close, self.loop, self.thread).atexit = False

    @property
    def ended(self) -> BaseException | None:
        return self._outcome.get("error")

    def run(self, coroutine):
        """``coroutine``'s result, run on the loop; a VerlError if the loop stops answering meanwhile."""
        if self.broken is not None:
            coroutine.close()
            raise VerlError(self.broken)
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        while True:
            try:
                return future.result(timeout=self.stall_s)
            except concurrent.futures.TimeoutError:
                pass
            task = asyncio.current_task(self.loop)  # what holds the loop now, if anything
            if self.thread.is_alive() and self._answers():
                continue
            future.cancel()
            label = task.get_name() if task is not None else "a task"
            if not self.thread.is_alive():
                self.broken = (f"{label} ended the tools' event loop with {self.ended!r:.200}: a tool, environment or "
                               f"interaction must return or raise an Exception, never exit")
            else:
                self.broken = (f"{label} blocked the tools' event loop for over {self.stall_s:g} s "
                               f"(multi_turn.tool_timeout_s), so no timeout could fire: an async def must not block "
                               f"(await asyncio.sleep, or run blocking work with asyncio.to_thread), and a blocking "
                               f"function should be a plain def")
            raise VerlError(self.broken)

    def _answers(self) -> bool:
        """Whether the loop runs a callback within ``stall_s`` (a blocked or dead loop does not)."""
        pong = threading.Event()
        try:
            self.loop.call_soon_threadsafe(pong.set)
        except RuntimeError:  # the loop is closed
            return False
        return pong.wait(self.stall_s)


def _serve(loop: asyncio.AbstractEventLoop, outcome: dict) -> None:
    try:
        loop.run_forever()
    except BaseException as e:  # noqa: BLE001 - kept for the caller's message
        outcome["error"] = e


def _close(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stop ``loop`` and close it once its ``thread`` has returned (not from that thread itself: a garbage
    collection can run there; the loop is then left to stop alone)."""
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:  # closed already
        return
    if thread is threading.current_thread():
        return
    thread.join(timeout=10)
    if not thread.is_alive():
        loop.close()


def named(awaitable, label: str) -> asyncio.Task:
    """``awaitable`` as a task named ``label`` (what the watchdog says if it blocks the loop), with a
    SystemExit or KeyboardInterrupt it raises turned into :class:`UserCodeExited` (a task would hand
    those on to the loop, whose thread would end with them)."""

    async def contained():
        try:
            return await awaitable
        except (SystemExit, KeyboardInterrupt) as e:
            raise UserCodeExited(f"{label} raised {type(e).__name__}({e}): user code must return, or raise an "
                                 f"Exception (a tool's is then answered to the model as an error), never exit") from None

    task = asyncio.ensure_future(contained())
    task.set_name(label)
    return task


async def run_in_thread(fn, /, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a daemon thread of its own (``asyncio.to_thread`` without the shared
    executor): a call that never returns is left behind by the caller's timeout and does not hold up
    later calls, nor the interpreter's exit."""
    loop = asyncio.get_running_loop()
    slots = _slots.get(loop)
    if slots is None:
        slots = _slots[loop] = asyncio.Semaphore(THREADS)
    async with slots:  # a call the caller gave up on (timed out) frees its slot
        return await _in_thread(loop, fn, *args, **kwargs)


async def _in_thread(loop, fn, /, *args, **kwargs):
    future = loop.create_future()
    context = contextvars.copy_context()

    def settle(result, error):
        if not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def work():
        try:
            result, error = context.run(fn, *args, **kwargs), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is gone: nobody waits for this call any more
            pass

    threading.Thread(target=work, daemon=True, name=f"verl-tool-{getattr(fn, '__name__', 'call')}").start()
    return await future

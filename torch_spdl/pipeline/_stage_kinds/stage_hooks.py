"""A stage's ``stage_hook()`` contexts: entered once as it launches, left once as it ends.

SPDL's :class:`~torch_spdl.pipeline.TaskHook` gives every hook a ``stage_hook()`` async
context that spans the whole stage. The stage enters them from ``launch`` (on a private
event loop: a thread stage has none of its own), and the last of its workers leaves them
as the stage ends (step 4 of the end-of-stream template in ``node.py``), from a thread or
a coroutine. An error on either side is the stage's: it is returned, noted with the
stage's name, for the node to fail the pipeline with. Nothing here refers back to the
node, so a node and its hooks make no reference cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from .._plugins.hooks import TaskHook

__all__ = ["StageHooks"]


class StageHooks:
    """The ``stage_hook()`` contexts of one stage's ``hooks`` (named ``stage`` in errors)."""

    def __init__(self, stage: str, hooks: Sequence[TaskHook]) -> None:
        self.stage = stage
        self.hooks = list(hooks)
        self._stack: contextlib.AsyncExitStack | None = None

    def enter(self) -> Exception | None:
        """Enter every hook's ``stage_hook()``; the error that stops it, if any (the
        contexts entered before it are left again)."""
        stack = contextlib.AsyncExitStack()

        async def enter() -> None:
            for hook in self.hooks:
                await stack.enter_async_context(hook.stage_hook())

        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(enter())
            self._stack = stack
            return None
        except Exception as exc:
            with contextlib.suppress(Exception):
                loop.run_until_complete(stack.aclose())
            return self._noted(exc)
        finally:
            loop.close()

    def exit(self) -> Exception | None:
        """Leave the contexts from a worker thread (the last one, as the stage ends)."""
        if self._stack is None:
            return None
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(self.aexit())
        finally:
            loop.close()

    async def aexit(self) -> Exception | None:
        """Leave the contexts from a coroutine (the last one, as the stage ends)."""
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        try:
            await stack.aclose()
        except Exception as exc:
            return self._noted(exc)
        return None

    def _noted(self, exc: Exception) -> Exception:
        exc.add_note(f"torch_spdl: raised by a stage_hook() of stage {self.stage!r}")
        return exc

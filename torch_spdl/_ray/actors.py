"""A fixed number of actor slots, each holding one live actor, replaced when it dies.

The loader's workers and a region's actors are numbered (worker ``i`` is seeded with
``base_seed + i``; its batches are its own), so an actor that dies is replaced *in its
slot*: a new actor made with the same arguments, which the owner then brings to where
the dead one was (the loader replays what it had not delivered). Replacements are
bounded: a dataset that kills every actor it runs in would otherwise be retried forever,
so past ``max_replacements`` in all the owner gets :class:`ReplacementsExhausted`, naming
the slot and the last cause.

Each actor is named ``{prefix}{token}-w{slot}-g{generation}`` (``token`` tells one set from
another), so ``ray.util.list_named_actors(all_namespaces=True)`` shows which of them live,
on any cluster, without the dashboard that Ray's state API needs.

Actors are made with ``max_restarts=0``: Ray's own restart would rerun the constructor
behind the owner's back, and the owner, not Ray, knows which tasks to run again. Every
actor made here is killed by :meth:`ActorSet.shutdown` (``ray.kill``, which does not wait
for a task under way): nothing outlives the owner.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from .cluster import check_feasible, describe_request

__all__ = ["ActorSet", "ReplacementsExhausted"]

# Actor options that would break what the owner relies on (calls one at a time in order,
# its own names and replacements, no actor outliving it).
_REFUSED = frozenset(
    {"max_concurrency", "concurrency_groups", "lifetime", "get_if_exists", "namespace",
     "max_restarts", "max_task_retries"}
)


class ReplacementsExhausted(RuntimeError):
    """More actors died than the owner's budget of replacements allows."""


class ActorSet:
    """``count`` actors of ``actor_class`` (a Ray actor class), slot ``i`` made with
    ``args(i)``, placed with the user's ``options``.

    Args:
        ray: the ``ray`` module, connected.
        actor_class: what ``ray.remote`` made of the actor's class.
        count: how many slots.
        args: the constructor's arguments for slot ``i`` (called again for a replacement).
        options: Ray's actor options (``num_cpus``, ``resources``, ``scheduling_strategy``,
            ...), as ``actor_class.options(**options)`` takes them.
        who: names the owner in errors (``"torch_spdl.DataLoader(worker_type='ray')"``).
        max_replacements: actors that may be replaced in all, over the set's life.
        prefix: the start of every actor's name (see the module notes).
        check: refuse at once a request no live node can hold (False: an autoscaler may
            add such a node; the owner's start timeout still bounds the wait).
    """

    def __init__(
        self,
        ray: Any,
        actor_class: Any,
        count: int,
        args: Callable[[int], tuple[Any, ...]],
        options: dict[str, Any],
        who: str,
        max_replacements: int,
        prefix: str = "torch_spdl-",
        check: bool = True,
    ) -> None:
        self._ray = ray
        self._class = actor_class
        self._args = args
        refused = sorted(set(options) & _REFUSED)
        if refused:
            raise ValueError(
                f"{who}: ray_options may not set {', '.join(refused)}: an actor runs its "
                "calls one at a time, in order, is named and replaced by torch_spdl, and "
                "lives no longer than its owner"
            )
        options = {k: v for k, v in options.items() if k != "name"}  # names are ours
        self.options = {"num_cpus": 1, **options, "max_restarts": 0}
        self.who = who
        self._budget = max_replacements
        self.replaced = 0
        self._lock = threading.Lock()
        self._closed = False
        self.name = f"{prefix}{uuid.uuid4().hex[:8]}"
        #: Bumped for slot ``i`` each time its actor is replaced.
        self.generation = [0] * count
        if check:
            check_feasible(ray, self.options, who)
        self._actors: list[Any] = [self._make(i) for i in range(count)]

    def _make(self, slot: int) -> Any:
        name = f"{self.name}-w{slot}-g{self.generation[slot]}"
        return self._class.options(**self.options, name=name).remote(*self._args(slot))

    def __len__(self) -> int:
        return len(self._actors)

    def __getitem__(self, slot: int) -> Any:
        return self._actors[slot]

    def wait_ready(self, ping: Callable[[Any], Any], timeout: float) -> None:
        """Wait until every actor answers ``ping(actor)`` (an ObjectRef), at most
        ``timeout`` seconds: an actor that cannot be placed (the cluster is full) is an
        error naming what it asked for, not a hang."""
        refs = [ping(actor) for actor in self._actors]
        deadline = time.monotonic() + timeout
        pending = list(refs)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{self.who}: {len(pending)} of {len(refs)} Ray actors (asking for "
                    f"{describe_request(self.options)}) were not placed within "
                    f"{timeout:g} s: the cluster has no room for them now"
                )
            _, pending = self._ray.wait(pending, num_returns=len(pending), timeout=min(left, 1.0))
        self._ray.get(refs)  # raises what a constructor raised

    def replace(self, slot: int, generation: int, cause: BaseException) -> bool:
        """Replace slot ``slot``'s actor, which died (``cause``), unless it was replaced
        since ``generation`` already. True if this call replaced it.

        Raises:
            ReplacementsExhausted: the budget of replacements is spent.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.who}: the Ray actors were shut down") from cause
            if self.generation[slot] != generation:
                return False
            if self.replaced >= self._budget:
                raise ReplacementsExhausted(
                    f"{self.who}: the Ray actor of worker {slot} died and the budget of "
                    f"{self._budget} replacements is spent ({self.replaced} actors replaced "
                    f"so far); the last cause: {type(cause).__name__}: {cause}"
                ) from cause
            self.replaced += 1
            old = self._actors[slot]
            self.generation[slot] += 1
            self._actors[slot] = self._make(slot)
        self._kill(old)
        return True

    def _kill(self, actor: Any) -> None:
        try:
            self._ray.kill(actor, no_restart=True)
        except Exception:  # already gone, or the cluster with it
            pass

    def shutdown(self) -> None:
        """Kill every actor now (a task under way is not waited for)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            actors, self._actors = self._actors, []
        for actor in actors:
            self._kill(actor)

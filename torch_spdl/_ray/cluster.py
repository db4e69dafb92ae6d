"""Reaching a Ray cluster, and what a request for an actor can be given there.

Three failures that Ray itself turns into a wait are turned into errors here, at once:

- Ray is not installed: the error says how to install it.
- The address does not answer: ``ray.init`` retries a GCS address that refuses
  connections for a minute or more. A TCP connection to a ``host:port`` address is tried
  first, for a few seconds, and the error names the address.
- No node can ever hold the actor: an actor asking for a resource that no node of the
  cluster has waits, pending, until such a node joins (an autoscaler may add one; on a
  fixed cluster, forever). The request is compared with every live node's resources first,
  and the error names what was asked and what the nodes have.

The loader connects only when the process is not connected already (``ray.init()`` as
its own default: the ``RAY_ADDRESS`` cluster, or a new local one); a script that calls
``ray.init`` itself keeps its settings. ``ray.init`` replaces the process's SIGTERM
handler; the one the script had is put back.
"""

from __future__ import annotations

import signal
import socket
import threading
from types import ModuleType
from typing import Any

__all__ = ["check_feasible", "connect", "describe_request", "require_ray"]

_PROBE_S = 5.0  # how long a GCS address may take to accept a TCP connection
_INSTALL = "pip install 'torch_spdl[ray]' (or: pip install 'ray>=2.9')"


def require_ray(who: str) -> ModuleType:
    """``ray``, or an ImportError from ``who`` that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"{who} needs Ray, which is not installed: {_INSTALL}") from exc
    return ray


def connect(who: str, address: str | None = None) -> ModuleType:
    """``ray``, connected: as the process already is, else to ``address`` (Ray's default
    when None: ``RAY_ADDRESS``, else a new local instance).

    Raises:
        ConnectionError: the address did not accept a connection within a few seconds.
    """
    ray = require_ray(who)
    if ray.is_initialized():
        return ray
    if address is None:
        import os

        address = os.environ.get("RAY_ADDRESS") or None
    if address not in (None, "auto", "local") and not address.startswith("ray://"):
        _probe(who, address)
    # ray.init installs a SIGTERM handler of its own (exit at once): a script's handler
    # (a checkpoint on preemption) is the script's, and stays.
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=address)
    except ConnectionError as exc:
        raise ConnectionError(f"{who}: cannot reach the Ray cluster at {address!r}: {exc}") from exc
    finally:
        if main and before is not None and signal.getsignal(signal.SIGTERM) is not before:
            signal.signal(signal.SIGTERM, before)
    return ray


def _probe(who: str, address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # not host:port; Ray reports what it makes of it
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_S):
            pass
    except OSError as exc:
        raise ConnectionError(
            f"{who}: cannot reach the Ray cluster at {address!r} (no answer within "
            f"{_PROBE_S:g} s: {exc}); start it with `ray start --head`, or pass the address "
            "of its head node"
        ) from exc


def _requested(options: dict[str, Any]) -> dict[str, float]:
    """The resources an actor made with ``options`` holds (an actor asks 1 CPU to be
    placed unless it says otherwise; Ray's own default of 0 CPUs for a running actor
    would let every actor land on the head node)."""
    wanted: dict[str, float] = {"CPU": float(options.get("num_cpus", 1))}
    if options.get("num_gpus"):
        wanted["GPU"] = float(options["num_gpus"])
    if options.get("memory"):
        wanted["memory"] = float(options["memory"])
    for name, amount in (options.get("resources") or {}).items():
        wanted[name] = float(amount)
    return {k: v for k, v in wanted.items() if v > 0}


def describe_request(options: dict[str, Any]) -> str:
    """What an actor made with ``options`` asks for, in words."""
    return ", ".join(f"{k}={v:g}" for k, v in sorted(_requested(options).items())) or "nothing"


def check_feasible(ray: ModuleType, options: dict[str, Any], who: str) -> None:
    """Raise ValueError if no live node of the cluster can ever hold an actor made with
    ``options`` (see the module notes)."""
    wanted = _requested(options)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    strategy = options.get("scheduling_strategy")
    node_id = getattr(strategy, "node_id", None)
    if node_id is not None and not getattr(strategy, "soft", False):
        nodes = [n for n in nodes if n.get("NodeID") == node_id]
        if not nodes:
            raise ValueError(f"{who}: ray_options name node {node_id}, which is not alive")
    for node in nodes:
        have = node.get("Resources", {})
        if all(have.get(name, 0.0) >= amount for name, amount in wanted.items()):
            return
    seen = "; ".join(
        ", ".join(f"{k}={v:g}" for k, v in sorted(n.get("Resources", {}).items())
                  if not k.startswith("node:") and k != "object_store_memory")
        for n in nodes
    )
    missing = sorted(
        name for name, amount in wanted.items()
        if not any(n.get("Resources", {}).get(name, 0.0) >= amount for n in nodes)
    )
    raise ValueError(
        f"{who}: no node of the Ray cluster can hold an actor asking for "
        f"{describe_request(options)} (no node has enough "
        f"{', '.join(missing) or 'of them at once'}); "
        f"the nodes have: {seen or 'no live node'}"
    )

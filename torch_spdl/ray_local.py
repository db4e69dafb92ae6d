"""A Ray cluster on this machine's loopback address: for tests, examples and benchmarks.

Ray left alone binds its servers to the machine's network address and, to find that
address, opens connections to public ones. Where a machine may only talk to itself (a CI
runner, a sandbox), a Ray cluster for a test must see nothing but loopback. Two helpers:

- :func:`isolate_network` moves the calling process into a network namespace of its own
  holding only a loopback interface (``unshare(CLONE_NEWNET)``, which needs root or
  ``CAP_SYS_ADMIN``; then ``lo`` is brought up). Everything started from it afterwards
  (Ray's servers and workers included) inherits the namespace, so no packet can leave the
  machine, and Ray's probe of a public address fails at once.
- :class:`LocalCluster` starts a head and ``worker_nodes`` worker nodes with
  ``ray.cluster_utils.Cluster``, every one bound to ``127.0.0.1``, without the dashboard,
  with a small object store, the worker nodes carrying a custom resource (``"remote"``)
  that places actors on them and off the head, as a training node and its data nodes.
  It connects this process as the driver and, on :meth:`LocalCluster.shutdown` (or leaving
  its ``with``), disconnects and stops every node. It sets ``RAY_USAGE_STATS_ENABLED=0`` in this
  process's environment unless set (its nodes then send no usage report): this module is
  for tests, examples and benchmarks, never for the program that imports ``torch_spdl``.

Call :func:`isolate_network` from the main thread before anything starts a thread that
will talk to Ray: the namespace belongs to the thread that entered it and to what it
starts afterwards.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading
import time
from types import TracebackType
from typing import Any

__all__ = ["LocalCluster", "actors_alive", "is_isolated", "isolate_network", "wait_actors_gone"]

_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def is_isolated() -> bool:
    """Whether this process sees no network interface but loopback (read from
    ``/proc/self/net/dev``, which shows the caller's namespace; ``/sys/class/net`` shows
    the namespace that mounted ``/sys``)."""
    try:
        with open("/proc/self/net/dev") as dev:
            lines = dev.read().splitlines()[2:]
    except OSError:
        return False
    return [line.split(":", 1)[0].strip() for line in lines] == ["lo"]


def isolate_network() -> None:
    """Enter a new network namespace with only loopback, up (see the module notes).

    Raises:
        PermissionError: the process may not make a namespace (it needs root).
        RuntimeError: called from a thread other than the main one.
    """
    if is_isolated():
        return
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("isolate_network() must be called from the main thread")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise PermissionError(err, f"unshare(CLONE_NEWNET) failed: {os.strerror(err)}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


def actors_alive(prefix: str = "torch_spdl-") -> list[str]:
    """The names of the live actors whose name starts with ``prefix`` (torch_spdl names
    its actors ``torch_spdl-loader-...`` and ``torch_spdl-region-...``), in any namespace."""
    import ray

    named = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"] for a in named if a["name"].startswith(prefix))


def wait_actors_gone(prefix: str = "torch_spdl-", timeout: float = 60.0) -> list[str]:
    """Wait until no actor named ``prefix...`` is alive (``ray.kill`` lands asynchronously),
    at most ``timeout`` seconds; the names still alive then (empty: all gone)."""
    end = time.monotonic() + timeout
    while (alive := actors_alive(prefix)) and time.monotonic() < end:
        time.sleep(0.05)  # asking the cluster again: there is nothing local to wait on
    return alive


class LocalCluster:
    """A head and ``worker_nodes`` worker nodes on 127.0.0.1, this process connected.

    Args:
        worker_nodes: worker nodes besides the head.
        cpus_per_node: CPUs each worker node offers.
        head_cpus: CPUs the head offers (0: no actor or task lands there).
        remote_resource: the custom resource each worker node has one unit per CPU of
            (ask for it in ``ray_options={"resources": {...}}`` to place an actor there).
        object_store_mb: each node's object store, in MiB.
    """

    def __init__(
        self,
        worker_nodes: int = 2,
        cpus_per_node: int = 1,
        *,
        head_cpus: int = 0,
        remote_resource: str = "remote",
        object_store_mb: int = 200,
    ) -> None:
        import ray
        from ray.cluster_utils import Cluster

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        store = object_store_mb * 2**20
        self._store = store
        common: dict[str, Any] = {
            "node_ip_address": "127.0.0.1",
            "object_store_memory": store,
        }
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={**common, "num_cpus": head_cpus, "include_dashboard": False},
        )
        self.nodes: list[Any] = []
        for _ in range(worker_nodes):
            self.add_node(cpus_per_node, remote_resource)
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address)
        self.address: str = self.cluster.address

    def add_node(self, cpus: int = 1, remote_resource: str = "remote") -> Any:
        """Start one more worker node; returns its handle (for :meth:`remove_node`)."""
        node = self.cluster.add_node(
            num_cpus=cpus,
            resources={remote_resource: cpus},
            node_ip_address="127.0.0.1",
            object_store_memory=self._store,
        )
        self.nodes.append(node)
        return node

    def remove_node(self, node: Any) -> None:
        """Stop a worker node at once (its actors and objects are lost)."""
        self.nodes.remove(node)
        self.cluster.remove_node(node, allow_graceful=False)

    def shutdown(self) -> None:
        """Disconnect and stop every node."""
        import ray

        ray.shutdown()
        self.cluster.shutdown()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

"""Shared fixtures: every test must leave nothing running and nothing allocated behind.

A pipeline or loader owns what it starts: threads, worker processes, shared-memory arenas.
The autouse fixture below checks, after every test, that each new one is gone:

- every new Python thread, whatever its name (a thread between its last statement and its
  exit gets a short grace to finish);
- every new child process of this one (psutil), the same grace given (a Ray node's daemons
  aside: the Ray tests count their actors by name);
- every new open file descriptor of this process on shared memory (``/dev/shm`` files and
  ``memfd`` arenas), and every new ``/dev/shm`` entry that names this process or ours.

Other engineers' test runs share ``/dev/shm`` on the same machine, so an entry counts only
when its name carries our tag or this process's id (torch names its segments
``torch_<pid>_...``); a leaked anonymous segment shows up as an open descriptor instead.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

GRACE_S = 30.0  # how long a thread or process at its last statement gets to finish (a guard)

# Threads that are not ours and legitimately outlive a test (name prefix: why).
ALLOWED_THREAD_PREFIXES: dict[str, str] = {}


def _threads() -> set[threading.Thread]:
    return {
        t
        for t in threading.enumerate()
        if not any(t.name.startswith(p) for p in ALLOWED_THREAD_PREFIXES)
    }


def _children() -> dict[int, psutil.Process]:
    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


def _shared_memory_fds() -> dict[str, str]:
    """This process's open descriptors on shared memory: fd number -> target."""
    found = {}
    fd_dir = "/proc/self/fd"
    if not os.path.isdir(fd_dir):
        return found
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            continue
        if target.startswith(("/memfd:", "/dev/shm/")):
            found[fd] = target
    return found


def _our_shm_entries() -> set[str]:
    if not os.path.isdir("/dev/shm"):
        return set()
    tags = ("torch_spdl", f"_{os.getpid()}_")
    return {name for name in os.listdir("/dev/shm") if any(tag in name for tag in tags)}


def _is_multiprocessing_helper(process: psutil.Process) -> bool:
    """multiprocessing's resource tracker and fork server: started once, on first use of the
    "spawn" or "forkserver" start method, and shared by the whole interpreter until it exits;
    no pipeline owns them."""
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return "multiprocessing.resource_tracker" in command or "multiprocessing.forkserver" in command


# What a Ray node runs besides the actors (tests/test_ray_*.py start a cluster for a module
# and add a node in a test): its daemons, not anything a loader or a pipeline owns. The
# actors' own processes ("ray::LoaderActor...", "ray::RegionActor...") still count.
_RAY_NODE_PROCESSES = (
    "/ray/core/src/ray/raylet/raylet",
    "/ray/core/src/ray/gcs/gcs_server",
    "ray::DashboardAgent",
    "ray::RuntimeEnvAgent",
    "ray::IDLE",
    "ray/_private/log_monitor.py",
    "ray/dashboard/",
)


def _is_ray_node_process(process: psutil.Process) -> bool:
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return any(part in command for part in _RAY_NODE_PROCESSES)


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid} ({' '.join(process.cmdline())[:120]})"
    except psutil.Error:
        return str(process.pid)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail a test that leaves a thread, a child process or shared memory behind."""
    threads = _threads()
    children = _children()
    fds = _shared_memory_fds()
    entries = _our_shm_entries()
    yield
    problems = []
    if _threads() - threads or set(_children()) - set(children):
        # Something new still runs. What only a reference cycle keeps alive (torch's own
        # loader iterator, held by a traceback, shuts its workers down when collected) is
        # released now, before anything counts as left behind.
        gc.collect()

    leaked = [t for t in _threads() - threads if t.is_alive()]
    for t in leaked:  # a thread may be between its last statement and its exit
        t.join(timeout=GRACE_S)
    still = sorted(t.name for t in leaked if t.is_alive())
    if still:
        problems.append(f"threads left running: {still}")

    new = [
        p
        for pid, p in _children().items()
        if pid not in children
        and _alive(p)
        and not _is_multiprocessing_helper(p)
        and not _is_ray_node_process(p)
    ]
    if new:
        psutil.wait_procs(new, timeout=GRACE_S)
        alive = [p for p in new if _alive(p)]
        if alive:
            problems.append(f"child processes left running: {[_describe(p) for p in alive]}")

    if set(_shared_memory_fds().items()) - set(fds.items()) or _our_shm_entries() - entries:
        gc.collect()  # what a reference cycle still holds is released now
        open_fds = sorted(set(_shared_memory_fds().items()) - set(fds.items()))
        if open_fds:
            problems.append(f"shared-memory descriptors left open: {open_fds}")
        names = sorted(_our_shm_entries() - entries)
        if names:
            problems.append(f"/dev/shm entries left behind: {names}")

    assert not problems, "; ".join(problems)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A Ray cluster for one test module (tests/test_ray_*.py): a head with no CPU and two
    worker nodes with the ``"remote"`` resource, on 127.0.0.1, after moving this process
    into a network namespace that has only loopback (``torch_spdl.ray_local``)."""
    from torch_spdl.ray_local import LocalCluster, isolate_network

    try:
        isolate_network()
    except PermissionError as exc:
        pytest.skip(f"a loopback-only network namespace needs root: {exc}")
    with LocalCluster(worker_nodes=2, cpus_per_node=1) as local:
        yield local

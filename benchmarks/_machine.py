"""What the figures were measured on: the header of every report and table a benchmark prints.

A figure means little without the machine and the versions behind it, and on a shared
machine the load at the start says how quiet it was; so every benchmark prints the same
header from :func:`machine`, including the git commit of the torch_spdl it imported (a
run of a checkout with uncommitted changes says ``-dirty``).
"""

from __future__ import annotations

import datetime
import importlib
import os
import platform

import psutil
from _cpu_meter import cpu_count


def _version(module: str) -> str:
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:  # not installed, or no version: say so in the report
        return "not installed"


def _commit(module: str) -> str:
    """The git commit of a module's checkout, ``-dirty`` with uncommitted changes."""
    import subprocess

    try:
        where = os.path.dirname(importlib.import_module(module).__file__ or ".")
        out = subprocess.run(
            ["git", "-C", where, "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "no git checkout"
    except Exception:  # no git, no checkout: say so in the report
        return "commit unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, str]:
    """What the figures were measured on, for the report's header."""
    mem = psutil.virtual_memory().total / 2**30
    return {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "cores": str(os.cpu_count()),
        "usable cores": str(cpu_count()),
        "CPU": _cpu_model(),
        "memory": f"{mem:.1f} GiB",
        "OS": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "Python": platform.python_version(),
        "torch": _version("torch"),
        "torchvision": _version("torchvision"),
        "av (PyAV)": _version("av"),
        "torch_spdl": f"{_version('torch_spdl')} ({_commit('torch_spdl')})",
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }

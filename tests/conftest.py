"""Shared fixtures: every test must leave no pipeline thread behind."""

from __future__ import annotations

import threading

import pytest


def pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("torch_spdl")]


@pytest.fixture(autouse=True)
def no_leaked_threads():
    """Fail a test that leaves a torch_spdl thread running after it returns."""
    before = set(pipeline_threads())
    yield
    leaked = [t for t in pipeline_threads() if t not in before and t.is_alive()]
    for t in leaked:  # a thread may be between its last statement and its exit
        t.join(timeout=5)
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"threads left running: {still}"

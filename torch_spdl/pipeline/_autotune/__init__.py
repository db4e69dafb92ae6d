"""Automatic concurrency (``pipe(..., concurrency="auto")``), split by job, one module each.

- ``vocabulary.py`` names the tuner's knobs, samples and decisions (data only), so that the
  declaration side and the public API can name them without importing the rest;
- ``rules.py`` decides (pure logic, tested on synthetic samples: no clock, no thread):
  the controller's face, handing each window to the phase whose turn it is, each phase
  one module over one shared record (``tuning_state.py``): ``phase_model.py``,
  ``phase_climb.py``, ``judge.py``, ``budget.py``, ``phase_hold.py``;
- ``model.py`` sizes stages from item costs (Little's law);
- ``meter.py`` measures those costs inside autotuned stages;
- ``probes.py`` reads the process (cores, CPU, memory);
- ``memory.py`` keeps what was learnt for the next build;
- ``tuner.py`` is the thread that reads the stages every tick and applies the decisions.

This module is the tuner's face: the names the rest of the engine uses.
"""

from .._core.protocols import QueueReading, StageReading, TunableStage
from .probes import cpu_count, read_rss
from .rules import AutotuneController
from .tuner import Autotuner
from .vocabulary import (
    DEFAULT_CPU_BUDGET,
    DEFAULT_MAX_COROUTINES,
    DEFAULT_MAX_THREADS,
    DEFAULT_START,
    DEFAULT_START_COROUTINES,
    AutotuneConfig,
    AutotuneSample,
    Decision,
    StageSample,
)

__all__ = [
    "DEFAULT_CPU_BUDGET",
    "DEFAULT_MAX_COROUTINES",
    "DEFAULT_MAX_THREADS",
    "DEFAULT_START",
    "DEFAULT_START_COROUTINES",
    "AutotuneConfig",
    "AutotuneController",
    "AutotuneSample",
    "Autotuner",
    "Decision",
    "QueueReading",
    "StageReading",
    "StageSample",
    "TunableStage",
    "cpu_count",
    "read_rss",
]

"""What every layer of the engine may import, and which imports no layer.

``protocols.py`` holds the contracts between the layers (what the runtime calls on a stage,
what a stage may ask of the runtime, what the tracer and the autotuner read of a stage),
``errors.py`` what the consumer is raised, ``stats.py`` the per-stage counters and their
snapshot. Folders import one way (see ``docs/engine.md``); where a lower folder must reach
a higher one, it goes through a contract written here.
"""

"""A pipeline declared: what ``PipelineBuilder`` and SPDL's ``defs`` record, as frozen data.

Nothing here starts a thread or holds a channel, so a declaration can be built many times,
pickled to a subprocess, or profiled stage by stage: ``config.py`` holds the stage and
pipeline configs and the options of one build, ``ops.py`` what kind of op was passed,
``grouping.py`` how ``aggregate`` groups, ``placement.py`` the ``to()`` markers and the
regions they make, ``failures.py`` what ``max_failures`` allows.
"""

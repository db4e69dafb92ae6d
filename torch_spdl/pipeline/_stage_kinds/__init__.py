"""The stages: every kind of node a pipeline is made of, each one module.

``node.py`` is the base they share (a worker is one method of the stage; starting,
counting and ending it, the one end-of-stream template, counters and failure policy are
the base's), ``op_stage.py`` what the stages that run a user's op share, and
``stage_hooks.py`` their ``stage_hook()`` contexts; the others are the kinds: the source,
a sync op on threads, an async op on the loop, ``aggregate``/``disaggregate``, the nested
pipelines (``Merge``, ``PathVariants``) and a ``to()`` region. A stage is made by the
build and driven by the runtime only through the contracts in ``_core/protocols.py``, so
no stage imports either.
"""

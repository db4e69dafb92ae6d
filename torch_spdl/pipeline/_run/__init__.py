"""A declaration run: assembled into stages and channels, owned by a runtime, consumed.

``assemble.py`` turns a declaration and the options of one build into nodes and channels;
``runtime.py`` owns every thread, task and executor of the run; ``pipeline.py`` is the
consumer's side (``Pipeline``); ``tracer.py`` records a traced run and
``trace_record.py`` holds what it recorded and exports it.
"""

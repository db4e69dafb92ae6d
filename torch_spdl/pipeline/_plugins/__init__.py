"""What a user plugs into a build or a stage, as SPDL defines it: task hooks
(``build(task_hook_factory=)``), queue classes (``build(queue_class=)``), background tasks
(``build(background_tasks=)``) and priority executors (``pipe(executor=)``).

Each is an interface of SPDL's with the engine's side of it: the wrappers that run hooks
around a stage's tasks, the channel that reports to a queue class, the runner of background
tasks on the pipeline's loop, the heap in front of a pool. None is on the per-item path of a
pipeline that does not use it.
"""

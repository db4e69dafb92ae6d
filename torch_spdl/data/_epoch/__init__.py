"""One DataLoader epoch, planned and run: the frozen plan and the resources a loader keeps
(``epoch_plan.py``), ``worker_type="auto"``'s measurement and choice
(``thread_or_process.py``), the stages and bounds an epoch declares (``stage_specs.py``,
``batch_budget.py``), who runs its work (``epoch_executors.py``), the per-batch ops
(``batch_ops.py``), loading driven by ``next()`` itself (``caller.py``), the shapes of its
pipeline (``epoch_shapes.py``, ``epoch_pipeline.py``), the owner of its waits where no
pipeline runs (``idle_run.py``), the transfer stage (``batch_transfer.py``) and the epoch
itself (``epoch.py``). It is the top folder of ``data/``: it may import every other folder
(``_loading/``, ``_workers/``, and ``_ray_actors/`` only when Ray workers are asked for)
and the public names of ``torch_spdl.pipeline`` and ``torch_spdl.io``; only the files at
the top of ``data/`` (the face) import it.
"""

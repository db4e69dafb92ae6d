"""The loader's own workers and their transport: worker processes that load whole batches
(``process_pool.py``, the loader's side; ``process_child.py``, what runs in the child, and
the messages between them), what outlives a worker process (``worker_record.py``), the
sender thread of their tasks (``worker_outbox.py``), their niceness
(``worker_priority.py``), the shared-memory arenas a batch crosses in
(``shared_batch.py``, ``arena_leases.py``) and the C allocator requests made where the
loader owns the process (``libc.py``); and the workers that read an ``IterableDataset`` in
torch's order, as processes (``iterable_processes.py``) or threads
(``iterable_threads.py``). It may import ``data/_loading/`` and, of the rest of torch_spdl,
the process wire (``torch_spdl._procwire``); never ``data/_epoch/`` (the epoch drives the
workers, not the reverse), Ray, or the engine.
"""

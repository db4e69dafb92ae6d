"""Loading a batch from the user's dataset the way one of torch's workers does, the same
wherever it runs (a loader thread, a worker process, a Ray actor): the dataset's stages
(``staged_dataset.py``, the ``StagedDataset`` users subclass) and a staged batch run inside
one worker (``staged_batch.py``), the worker's identity that ``get_worker_info()`` answers
(``worker_info.py``), a batch fetched in one go (``fetch.py``), the per-sample ops
(``sample_ops.py``: slots, stage wrappers, rebatch, collate), torch's ``default_collate``
into recycled buffers (``collate.py``), and ``BatchWorkers``, what an epoch asks of
workers that load whole batches (``batch_workers.py``, written here so that worker
processes and Ray actors implement it without importing each other). It is the lowest
folder of ``data/``: it imports no other module of ``data/``, and of the rest of
torch_spdl only ``torch_spdl.io``'s public names.
"""

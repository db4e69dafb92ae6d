"""DataLoader workers that are Ray actors (``worker_type="ray"``): what runs in each actor,
one of torch's workers placed anywhere in a cluster (``ray_actor.py``), and the loader's
side, which keeps the contract of the local worker processes so that every loading shape
feeds either (``ray_workers.py``). It may import ``data/_loading/`` and, of the rest of
torch_spdl, the process wire and the Ray layer (``torch_spdl._ray``); nothing of it is
imported until an epoch asks for Ray workers, so ``import torch_spdl`` never loads Ray.
"""

"""Drop-ins for torchvision's datasets, staged for torch_spdl's loader (``torch-spdl
migrate`` rewrites ``torchvision.datasets.ImageFolder`` and ``DatasetFolder`` to these).

Imported on its own (``import torch_spdl.vision``): it imports torchvision, which a
script that only swaps its DataLoader import need not load."""

from ._folders import DatasetFolder, ImageFolder

__all__ = ["DatasetFolder", "ImageFolder"]

"""torch_spdl: fast staged data loading for PyTorch.

``torch_spdl.pipeline`` is the engine. Importing ``torch_spdl`` itself stays light (it does
not import torch), so pipelines start quickly, in subprocesses too.
"""

from .pipeline import Pipeline, PipelineBuilder, PipelineFailure

__version__ = "0.1.0"

__all__ = ["Pipeline", "PipelineBuilder", "PipelineFailure", "__version__"]

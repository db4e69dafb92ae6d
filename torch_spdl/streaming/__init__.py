"""torch_spdl.streaming: training data streamed from object storage.

WebDataset tar shards on S3, HTTP(S) or a file system, read with ranged requests on an
event loop (the read concurrency is a pipeline stage's), split into samples, decoded by
:mod:`torch_spdl.io`, dealt to ranks and DataLoader workers without duplicates, shuffled
by a seed and an epoch, retried on transient errors (from the byte a cut response stopped
at), resumable mid-epoch (reading back only the samples not yet delivered, on the same or
another number of ranks and workers), and kept in a local cache bounded by size if asked.

- :class:`StreamingDataset`: the ``IterableDataset`` for ``torch_spdl.DataLoader``
  (torch's works too), ``StagedDataModule`` and, through :meth:`StreamingDataset.builder`,
  a ``PipelineBuilder``;
- :func:`expand_urls` / :func:`list_shards`: shard lists from patterns and listings;
- :class:`RetryPolicy`, :class:`ShardReadError`, :class:`ShardFailure`: retries and the
  errors that name the shard;
- :class:`Consumer`: one (rank, worker) reader of the shard list.

Reading ``s3://`` needs ``s3fs`` (``pip install torch_spdl[streaming]``), ``http(s)://``
needs ``aiohttp`` (which ``s3fs`` brings).
"""

from ._dataset import StreamingDataset
from ._decode import Decoder
from ._errors import ShardFailure, ShardReadError
from ._plan import Consumer
from ._retry import RetryPolicy, is_transient
from ._urls import expand_urls, list_shards

__all__ = [
    "Consumer",
    "Decoder",
    "RetryPolicy",
    "ShardFailure",
    "ShardReadError",
    "StreamingDataset",
    "expand_urls",
    "is_transient",
    "list_shards",
]

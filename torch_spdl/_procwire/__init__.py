"""The process wire: what every process boundary of torch_spdl shares.

``iterate_in_subprocess``, ``run_pipeline_in_subprocess``, a ``to()`` region's workers, a
process-pool stage's chunks and the DataLoader's worker processes each cross a process
boundary. They share here one way to do each part of it: typed messages and the wire's
pickle (:mod:`.messages`), errors that cross with their traceback and cause
(:mod:`.errors`), one start, wait and stop of a child process (:mod:`.children`), and
torch's round-robin across workers (:mod:`.turns`).

This package is shared by ``torch_spdl.pipeline`` and ``torch_spdl.data``: a private
module of the parent package, which its subpackages may import (``scripts/import_cycles.py``);
it is the lowest layer and imports nothing of torch_spdl.
"""

from .children import Child, ChildGone, Sender, WaitResult, Watch
from .errors import PortableError
from .messages import (
    End,
    Failed,
    Items,
    Outcomes,
    Stop,
    call_each,
    decode,
    dumps,
    encode,
    pickle_error,
    receive,
    send,
)
from .turns import RoundRobin

__all__ = [
    "Child",
    "ChildGone",
    "End",
    "Failed",
    "Items",
    "Outcomes",
    "PortableError",
    "RoundRobin",
    "Sender",
    "Stop",
    "WaitResult",
    "Watch",
    "call_each",
    "decode",
    "dumps",
    "encode",
    "pickle_error",
    "receive",
    "send",
]

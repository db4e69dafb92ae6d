"""Ray, as torch_spdl uses it: a cluster reached, actors placed, batches across.

``DataLoader(worker_type="ray")`` (``torch_spdl.data``) and a pipeline's
``to(RayActors(...))`` region (``torch_spdl.pipeline``) both run work in Ray actors
somewhere in a cluster. They share here what does not depend on what the actors run:
importing Ray with a message that says how to install it, connecting to a cluster with an
error that names the address when it cannot be reached, refusing at once actor options
that no node of the cluster can satisfy (Ray itself would wait for such a node forever),
a set of actors with a bounded budget of replacements (:mod:`.actors`), and the
out-of-band form in which tensors cross the object store without a copy
(:mod:`.tensors`).

Like the process wire (``torch_spdl._procwire``), this is a private module of the parent
package, shared by ``torch_spdl.data`` and ``torch_spdl.pipeline``; it imports nothing of
torch_spdl but the process wire, and it imports Ray only when called: ``import
torch_spdl`` never loads Ray.
"""

from .actors import ActorSet, ReplacementsExhausted
from .cluster import connect, describe_request, require_ray
from .tensors import pack, unpack

__all__ = [
    "ActorSet",
    "ReplacementsExhausted",
    "connect",
    "describe_request",
    "pack",
    "require_ray",
    "unpack",
]

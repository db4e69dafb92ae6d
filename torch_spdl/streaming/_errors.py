"""The errors a stream raises: a read that failed, and a shard over its failure budget.

Both name the URL of the shard: with thousands of shards, an error without it cannot be
acted on. They pickle with their fields, since they are raised in DataLoader worker
processes and re-raised in the training process.
"""

from __future__ import annotations

__all__ = ["ShardFailure", "ShardReadError"]


class ShardReadError(OSError):
    """A read of a shard failed: for good, or after every retry. ``url`` names the object,
    ``attempts`` how many times it was tried, ``__cause__`` the last error."""

    def __init__(self, url: str, what: str, attempts: int, cause: BaseException) -> None:
        super().__init__(
            f"reading {url} ({what}) failed after {attempts} attempt"
            f"{'s' if attempts != 1 else ''}: {type(cause).__name__}: {cause}"
        )
        self.url = url
        self.attempts = attempts

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class ShardFailure(RuntimeError):
    """A shard had more bad samples than ``max_failures_per_shard`` allows. ``url`` names
    it, ``failures`` counts them, ``__cause__`` is the last one's error."""

    def __init__(self, url: str, failures: int, limit: int, last: BaseException) -> None:
        super().__init__(
            f"shard {url}: {failures} sample(s) failed, over the budget of {limit} per shard; "
            f"the last: {type(last).__name__}: {last}"
        )
        self.url = url
        self.failures = failures

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(
    cls: type[Exception], args: tuple[object, ...], fields: dict[str, object]
) -> Exception:
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(fields)
    return exc

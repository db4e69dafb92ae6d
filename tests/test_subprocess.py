"""iterate_in_subprocess and run_pipeline_in_subprocess.

Children start with "spawn", which pickles what they run by reference, so every function a
child runs is defined at module level here; the child imports this module by name (pytest
puts tests/ on sys.path, and spawn hands sys.path to the child). Each child costs about a
second to start, so the tests keep their number down.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import threading

import pytest

from torch_spdl.pipeline import (
    PipelineBuilder,
    PipelineFailure,
    SubprocessError,
    iterate_in_subprocess,
    run_pipeline_in_subprocess,
)

# -- what the children run (module level: spawn pickles them by reference) ----------------


def squares(n: int):
    for i in range(n):
        yield i * i


def ten_items():
    return list(range(10))


class ChildError(Exception):
    """Raised in the child; defined here so the parent can unpickle it as itself."""


def fail_after(n: int):
    yield from range(n)
    raise ChildError(f"failed after {n} items")


class _Unpicklable(Exception):
    def __init__(self, message: str, handle: object) -> None:
        super().__init__(message)
        self.handle = handle


def fail_unpicklably():
    yield 1
    raise _Unpicklable("cannot cross", threading.Lock())


def fail_with_a_cause():
    yield 1
    try:
        int("not a number")
    except ValueError as exc:
        raise ChildError("could not parse") from exc


def endless():
    i = 0
    while True:
        yield i
        i += 1


STALL_S = 1.5  # the child stalls this long (it ends by itself, so nothing can hang)


def stall():
    threading.Event().wait(STALL_S)  # waits for a set() that never comes
    yield "late"


def child_pid():
    import os

    yield os.getpid()


def double(x: int) -> int:
    return 2 * x


async def plus_one(x: int) -> int:
    await asyncio.sleep(0)
    return x + 1


def repeat_twice(x: int):
    yield x
    yield x


def odd_only(x: int) -> int | None:
    return x if x % 2 else None


def total(batch: list[int]) -> int:
    return sum(batch)


def fail_on_sevens(x: int) -> int:
    if x % 7 == 0:
        raise ValueError(f"no sevens: {x}")
    return x


def example_builder() -> PipelineBuilder:
    return (
        PipelineBuilder()
        .add_source(range(40))
        .pipe(double, concurrency=3, output_order="input")
        .pipe(plus_one, concurrency=2, output_order="input")
        .pipe(repeat_twice)
        .pipe(odd_only, concurrency=2, output_order="input")
        .aggregate(5)
        .pipe(total)
        .add_sink(4)
    )


# -- helpers ------------------------------------------------------------------------------


def assert_no_children() -> None:
    # active_children() also reaps children that have exited.
    assert multiprocessing.active_children() == []


@pytest.fixture(autouse=True)
def no_child_left():
    assert_no_children()
    yield
    assert_no_children()


# -- iterate_in_subprocess ----------------------------------------------------------------


def test_yields_exactly_the_items_of_a_partial():
    assert list(iterate_in_subprocess(functools.partial(squares, 20), buffer_size=2)) == [
        i * i for i in range(20)
    ]


def test_yields_exactly_the_items_of_a_function_returning_a_list():
    assert list(iterate_in_subprocess(ten_items)) == list(range(10))


def test_runs_in_another_process():
    import os

    (pid,) = iterate_in_subprocess(child_pid)
    assert pid != os.getpid()


def test_child_exception_is_reraised_with_its_type_after_the_items():
    got = []
    with pytest.raises(ChildError, match="failed after 3 items") as info:
        for item in iterate_in_subprocess(functools.partial(fail_after, 3)):
            got.append(item)
    assert got == [0, 1, 2]
    assert any("subprocess" in note for note in getattr(info.value, "__notes__", []))


def test_unpicklable_child_exception_becomes_subprocess_error():
    got = []
    with pytest.raises(SubprocessError, match="cannot cross"):
        for item in iterate_in_subprocess(fail_unpicklably):
            got.append(item)
    assert got == [1]


def test_child_exception_keeps_its_cause_and_the_childs_traceback():
    with pytest.raises(ChildError, match="could not parse") as info:
        list(iterate_in_subprocess(fail_with_a_cause))
    assert isinstance(info.value.__cause__, ValueError)
    notes = "\n".join(info.value.__notes__)
    assert "fail_with_a_cause" in notes  # the child's traceback, as it printed it


def test_unpicklable_fn_is_a_type_error_before_any_child_starts():
    with pytest.raises(TypeError, match="pickle"):
        iterate_in_subprocess(lambda: range(3))
    assert_no_children()

    def local_gen():
        yield 1

    with pytest.raises(TypeError, match="pickle"):
        iterate_in_subprocess(local_gen)
    with pytest.raises(TypeError, match="initializer"):
        iterate_in_subprocess(ten_items, initializer=lambda: None)
    assert_no_children()


def test_closing_early_joins_the_child():
    iterator = iterate_in_subprocess(endless, buffer_size=2)
    got = []
    for item in iterator:
        got.append(item)
        if len(got) == 5:
            break
    assert got == [0, 1, 2, 3, 4]
    (child,) = multiprocessing.active_children()  # still running until closed
    iterator.close()
    # The child stopped by itself at its next slot (exit code 0); it was not left to the
    # join-then-terminate path, which would have ended it by a signal (a negative code).
    assert child.exitcode == 0
    assert_no_children()


def test_breaking_out_of_a_for_loop_joins_the_child():
    got = []
    for item in iterate_in_subprocess(endless, buffer_size=1):
        got.append(item)
        if len(got) == 3:
            break
    # The loop held the only reference to the generator: leaving it closed the generator.
    assert got == [0, 1, 2]
    assert_no_children()


def test_timeout_when_the_child_stalls():
    # The child cannot yield before STALL_S, five times the timeout, however loaded the
    # machine is. (The timeout bounds every wait, the first included, so a child that
    # yielded once and then stalled would need a timeout longer than a child's start-up.)
    with pytest.raises(TimeoutError, match="0.3 s"):
        next(iterate_in_subprocess(stall, timeout=0.3))
    # Raised, then cleaned up: the stalled child finished its wait and was joined.
    assert_no_children()


# -- run_pipeline_in_subprocess -----------------------------------------------------------


def test_run_pipeline_in_subprocess_matches_in_process():
    builder = example_builder()
    pipeline = builder.build(num_threads=2)
    expected = list(pipeline)
    assert expected  # the pipeline makes something
    assert list(run_pipeline_in_subprocess(builder, num_threads=2, buffer_size=2)) == expected


def test_run_pipeline_in_subprocess_reraises_a_pipeline_failure():
    builder = PipelineBuilder().add_source(range(30)).pipe(fail_on_sevens).add_sink(3)
    got = []
    with pytest.raises(PipelineFailure) as info:
        for item in run_pipeline_in_subprocess(builder, max_failures=1):
            got.append(item)
    assert info.value.stage == "1:fail_on_sevens"
    assert info.value.num_failures == 2
    # What reached the parent is in order and from before the second failure (a failure
    # discards what is still queued, so how much got through varies).
    before = [x for x in range(14) if x % 7]
    assert got == before[: len(got)]

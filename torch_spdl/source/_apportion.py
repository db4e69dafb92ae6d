"""How many samples each source gives an epoch of a mix, and in which phases.

A mix promises counts, not just proportions: the same ``(seed, epoch)`` must give every
rank the same global order, and a property test must be able to say what the epoch
holds. So the counts are computed exactly, in rational arithmetic (``Fraction`` of the
weights as given, which is exact for floats), never with a random draw per sample:

- :func:`apportion`: ``total`` split by the weights (largest remainders, ties to the
  lower index), the counts summing to ``total`` exactly;
- :func:`policy_quotas`: each source's count for an epoch under a policy
  (``"first_exhausted"``, ``"cycle"``, ``"all_exhausted"``) and an optional epoch length;
- :func:`phases`: the epoch cut where a source runs out, so that the weights decide the
  proportions while every source still has samples left (the order inside a phase is a
  seeded uniform shuffle: ``_weighted_mix``).

Pure functions of ints and weights; no RNG, no torch.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from fractions import Fraction

__all__ = ["POLICIES", "apportion", "check_weights", "phases", "policy_quotas"]

POLICIES = ("first_exhausted", "cycle", "all_exhausted")


def check_weights(weights: Sequence[float], count: int) -> list[Fraction]:
    """The weights as exact fractions; ValueError unless one finite positive per source."""
    if len(weights) != count:
        raise ValueError(f"got {len(weights)} weights for {count} sources")
    exact: list[Fraction] = []
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
            raise ValueError(f"weight {i} must be a finite number, got {w!r}")
        if w <= 0:
            raise ValueError(f"weight {i} must be positive, got {w!r}")
        exact.append(Fraction(float(w)))
    return exact


def apportion(total: int, weights: Sequence[Fraction]) -> list[int]:
    """``total`` split in proportion to ``weights``: each gets the floor of its share, and
    the remainder goes one each to the largest fractional parts (lower index first)."""
    wsum = sum(weights)
    ideal = [total * w / wsum for w in weights]
    counts = [math.floor(x) for x in ideal]
    left = total - sum(counts)
    by_fraction = sorted(range(len(weights)), key=lambda i: (-(ideal[i] - counts[i]), i))
    for i in by_fraction[:left]:
        counts[i] += 1
    return counts


def _fits(counts: list[int], lengths: Sequence[int]) -> bool:
    return all(c <= n for c, n in zip(counts, lengths, strict=True))


def _first_exhausted(lengths: Sequence[int], weights: Sequence[Fraction]) -> int:
    """The longest epoch in which no source gives more than it has."""
    wsum = sum(weights)
    total = math.floor(min(n * wsum / w for n, w in zip(lengths, weights, strict=True)))
    while _fits(apportion(total + 1, weights), lengths):  # rounding may leave room
        total += 1
    while total > 0 and not _fits(apportion(total, weights), lengths):
        total -= 1
    return total


def _cycle(lengths: Sequence[int], weights: Sequence[Fraction]) -> int:
    """The shortest epoch in which every source gives at least all it has."""
    wsum = sum(weights)
    total = math.ceil(max(n * wsum / w for n, w in zip(lengths, weights, strict=True)))

    def covers(t: int) -> bool:
        return all(c >= n for c, n in zip(apportion(t, weights), lengths, strict=True))

    while total > 0 and covers(total - 1):  # rounding may cover sooner
        total -= 1
    while not covers(total):
        total += 1
    return total


def _water_fill(total: int, lengths: Sequence[int], weights: Sequence[Fraction]) -> list[int]:
    """``total`` (at most ``sum(lengths)``) split by the weights, no source past its length:
    a source that would be is capped at its length and the rest is split among the others."""
    capped: dict[int, int] = {}
    while True:
        free = [i for i in range(len(lengths)) if i not in capped]
        rest = total - sum(capped.values())
        shares = apportion(rest, [weights[i] for i in free]) if free else []
        over = [i for i, c in zip(free, shares, strict=True) if c > lengths[i]]
        if not over:
            counts = [0] * len(lengths)
            for i, n in capped.items():
                counts[i] = n
            for i, c in zip(free, shares, strict=True):
                counts[i] = c
            return counts
        for i in over:
            capped[i] = lengths[i]


def policy_quotas(
    lengths: Sequence[int],
    weights: Sequence[Fraction],
    policy: str,
    epoch_length: int | None,
) -> tuple[list[int], str | None]:
    """Each source's count for one epoch, and a note when ``epoch_length`` could not be
    honoured (the caller warns with it).

    - ``"first_exhausted"``: the epoch ends when the first source runs out (no sample
      twice); an ``epoch_length`` beyond that point is cut to it.
    - ``"cycle"``: the epoch ends when the last source has given all its samples once;
      the others start over (a new shuffle each pass) as often as their weight asks.
      With ``epoch_length``, exactly that many, every source cycling as needed.
    - ``"all_exhausted"``: every sample of every source once; a source that runs out
      leaves the mix and the others go on in their proportions. With ``epoch_length``
      below the total, that many, split by the weights with no source past its length.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    total_len = sum(lengths)
    if policy == "cycle":
        if any(n == 0 for n in lengths):
            raise ValueError("policy 'cycle' cannot cycle an empty source")
        total = _cycle(lengths, weights) if epoch_length is None else epoch_length
        return apportion(total, weights), None
    if policy == "first_exhausted":
        limit = _first_exhausted(lengths, weights)
        total = limit if epoch_length is None else min(epoch_length, limit)
        note = None
        if epoch_length is not None and epoch_length > limit:
            note = (
                f"epoch_length={epoch_length} is past where policy 'first_exhausted' stops "
                f"(the first source runs out after {limit} samples): the epoch has {limit}"
            )
        return apportion(total, weights), note
    if epoch_length is None or epoch_length >= total_len:
        note = None
        if epoch_length is not None and epoch_length > total_len:
            note = (
                f"epoch_length={epoch_length} is more than the {total_len} samples of all "
                "sources, which policy 'all_exhausted' gives once each: the epoch has "
                f"{total_len}"
            )
        return list(lengths), note
    return _water_fill(epoch_length, lengths, weights), None


def phases(quotas: Sequence[int], weights: Sequence[Fraction]) -> list[list[int]]:
    """The epoch as consecutive phases, each a count per source: in a phase every source
    with samples left draws at its weight's rate, and the phase ends when one of them has
    given its quota. The counts of all phases add up to ``quotas`` exactly."""
    remaining = list(quotas)
    out: list[list[int]] = []
    while any(remaining):
        active = [i for i, r in enumerate(remaining) if r > 0]
        wsum = sum(weights[i] for i in active)
        ends = {i: remaining[i] * wsum / weights[i] for i in active}
        span = min(ends.values())
        counts = [0] * len(remaining)
        for i in active:
            counts[i] = (
                remaining[i]
                if ends[i] == span
                else min(remaining[i], round(span * weights[i] / wsum))
            )
        out.append(counts)
        remaining = [r - c for r, c in zip(remaining, counts, strict=True)]
    return out

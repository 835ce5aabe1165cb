"""Which tokens of the KV cache each rank holds. No MPI here."""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple



def token_range(S_kv: int, n_ranks: int, rank: int) -> Tuple[int, int]:
    """``[start, stop)`` of ``rank``'s tokens: contiguous, balanced, covering all.

    The first ``S_kv % n_ranks`` ranks take one token more; when ``S_kv < n_ranks``
    the last ranks take none (SPEC defects 2 and 6 fixed).
    """
    base, extra = divmod(S_kv, n_ranks)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def split_range(split: Sequence[int], rank: int) -> Tuple[int, int]:
    """``[start, stop)`` of ``rank`` when each rank's token count is given."""
    start = sum(split[:rank])
    return start, start + split[rank]


def rank_tokens(S_kv: int, n_ranks: int, rank: int,
                split: Optional[Sequence[int]] = None) -> Tuple[int, int]:
    """``[start, stop)`` of ``rank``'s tokens: the given ``split``, else
    :func:`token_range`."""
    if split is not None:
        return split_range(split, rank)
    return token_range(S_kv, n_ranks, rank)


class Placement(NamedTuple):
    """Which rank takes each new token of a growing cache (``--placement``).

    ``block`` None is ``contiguous`` (the last rank takes every new token, as Tree
    Attention); otherwise token ``t`` goes to rank ``(t // block) mod n``: 1 is
    ``round-robin`` (vLLM's interleave), ``B`` is ``blocks:B`` (Helix).
    """

    block: Optional[int] = None

    @classmethod
    def parse(cls, text) -> "Placement":
        """``contiguous``, ``round-robin`` or ``blocks:B``; ValueError otherwise."""
        if isinstance(text, Placement):
            return text
        if text == "contiguous":
            return cls(None)
        if text == "round-robin":
            return cls(1)
        head, _, size = str(text).partition(":") if isinstance(text, str) else ("", "", "")
        if head == "blocks" and size.isdigit() and int(size) > 0:
            return cls(int(size))
        raise ValueError(f"--placement must be contiguous, round-robin or blocks:B with B "
                         f"a positive number of tokens, got {text!r}")

    def __str__(self) -> str:
        if self.block is None:
            return "contiguous"
        return "round-robin" if self.block == 1 else f"blocks:{self.block}"

    @property
    def contiguous(self) -> bool:
        return self.block is None

    def owner(self, token: int, n_ranks: int) -> int:
        """The rank that takes new token ``token`` (a global index)."""
        return n_ranks - 1 if self.block is None else token // self.block % n_ranks

    def taken(self, rank: int, n_ranks: int, first: int, stop: int) -> int:
        """How many of the new tokens ``first .. stop-1`` ``rank`` takes (counted, not
        enumerated: any number of tokens costs the same)."""
        if self.block is None:
            return stop - first if rank == n_ranks - 1 else 0
        block, cycle = self.block, self.block * n_ranks

        def before(x: int) -> int:     # tokens t < x with (t // block) % n == rank
            return x // cycle * block + min(max(x % cycle - rank * block, 0), block)
        return before(stop) - before(first)

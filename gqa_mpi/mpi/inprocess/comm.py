"""An in-process communicator: the part of mpi4py's ``Comm`` that gqa_mpi uses, with
its names, arguments and matching rules (by source and tag, in order; each
communicator a context of its own), and the Cartesian and distributed-graph ones cut
from it. Sends are buffered: a send completes at once, its bytes (an object's pickle)
copied, as MPI may do for any message."""
from __future__ import annotations

import itertools
import pickle
from typing import Any, Callable, Hashable, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .collectives import Collectives
from .world import Message, Request, Status, World, as_bytes, copy_into


class Group:
    """The world ranks of a communicator, in its rank order."""

    def __init__(self, ranks: Sequence[int]):
        self.ranks = list(ranks)

    def Translate_ranks(self, ranks: Sequence[int], other: "Group") -> List[int]:
        return [MPI.PROC_NULL if r == MPI.PROC_NULL else
                other.ranks.index(self.ranks[r]) if self.ranks[r] in other.ranks
                else MPI.UNDEFINED for r in ranks]

    def Free(self) -> None:
        pass


class Comm(Collectives):
    """One rank's communicator (see the module doc); made by :func:`run` and by the
    collective constructors (``Dup``, ``Split``, ``Create_cart``, ...) of another."""

    in_process = True
    """Tells gqa_mpi's own code (statuses, operators, the host) it has no MPI behind it."""

    def __init__(self, world: World, context: Hashable, ranks: Sequence[int], rank: int):
        self.world, self.context, self.ranks, self.rank = world, context, list(ranks), rank
        self.size = len(self.ranks)
        self.name = "in-process"
        self._made = itertools.count()
        self._collectives = itertools.count()

    def Get_name(self) -> str:
        return self.name

    def Set_name(self, name: str) -> None:
        self.name = name

    def Get_group(self) -> Group:
        return Group(self.ranks)

    def Get_topology(self) -> int:
        return MPI.UNDEFINED

    def Free(self) -> None:
        pass

    def Abort(self, code: int = 1) -> None:
        self.world.abort(code)

    # ---- point to point
    def _box(self, dest: int, channel: str = "p2p") -> Tuple[Hashable, int]:
        if not 0 <= dest < self.size:
            raise RuntimeError(f"rank {dest} is not in a communicator of {self.size} "
                               f"(MPI_ERR_RANK)")
        return (self.context, channel), dest

    def _put(self, payload: bytes, dest: int, tag: int, channel: str = "p2p") -> None:
        if dest != MPI.PROC_NULL:
            self.world.put(self._box(dest, channel), Message(self.rank, tag, payload))

    def _take(self, source: int, tag: int, channel: str = "p2p") -> Callable[[], Any]:
        box = self._box(self.rank, channel)
        return lambda: self.world.match(box, source, tag, take=True)

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        self._put(as_bytes(buf), dest, tag)

    def Isend(self, buf, dest: int, tag: int = 0) -> Request:
        self.Send(buf, dest, tag)
        return Request(self.world)

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        self._put(pickle.dumps(obj), dest, tag)

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        self.send(obj, dest, tag)
        return Request(self.world)

    def Recv(self, buf, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG,
             status: Optional[Status] = None) -> None:
        if source == MPI.PROC_NULL:
            return
        m = self.world.wait(self._take(source, tag))
        copy_into(buf, m.payload, "Recv")
        if status is not None:
            status.fill(m)

    def Irecv(self, buf, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG) -> Request:
        take = self._take(source, tag)

        def step() -> bool:
            m = take()
            if m is not None:
                copy_into(buf, m.payload, "Irecv")
            return m is not None
        return Request(self.world, step)

    def recv(self, buf=None, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG,
             status: Optional[Status] = None) -> Any:
        m = self.world.wait(self._take(source, tag))
        if status is not None:
            status.fill(m)
        return pickle.loads(m.payload)

    def irecv(self, buf=None, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG) -> Request:
        take = self._take(source, tag)

        def step() -> bool:
            m = take()
            if m is not None:
                request.value = pickle.loads(m.payload)
            return m is not None
        request = Request(self.world, step)
        return request

    def Iprobe(self, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG,
               status: Optional[Status] = None) -> bool:
        box = self._box(self.rank)
        with self.world.cond:
            m = self.world.match(box, source, tag, take=False)
        if m is not None and status is not None:
            status.fill(m)
        return m is not None

    # ---- new communicators: every rank calls them in the same order
    def _context(self, *what) -> Hashable:
        return (self.context, next(self._made)) + what

    def Dup(self) -> "Comm":
        return Comm(self.world, self._context("dup"), self.ranks, self.rank)

    def Split(self, color: int = 0, key: int = 0) -> "Comm":
        every = self.allgather((color, key))
        members = sorted((k, r) for r, (c, k) in enumerate(every) if c == color)
        ranks = [self.ranks[r] for _, r in members]
        return Comm(self.world, self._context("split", color), ranks,
                    [r for _, r in members].index(self.rank))

    def Create_cart(self, dims: Sequence[int], periods=None, reorder: bool = False
                    ) -> "Cartcomm":
        if int(np.prod(dims)) != self.size:
            raise NotImplementedError("in-process Create_cart covers the whole communicator")
        return Cartcomm(self.world, self._context("cart"), self.ranks, self.rank, dims,
                        periods or [False] * len(dims))

    def Create_dist_graph_adjacent(self, sources, destinations, sourceweights=None,
                                   destweights=None, reorder: bool = False
                                   ) -> "Distgraphcomm":
        comm = Distgraphcomm(self.world, self._context("graph"), self.ranks, self.rank)
        comm.neighbours = (list(sources), list(destinations),
                           (list(sourceweights or []), list(destweights or [])))
        return comm


class Cartcomm(Comm):
    """A Cartesian communicator, row-major as MPI's."""

    def __init__(self, world, context, ranks, rank, dims, periods):
        super().__init__(world, context, ranks, rank)
        self.dims, self.periods = list(dims), [bool(p) for p in periods]

    def Get_topology(self) -> int:
        return MPI.CART

    def Get_coords(self, rank: int) -> List[int]:
        return [int(c) for c in np.unravel_index(rank, self.dims)]

    def Get_cart_rank(self, coords: Sequence[int]) -> int:
        return int(np.ravel_multi_index(coords, self.dims))

    def Shift(self, direction: int, disp: int) -> Tuple[int, int]:
        """``(source, dest)``: the ranks ``disp`` before and after along ``direction``."""
        def along(step: int) -> int:
            coords = self.Get_coords(self.rank)
            c = coords[direction] + step
            if self.periods[direction]:
                c %= self.dims[direction]
            elif not 0 <= c < self.dims[direction]:
                return MPI.PROC_NULL
            coords[direction] = c
            return self.Get_cart_rank(coords)
        return along(-disp), along(disp)

    def Sub(self, remain_dims: Sequence[bool]) -> "Cartcomm":
        mine = self.Get_coords(self.rank)
        kept = [i for i, keep in enumerate(remain_dims) if keep]
        color = tuple(c for i, c in enumerate(mine) if not remain_dims[i])
        members = [r for r in range(self.size)
                   if tuple(c for i, c in enumerate(self.Get_coords(r))
                            if not remain_dims[i]) == color]   # row-major: in order
        return Cartcomm(self.world, self._context("sub", color),
                        [self.ranks[r] for r in members], members.index(self.rank),
                        [self.dims[i] for i in kept], [self.periods[i] for i in kept])


class Distgraphcomm(Comm):
    """A distributed graph communicator: each rank's neighbours as it gave them."""

    neighbours: tuple = ([], [], ([], []))

    def Get_topology(self) -> int:
        return MPI.DIST_GRAPH

    def Get_dist_neighbors(self) -> tuple:
        return self.neighbours

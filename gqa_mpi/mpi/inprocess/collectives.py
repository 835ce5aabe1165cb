"""The collectives of an in-process communicator, each on a channel of its own (apart
from point-to-point messages) and each call under a tag of its own, so that they match
as MPI's do: every rank calls them in the same order. Reductions go in rank order."""
from __future__ import annotations

import functools
import operator
import pickle
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
from mpi4py import MPI

from .world import Request, as_bytes, copy_into


class Op:
    """A user-defined reduction ``fn(inbuf, inoutbuf, datatype)``, as ``MPI.Op.Create``."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def Free(self) -> None:
        pass


def place(recvbuf, payloads: List[bytes]) -> None:
    """Each rank's bytes at its displacement of ``[array, (counts, displs)]``."""
    if recvbuf is None:
        return
    data, (_, displs) = recvbuf
    flat = data.reshape(-1).view(np.uint8)
    unit = data.dtype.itemsize
    for payload, at in zip(payloads, displs):
        flat[at * unit:at * unit + len(payload)] = np.frombuffer(payload, np.uint8)


class Collectives:
    """Mixed into :class:`~.comm.Comm`: its collective calls, made of its
    ``_put(payload, dest, tag, channel)`` and ``_take(source, tag, channel)``."""

    def _next(self) -> int:
        return next(self._collectives)

    def _to_each(self, payloads: Sequence[bytes], tag: int) -> None:
        for dest, payload in enumerate(payloads):
            self._put(payload, dest, tag, "coll")

    def _from_each(self, tag: int) -> List[bytes]:
        return [self.world.wait(self._take(r, tag, "coll")).payload for r in range(self.size)]

    def _gather_bytes(self, payload: bytes, root: int, tag: int) -> Optional[List[bytes]]:
        self._put(payload, root, tag, "coll")
        return self._from_each(tag) if self.rank == root else None

    def _all_bytes(self, payload: bytes) -> List[bytes]:
        tag = self._next()
        self._to_each([payload] * self.size, tag)
        return self._from_each(tag)

    def gather(self, obj: Any, root: int = 0) -> Optional[List[Any]]:
        got = self._gather_bytes(pickle.dumps(obj), root, self._next())
        return None if got is None else [pickle.loads(b) for b in got]

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        tag = self._next()
        if self.rank == root:
            self._to_each([pickle.dumps(obj)] * self.size, tag)
        return pickle.loads(self.world.wait(self._take(root, tag, "coll")).payload)

    def allgather(self, obj: Any) -> List[Any]:
        return [pickle.loads(b) for b in self._all_bytes(pickle.dumps(obj))]

    def allreduce(self, obj: Any, op=None) -> Any:
        if op not in (None, MPI.SUM):
            raise NotImplementedError("in-process allreduce takes SUM only")
        return functools.reduce(operator.add, self.allgather(obj))

    def Ibarrier(self) -> Request:
        key = (self.context, "barrier", self._next())
        with self.world.cond:
            self.world.arrived[key] += 1
            self.world.cond.notify_all()
        return Request(self.world, lambda: self.world.arrived[key] >= self.size)

    def Allgather(self, sendbuf, recvbuf) -> None:
        copy_into(recvbuf, b"".join(self._all_bytes(as_bytes(sendbuf))), "Allgather")

    def Reduce(self, sendbuf, recvbuf, op=None, root: int = 0) -> None:
        """In rank order, ``x0 op (x1 op (... op x_{n-1}))``, as MPI defines it."""
        if not (isinstance(op, Op) or op in (None, MPI.SUM)):
            raise NotImplementedError("in-process Reduce takes SUM or a user operator")
        mine = np.ascontiguousarray(sendbuf[0] if isinstance(sendbuf, (list, tuple))
                                    else sendbuf)
        got = self._gather_bytes(mine.tobytes(), root, self._next())
        if got is None:
            return
        parts = [np.frombuffer(b, mine.dtype).copy() for b in got]
        acc = parts[-1]
        for part in reversed(parts[:-1]):
            if isinstance(op, Op):
                op.fn(memoryview(part), memoryview(acc), None)     # acc = part op acc
            else:
                acc = part + acc
        copy_into(recvbuf, acc.tobytes(), "Reduce")

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        got = self._gather_bytes(as_bytes(sendbuf), root, self._next())
        if got is not None:
            place(recvbuf, got)

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        data, (counts, displs) = sendbuf
        flat = np.ascontiguousarray(data).reshape(-1)
        tag = self._next()
        self._to_each([flat[a:a + n].tobytes() for n, a in zip(counts, displs)], tag)
        place(recvbuf, self._from_each(tag))

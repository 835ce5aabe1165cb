"""Every PE a thread of one process (``--in-process``, :func:`gqa_mpi.in_process`): the
communicators are in-process stand-ins for mpi4py's, their messages queues.

:func:`run` starts one thread per rank, each calling ``fn(comm)`` with its
:class:`Comm`, a stand-in for the part of mpi4py's communicator that gqa_mpi uses: the
same method names, arguments and matching rules (by source and tag, in order, each
communicator its own context, collectives apart from point-to-point), so the rest of
the package runs unchanged on it and its results are those of an MPI run of the same
grid, O bit for bit. No MPI is initialised: there is no launcher, and a debugger
(``breakpoint()`` in a kernel) stops the thread that hits it.

Sends are buffered: a send completes at once, its bytes (an object's pickle) copied,
as MPI may do for any message. A blocking call waits on the world's condition; once a
rank has called ``Abort``, every rank's next call raises :class:`Aborted` (a
``SystemExit`` with the code), and :func:`run` returns or raises that code.
"""
from __future__ import annotations

import itertools
import pickle
import signal
import sys
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np

import mpi4py

if "mpi4py.MPI" not in sys.modules:     # its constants only: threads need no MPI_Init
    mpi4py.rc.initialize = False          # (whoever needs MPI later initialises it, as
    mpi4py.rc.finalize = True             # collective.world() does)
from mpi4py import MPI  # noqa: E402

from ..exits import SIGNAL  # noqa: E402
from . import watchdog  # noqa: E402

LIBRARY = "in-process (a thread per PE, no MPI)"
"""What the record says in place of the MPI library's version."""
GRACE = 2.0
"""Seconds :func:`run` leaves the ranks to see an abort before it returns without them."""


class Aborted(SystemExit):
    """A rank called ``Abort(code)``: every rank leaves with ``code``."""


class _Message:
    __slots__ = ("source", "tag", "payload")

    def __init__(self, source: int, tag: int, payload: bytes):
        self.source, self.tag, self.payload = source, tag, payload


class _World:
    """What the ranks of one :func:`run` share: the mailboxes and the abort."""

    def __init__(self, size: int):
        self.size = size
        self.cond = threading.Condition()
        self.boxes: Dict[Tuple[Hashable, int], List[_Message]] = defaultdict(list)
        self.arrived: Dict[Hashable, int] = defaultdict(int)
        self.aborted: Optional[int] = None
        self.threads: set = set()

    def abort(self, code: int) -> None:
        with self.cond:
            if self.aborted is None:
                self.aborted = int(code)
            self.cond.notify_all()
        if threading.get_ident() in self.threads:
            raise Aborted(self.aborted)

    def check(self) -> None:
        if self.aborted is not None:
            raise Aborted(self.aborted)

    def put(self, box: Tuple[Hashable, int], message: _Message) -> None:
        with self.cond:
            self.check()
            self.boxes[box].append(message)
            self.cond.notify_all()

    def match(self, box, source: int, tag: int, take: bool) -> Optional[_Message]:
        """The first message of ``box`` from ``source`` with ``tag`` (either ANY); call
        with the condition held."""
        self.check()
        queue = self.boxes.get(box, ())
        for i, m in enumerate(queue):
            if source in (MPI.ANY_SOURCE, m.source) and tag in (MPI.ANY_TAG, m.tag):
                return queue.pop(i) if take else m
        return None

    def wait(self, ready: Callable[[], Any]) -> Any:
        """``ready()`` once it is true, the condition held while it is asked."""
        with self.cond:
            while True:
                self.check()
                got = ready()
                if got:
                    return got
                self.cond.wait(0.1)


class Status:
    """The source, tag and byte count of a probed or received message."""

    def __init__(self):
        self.source, self.tag, self.count = MPI.ANY_SOURCE, MPI.ANY_TAG, 0

    def fill(self, m: _Message) -> None:
        self.source, self.tag, self.count = m.source, m.tag, len(m.payload)

    def Get_source(self) -> int:
        return self.source

    def Get_tag(self) -> int:
        return self.tag

    def Get_count(self, datatype=None) -> int:
        """The message's size in bytes (gqa_mpi asks in ``MPI.BYTE`` only)."""
        return self.count


class Request:
    """A pending operation; ``step()`` tries to complete it and says whether it has."""

    def __init__(self, world: _World, step: Callable[[], bool] = lambda: True):
        self.world, self.step, self.done, self.value = world, step, False, None

    def Test(self) -> bool:
        if not self.done:
            with self.world.cond:
                self.done = self.step()
        return self.done

    def Wait(self) -> Any:
        if not self.done:
            self.done = self.world.wait(self.step)
        return self.value

    def test(self) -> Tuple[bool, Any]:
        return self.Test(), self.value

    def wait(self) -> Any:
        return self.Wait()


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


class Op:
    """A user-defined reduction ``fn(inbuf, inoutbuf, datatype)``, as ``MPI.Op.Create``."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def Free(self) -> None:
        pass


def _bytes(buf) -> bytes:
    """A message buffer's bytes: an array, a bytes-like, or ``[array, ...]``."""
    if isinstance(buf, (list, tuple)):
        buf = buf[0]
    return np.ascontiguousarray(buf).tobytes() if isinstance(buf, np.ndarray) else bytes(buf)


def _into(buf, payload: bytes, what: str) -> None:
    """Copy ``payload`` to the start of ``buf``; a message longer than it is MPI's
    truncation error."""
    if isinstance(buf, (list, tuple)):
        buf = buf[0]
    view = memoryview(buf).cast("B")
    if len(payload) > view.nbytes:
        raise RuntimeError(f"{what}: a message of {len(payload)} bytes into a buffer of "
                           f"{view.nbytes} (MPI_ERR_TRUNCATE)")
    view[:len(payload)] = payload


class Comm:
    """One rank's communicator (see the module doc); made by :func:`run` and by the
    collective constructors (``Dup``, ``Split``, ``Create_cart``, ...) of another."""

    in_process = True
    """Tells gqa_mpi's own code (statuses, operators, the host) it has no MPI behind it."""

    def __init__(self, world: _World, context: Hashable, ranks: Sequence[int], rank: int):
        self.world, self.context, self.ranks, self.rank = world, context, list(ranks), rank
        self.size = len(self.ranks)
        self.name = "in-process"
        self._made = itertools.count()
        self._collectives = itertools.count()

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

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
            self.world.put(self._box(dest, channel), _Message(self.rank, tag, payload))

    def _take(self, source: int, tag: int, channel: str = "p2p") -> Callable[[], Any]:
        box = self._box(self.rank, channel)
        return lambda: self.world.match(box, source, tag, take=True)

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        self._put(_bytes(buf), dest, tag)

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
        _into(buf, m.payload, "Recv")
        if status is not None:
            status.fill(m)

    def Irecv(self, buf, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG) -> Request:
        take = self._take(source, tag)

        def step() -> bool:
            m = take()
            if m is not None:
                _into(buf, m.payload, "Irecv")
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

    # ---- collectives: a channel of their own, each call a tag of its own
    def _next(self) -> int:
        return next(self._collectives)

    def _scatter_bytes(self, payloads: Sequence[Optional[bytes]], tag: int) -> None:
        for dest, payload in enumerate(payloads):
            if payload is not None:
                self._put(payload, dest, tag, "coll")

    def _gather_bytes(self, payload: bytes, root: int, tag: int) -> Optional[List[bytes]]:
        self._put(payload, root, tag, "coll")
        if self.rank != root:
            return None
        return [self.world.wait(self._take(r, tag, "coll")).payload for r in range(self.size)]

    def _all_bytes(self, payload: bytes) -> List[bytes]:
        tag = self._next()
        self._scatter_bytes([payload] * self.size, tag)
        return [self.world.wait(self._take(r, tag, "coll")).payload for r in range(self.size)]

    def gather(self, obj: Any, root: int = 0) -> Optional[List[Any]]:
        got = self._gather_bytes(pickle.dumps(obj), root, self._next())
        return None if got is None else [pickle.loads(b) for b in got]

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        tag = self._next()
        if self.rank == root:
            self._scatter_bytes([pickle.dumps(obj)] * self.size, tag)
        return pickle.loads(self.world.wait(self._take(root, tag, "coll")).payload)

    def allgather(self, obj: Any) -> List[Any]:
        return [pickle.loads(b) for b in self._all_bytes(pickle.dumps(obj))]

    def allreduce(self, obj: Any, op=None) -> Any:
        every = self.allgather(obj)
        if op is None or op is MPI.SUM:
            total = every[0]
            for x in every[1:]:
                total = total + x
            return total
        raise NotImplementedError("in-process allreduce takes SUM only")

    def Ibarrier(self) -> Request:
        key = (self.context, "barrier", self._next())
        with self.world.cond:
            self.world.arrived[key] += 1
            self.world.cond.notify_all()
        return Request(self.world, lambda: self.world.arrived[key] >= self.size)

    def Barrier(self) -> None:
        self.Ibarrier().Wait()

    def Allgather(self, sendbuf, recvbuf) -> None:
        _into(recvbuf, b"".join(self._all_bytes(_bytes(sendbuf))), "Allgather")

    def Reduce(self, sendbuf, recvbuf, op=None, root: int = 0) -> None:
        """In rank order, ``x0 op (x1 op (... op x_{n-1}))``, as MPI defines it."""
        mine = np.ascontiguousarray(sendbuf[0] if isinstance(sendbuf, (list, tuple))
                                    else sendbuf)
        got = self._gather_bytes(mine.tobytes(), root, self._next())
        if got is None:
            return
        parts = [np.frombuffer(b, mine.dtype).copy() for b in got]
        acc = parts[-1]
        for part in reversed(parts[:-1]):
            if isinstance(op, Op):
                op.fn(memoryview(part), memoryview(acc), None)
            elif op is None or op is MPI.SUM:
                acc = part + acc
                continue
            else:
                raise NotImplementedError("in-process Reduce takes SUM or a user operator")
        _into(recvbuf, acc.tobytes(), "Reduce")

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        got = self._gather_bytes(_bytes(sendbuf), root, self._next())
        if got is not None:
            _place(recvbuf, got)

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        data, (counts, displs) = sendbuf
        flat = np.ascontiguousarray(data).reshape(-1)
        tag = self._next()
        self._scatter_bytes([flat[a:a + n].tobytes() for n, a in zip(counts, displs)], tag)
        _place(recvbuf, [self.world.wait(self._take(r, tag, "coll")).payload
                         for r in range(self.size)])

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


def _place(recvbuf, payloads: List[bytes]) -> None:
    """Each rank's bytes at its displacement of ``[array, (counts, displs)]``."""
    if recvbuf is None:
        return
    data, (_, displs) = recvbuf
    flat = data.reshape(-1).view(np.uint8)
    unit = data.dtype.itemsize
    for payload, at in zip(payloads, displs):
        flat[at * unit:at * unit + len(payload)] = np.frombuffer(payload, np.uint8)


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


def owns(comm) -> bool:
    """Whether ``comm`` is one of this module's (no MPI behind it)."""
    return getattr(comm, "in_process", False)


def status_for(comm):
    """A status ``comm.Iprobe`` and ``comm.Recv`` fill in."""
    return Status() if owns(comm) else MPI.Status()


def user_op(comm, fn: Callable):
    """``fn(inbuf, inoutbuf, datatype)`` as a commutative reduction on ``comm``."""
    return Op(fn) if owns(comm) else MPI.Op.Create(fn, commute=True)


def run(size: int, fn: Callable[..., Any], *args) -> List[Any]:
    """``fn(comm, *args)`` on ``size`` threads, each rank of one in-process world;
    each rank's return value, in rank order.

    An exception on one rank ends the others (they see an abort at their next call)
    and is raised here (the lowest rank's, where several raised); an ``Abort`` raises
    :class:`Aborted` with its code. Ctrl-C aborts every rank with exit code 130.
    """
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"in_process takes a number of ranks >= 1, got {size!r}")
    world = _World(size)
    results: List[Any] = [None] * size
    errors: Dict[int, BaseException] = {}
    started = threading.Barrier(size + 1)

    def rank_main(rank: int) -> None:
        world.threads.add(threading.get_ident())
        started.wait()
        try:
            results[rank] = fn(Comm(world, "world", range(size), rank), *args)
        except Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            errors[rank] = e
            try:
                world.abort(1)
            except Aborted:
                pass
        finally:
            watchdog.forget()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True,
                                name=f"gqa_mpi rank {r}") for r in range(size)]
    for t in threads:
        t.start()
    started.wait()
    try:
        for t in threads:
            while t.is_alive() and world.aborted is None:
                t.join(0.1)
    except KeyboardInterrupt as e:         # Ctrl-C, or SIGTERM under main()
        signum = getattr(e, "signum", signal.SIGINT)
        sys.stderr.write(f"gqa_mpi: interrupted by {signal.Signals(signum).name}; "
                         f"every rank stops at its next message\n")
        world.abort(SIGNAL + signum)
    end = time.monotonic() + GRACE
    for t in threads:          # after an abort, a rank busy in Python is left behind
        t.join(max(0.0, end - time.monotonic()) if world.aborted is not None else None)
    if errors:
        raise errors[min(errors)]
    if world.aborted is not None:
        raise Aborted(world.aborted)
    return results


class _Terminated(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def main(size: int, fn: Callable[..., int], *args) -> int:
    """The command line on threads: ``fn(comm, *args)`` of each rank returns its exit
    code; rank 0's, or the abort's. SIGTERM stops the ranks as Ctrl-C does."""
    def terminate(signum, frame):
        raise _Terminated(signum)
    try:
        old = signal.signal(signal.SIGTERM, terminate)
    except ValueError:            # not the main thread: leave the signal alone
        old = None
    try:
        return run(size, fn, *args)[0]
    except Aborted as e:
        return e.code
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)

"""What the ranks of one in-process run share: their mailboxes, in which a message
waits for its receiver; the abort that ends every rank; and the requests and statuses
of messages. Nothing here knows communicators (:mod:`.comm`)."""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import numpy as np
from mpi4py import MPI


class Aborted(SystemExit):
    """A rank called ``Abort(code)``: every rank leaves with ``code``."""


class Message:
    __slots__ = ("source", "tag", "payload")

    def __init__(self, source: int, tag: int, payload: bytes):
        self.source, self.tag, self.payload = source, tag, payload


class World:
    """What the ranks of one in-process run share: the mailboxes and the abort."""

    def __init__(self):
        self.cond = threading.Condition()
        self.boxes: Dict[Tuple[Hashable, int], List[Message]] = defaultdict(list)
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

    def put(self, box: Tuple[Hashable, int], message: Message) -> None:
        with self.cond:
            self.check()
            self.boxes[box].append(message)
            self.cond.notify_all()

    def match(self, box, source: int, tag: int, take: bool) -> Optional[Message]:
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
    """The source and byte count of a probed or received message."""

    def __init__(self):
        self.source, self.count = MPI.ANY_SOURCE, 0

    def fill(self, m: Message) -> None:
        self.source, self.count = m.source, len(m.payload)

    def Get_source(self) -> int:
        return self.source

    def Get_count(self, datatype=None) -> int:
        """The message's size in bytes (gqa_mpi asks in ``MPI.BYTE`` only)."""
        return self.count


class Request:
    """A pending operation; ``step()`` tries to complete it and says whether it has."""

    def __init__(self, world: World, step: Callable[[], bool] = lambda: True):
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


def as_bytes(buf) -> bytes:
    """A message buffer's bytes: an array, a bytes-like, or ``[array, ...]``."""
    if isinstance(buf, (list, tuple)):
        buf = buf[0]
    return np.ascontiguousarray(buf).tobytes() if isinstance(buf, np.ndarray) else bytes(buf)


def copy_into(buf, payload: bytes, what: str) -> None:
    """Copy ``payload`` to the start of ``buf``; a message longer than it is MPI's
    truncation error."""
    if isinstance(buf, (list, tuple)):
        buf = buf[0]
    view = memoryview(buf).cast("B")
    if len(payload) > view.nbytes:
        raise RuntimeError(f"{what}: a message of {len(payload)} bytes into a buffer of "
                           f"{view.nbytes} (MPI_ERR_TRUNCATE)")
    view[:len(payload)] = payload

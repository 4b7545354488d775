"""The threads a rank process (a worker, an agent's session) runs requests on."""

from __future__ import annotations

import heapq
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_Task = tuple[Callable[[], None], "Callable[[], None] | None"]


class RequestThreads:
    """The threads that run requests, kept for the next ones.

    A request runs on the oldest idle thread, or on a new one when all are busy, so concurrent
    requests never wait for each other while requests one after another run on the same thread:
    the one that loaded the model. torch keeps a thread pool (an OpenMP team) per calling thread,
    and two teams competing for the cores make each call measurably slower.
    """

    def __init__(self, limit: int | None = None) -> None:
        self._idle: list[tuple[int, queue.SimpleQueue[_Task]]] = []  # a heap: oldest first
        self._count = 0
        self._limit = limit
        self._first: queue.SimpleQueue[_Task] | None = None
        self._lock = threading.Lock()

    def run(self, task: Callable[[], None], then: Callable[[], None] | None = None) -> None:
        """Run ``task``; ``then()`` once its thread is idle again. With a ``limit`` of one,
        tasks run one after another, in order, on one thread."""
        with self._lock:
            if self._limit == 1 and self._first is not None:
                inbox = self._first
            elif self._idle:
                _, inbox = heapq.heappop(self._idle)
            else:
                inbox = queue.SimpleQueue()
                self._first = self._first or inbox
                self._count += 1
                threading.Thread(
                    target=self._loop,
                    args=(self._count, inbox),
                    name=f"mizuoto-request-{self._count}",
                    daemon=True,
                ).start()
        inbox.put((task, then))

    def call(self, function: Callable[[], T]) -> T:
        """``function()`` on one of the threads, which is idle again when this returns."""
        outcome: list[T] = []
        failure: list[BaseException] = []
        done = threading.Event()

        def task() -> None:
            try:
                outcome.append(function())
            except BaseException as error:
                failure.append(error)

        self.run(task, done.set)
        done.wait()
        if failure:
            raise failure[0]
        return outcome[0]

    def _loop(self, number: int, inbox: queue.SimpleQueue[_Task]) -> None:
        while True:
            task, then = inbox.get()
            task()
            with self._lock:
                heapq.heappush(self._idle, (number, inbox))
            if then is not None:
                then()

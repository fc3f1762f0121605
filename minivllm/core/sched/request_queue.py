"""Mirror of vllm/v1/core/sched/request_queue.py: the WAITING queue under each policy.

FCFS is a deque: arrivals append, a preempted request is prepended so it goes
first on the next admission pass. PRIORITY is a heap on (priority, arrival):
a "prepend" simply re-enters the heap, where its old arrival time ranks it.
Left out: vLLM's abstract RequestQueue base class (two concrete queues share duck-typed methods instead),
and the SchedulingPolicy enum (the policy is the config's string).
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Iterator

from minivllm.request import Request


class FCFSRequestQueue:
    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._queue.append(request)

    def prepend_request(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek_request(self) -> Request:
        return self._queue[0]

    def pop_request(self) -> Request:
        return self._queue.popleft()

    def remove_requests(self, requests: set[Request]) -> None:
        self._queue = deque(r for r in self._queue if r not in requests)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityRequestQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = 0  # tie-breaker: equal (priority, arrival) keeps insertion order

    def add_request(self, request: Request) -> None:
        self._counter += 1
        heapq.heappush(self._heap, (request.priority, request.arrival_time, self._counter, request))

    prepend_request = add_request

    def peek_request(self) -> Request:
        return self._heap[0][-1]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def remove_requests(self, requests: set[Request]) -> None:
        self._heap = [item for item in self._heap if item[-1] not in requests]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (item[-1] for item in sorted(self._heap))


def create_request_queue(policy: str) -> FCFSRequestQueue | PriorityRequestQueue:
    return PriorityRequestQueue() if policy == "priority" else FCFSRequestQueue()

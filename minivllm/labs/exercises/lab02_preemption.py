"""Lab 2 (article part 2): preemption by recompute. Write Scheduler._preempt_request.

When RUNNING cannot get a block, schedule() pops a victim from the tail of RUNNING (LIFO) and preempts it:
its KV blocks go back to the pool, its progress is forgotten, and it goes FIRST in line in WAITING so it is
readmitted before newer requests (otherwise it starves). Time: about 30 minutes.
"""
from minivllm.request import RequestStatus


def _preempt_request(self, request) -> None:
    """Preempt `request` by recompute, so that the requests still running get its KV blocks.

    Inputs: self, the Scheduler (self.kv_cache_manager, self.waiting, self.requests, self.num_preemptions);
    request, a RUNNING request that schedule() has already taken out of self.running.
    After the call (what the grader checks):
      - the request holds no block; each of its blocks lost the one reference the request held, so a block it
        shares with another request (a prefix-cache hit) stays held by that request;
      - its own blocks are back in the pool's free queue, the end of its sequence before its beginning (the
        free queue is the eviction order), and its full blocks stay in the prefix cache;
      - request.status is RequestStatus.PREEMPTED and none of its tokens counts as computed;
      - request.num_preemptions and self.num_preemptions are each one higher;
      - it is still in self.requests, and it is the next request WAITING admits, ahead of older waiters.
    Example (block_size 4): A holds blocks [1, 2, 3, 4], B holds [1, 2, 8, 9], the free queue is [10, 11] and
    D waits. After preempting B: blocks 1 and 2 have ref_cnt 1 (A's), the free queue is [10, 11, 9, 8],
    WAITING is [B, D], B.num_computed_tokens == 0, and a lookup of B's prompt still hits 12 tokens.
    """
    ### BEGIN SOLUTION
    self.kv_cache_manager.free(request)
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.num_preemptions += 1
    self.num_preemptions += 1
    self.waiting.prepend_request(request)
    ### END SOLUTION

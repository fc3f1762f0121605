"""Lab 2 (article part 2): preemption by recompute. Write Scheduler._preempt_request.

When RUNNING cannot get a block, schedule() pops a victim from the tail of RUNNING (LIFO) and preempts it:
its KV blocks go back to the pool, its progress is forgotten, and it goes FIRST in line in WAITING so it is
readmitted before newer requests (otherwise it starves). Time: about 30 minutes.
"""
from minivllm.request import RequestStatus


def _preempt_request(self, request) -> None:
    """Preempt `request` (already removed from self.running): free its blocks via self.kv_cache_manager,
    set status PREEMPTED, num_computed_tokens = 0, count it (request.num_preemptions, self.num_preemptions),
    and put it at the head of self.waiting (self.waiting.prepend_request).
    """
    ### BEGIN SOLUTION
    self.kv_cache_manager.free(request)
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.num_preemptions += 1
    self.num_preemptions += 1
    self.waiting.prepend_request(request)
    ### END SOLUTION

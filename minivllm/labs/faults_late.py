"""The broken functions of labs 12, 13 and 14 (the prefix-cache lookup, stop strings, the row-parallel layer):
each a mistake students make. faults.py names them and says which lab catches each.

As in faults_spec.py, each lab's faults share one helper: the lab's reference rewritten with a switch per mistake,
every switch off giving the reference itself (tests/test_labs_drift.py checks that).
"""
from __future__ import annotations

from minivllm.distributed.communication_op import tensor_model_parallel_all_reduce
from minivllm.models.linear import default_weight_loader


# -- lab 12 -----------------------------------------------------------------------------------------------
def lookup(self, request, *, holes=False, capped=True, cap_tokens=False, skip=True, touch=False, per_block=True,
           fresh_only=False):
    if not self.enable_caching or (skip and request.skip_reading_prefix_cache):
        return [], 0
    if fresh_only and request.num_output_tokens > 0:
        return [], 0
    max_num_blocks = (request.num_tokens - (1 if capped and not cap_tokens else 0)) // self.block_size
    blocks = []
    for block_hash in request.block_hashes[:max_num_blocks]:
        block = self.block_pool.get_cached_block(block_hash)
        if block is None:
            if holes:
                continue
            break
        blocks.append(block)
    if touch:
        self.block_pool.touch(blocks)
    tokens = len(blocks) * self.block_size if per_block else len(blocks)
    return blocks, min(tokens, request.num_tokens - 1) if cap_tokens else tokens


def prefix_skips_holes(self, request):
    """Goes on past a miss: blocks after an evicted one are counted as if the prefix were whole."""
    return lookup(self, request, holes=True)


def prefix_no_cap(self, request):
    """No num_tokens - 1 cap: a prompt cached whole hits every block and its last token never runs."""
    return lookup(self, request, capped=False)


def prefix_caps_tokens(self, request):
    """Caps the tokens at num_tokens - 1 instead of the blocks: the last block counted, minus one token."""
    return lookup(self, request, cap_tokens=True)


def prefix_reads_for_logprobs(self, request):
    """Ignores skip_reading_prefix_cache: a request asking for prompt logprobs reads the cache."""
    return lookup(self, request, skip=False)


def prefix_touches(self, request):
    """Touches the hits during the lookup: allocate_slots touches them again, each counted twice (a leak)."""
    return lookup(self, request, touch=True)


def prefix_not_after_preemption(self, request):
    """Looks up only requests that have no output yet: a preempted request recomputes blocks still cached."""
    return lookup(self, request, fresh_only=True)


def prefix_counts_blocks(self, request):
    """Returns the number of blocks as num_computed_tokens, not blocks * block_size."""
    return lookup(self, request, per_block=False)


# -- lab 13 -----------------------------------------------------------------------------------------------
def stop_strings(state, delta, *, window=True, old_text=False, keep=None, earliest=False, cut=True, last=False,
                 clamp=True):
    if not delta or not state.params.stop:
        return None
    detok, found = state.detokenizer, []
    for stop in state.params.stop:
        start = len(detok.output_text) - len(delta) - (len(stop) - 1 if window else 0)
        start = 0 if old_text else max(0, start) if clamp else start
        index = detok.output_text.rfind(stop, start) if last else detok.output_text.find(stop, start)
        if index != -1:
            found.append((index, stop))
            if not earliest:
                break
    if not found:
        return None
    index, stop = min(found) if earliest else found[0]
    kept = state.params.include_stop_str_in_output if keep is None else keep
    if cut:
        detok.output_text = detok.output_text[:index + len(stop) if kept else index]
    return stop


def _stop_fault(**switches):
    """A fault for the staticmethod target: the harness patches it in as a staticmethod; minivllm.labs.inject
    patches the plain function, which is then called bound (self first), so it reads its last two arguments."""
    def fault(*args):
        state, delta = args[-2:]
        return stop_strings(state, delta, **switches)
    return fault


stop_new_chars_only = _stop_fault(window=False)  # only the new characters: a straddling stop string missed
stop_whole_text = _stop_fault(old_text=True)  # the whole text: an old match counts
stop_never_kept = _stop_fault(keep=False)  # include_stop_str_in_output ignored
stop_earliest_in_text = _stop_fault(earliest=True)  # the earliest match in the text, not the first in the list
stop_not_cut = _stop_fault(cut=False)  # found, but the text not cut
stop_last_occurrence = _stop_fault(last=True)  # the last occurrence in the window
stop_unclamped = _stop_fault(clamp=False)  # a negative window start: str.find counts it from the end


# -- lab 14 -----------------------------------------------------------------------------------------------
def row_loader(self, param, loaded_weight, shard_id=None, *, dim=1, reverse=False):
    if param.dim() == 1:
        return default_weight_loader(param, loaded_weight)
    size = param.shape[1]
    rank = self.tp_size - 1 - self.tp_rank if reverse else self.tp_rank
    part = loaded_weight.narrow(dim, rank * size, size)
    default_weight_loader(param, part if dim == 1 else part.t())


def row_forward(self, x, *, reduce=True, reduce_first=False, per_token=False):
    if reduce_first and self.reduce_results and self.tp_size > 1:
        x = tensor_model_parallel_all_reduce(x)
    output = self.matmul(x)
    if per_token and self.reduce_results and self.tp_size > 1:
        for t in range(output.shape[0]):
            output[t:t + 1] = tensor_model_parallel_all_reduce(output[t:t + 1].clone())
        return output, None
    if reduce and not reduce_first and self.reduce_results and self.tp_size > 1:
        output = tensor_model_parallel_all_reduce(output)
    return output, None


def row_reduce_per_token(self, x):
    """All-reduces the output one token row at a time: the right sum, num_tokens collectives instead of one."""
    return row_forward(self, x, per_token=True)


def row_bias_every_rank(self):
    """Every rank adds the bias before the sum: it counts tp_size times."""
    return self.bias


def row_shard_wrong_dim(self, param, loaded_weight, shard_id=None):
    """Cuts the rows (dim 0) and transposes them to fit: a square weight loads without error, the wrong numbers."""
    return row_loader(self, param, loaded_weight, shard_id, dim=0)


def row_shard_reversed(self, param, loaded_weight, shard_id=None):
    """Counts the shards from the end: rank 0 gets the last slice of the columns, not the first."""
    return row_loader(self, param, loaded_weight, shard_id, reverse=True)


def row_no_all_reduce(self, x):
    """Returns the rank's partial sum: no all-reduce."""
    return row_forward(self, x, reduce=False)


def row_reduce_before_matmul(self, x):
    """All-reduces the input slices before the product instead of the partial outputs after it."""
    return row_forward(self, x, reduce_first=True)

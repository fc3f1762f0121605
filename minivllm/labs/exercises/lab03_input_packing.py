"""Lab 3 (article part 3): input packing. Write the index arithmetic of GPUModelRunner._prepare_inputs.

One step's scheduled tokens, from every request, go on one dimension: request i contributes num_scheduled[i]
consecutive rows. Each row needs its position (where the token sits in its request), its KV slot (block of
that position in the request's block_table row, times block_size, plus the offset in the block), and only the
rows that sample go through lm_head. Plain numpy. Time: about 30 minutes.
"""
import numpy as np


def pack_indices(num_scheduled, num_computed, block_table, num_tokens, block_size):
    """Return (query_start_loc, req_indices, positions, slot_mapping, sampling, logits_indices), int64 arrays.

    Inputs: int64 numpy arrays [num_reqs] num_scheduled (rows request i gets this step, >= 1), num_computed
    (its tokens whose KV is already cached) and num_tokens (its tokens known so far: prompt + outputs);
    block_table, int64 [num_reqs, max_blocks], row i the physical blocks of request i in logical order;
    block_size, an int.
    Output, with T = sum(num_scheduled) packed rows:
      - query_start_loc [num_reqs + 1]: 0, then the running sum of num_scheduled (request i owns rows
        query_start_loc[i] .. query_start_loc[i + 1] - 1);
      - req_indices [T]: the request of each row; positions [T]: num_computed[i], num_computed[i] + 1, ... for
        request i's rows;
      - slot_mapping [T]: block_table[i, pos // block_size] * block_size + pos % block_size;
      - sampling: the indices i (ascending) with num_computed[i] + num_scheduled[i] >= num_tokens[i];
      - logits_indices [len(sampling)]: each sampling request's last row, query_start_loc[i + 1] - 1.
    Invariants: every array depends on block_size (never a constant 4 or 16); a prefill chunk that stops short
    of num_tokens does not sample, so lm_head runs on one row per sampling request only; the inputs are not
    changed.
    Example (block_size 4): num_scheduled [1, 3], num_computed [5, 4], num_tokens [6, 10], block_table
    [[2, 7, 0], [5, 1, 3]] (request 0 decodes its 6th token, request 1 runs a chunk of a 10-token prompt) ->
    query_start_loc [0, 1, 4], req_indices [0, 1, 1, 1], positions [5, 4, 5, 6], slot_mapping [29, 4, 5, 6]
    (7 * 4 + 1, then block 1 at offsets 0, 1, 2), sampling [0], logits_indices [0].
    """
    ### BEGIN SOLUTION
    query_start_loc = np.concatenate(([0], np.cumsum(num_scheduled)))
    req_indices = np.repeat(np.arange(len(num_scheduled)), num_scheduled)
    offsets = np.arange(int(query_start_loc[-1])) - query_start_loc[:-1][req_indices]
    positions = num_computed[req_indices] + offsets
    block_numbers = block_table[req_indices, positions // block_size]
    slot_mapping = block_numbers.astype(np.int64) * block_size + positions % block_size
    sampling = np.nonzero(num_computed + num_scheduled >= num_tokens)[0]
    logits_indices = query_start_loc[1:][sampling] - 1
    return query_start_loc, req_indices, positions, slot_mapping, sampling, logits_indices
    ### END SOLUTION

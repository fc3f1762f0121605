"""Lab 3 (article part 3): input packing. Write the index arithmetic of GPUModelRunner._prepare_inputs.

One step's scheduled tokens, from every request, go on one dimension: request i contributes num_scheduled[i]
consecutive rows. Each row needs its position (where the token sits in its request), its KV slot (block of
that position in the request's block_table row, times block_size, plus the offset in the block), and only the
rows that sample go through lm_head. Plain numpy. Time: about 30 minutes.
"""
import numpy as np


def pack_indices(num_scheduled, num_computed, block_table, num_tokens, block_size):
    """Return (query_start_loc, req_indices, positions, slot_mapping, sampling, logits_indices), int64 arrays.

    Inputs: int64 arrays [num_reqs] num_scheduled, num_computed, num_tokens (tokens known so far) and block_table
    [num_reqs, max_blocks]. query_start_loc: [num_reqs + 1]; req_indices (the request of each packed row),
    positions, slot_mapping: [num_tokens]; sampling: the requests whose step reaches their last known token;
    logits_indices: for each sampling request, the packed row whose logits give its next token.
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

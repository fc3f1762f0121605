"""Mirrors vllm/attention/ops/triton_unified_attention.py.

One Triton kernel computing paged attention for a batch that mixes prefill
chunks and single-token decodes. Leaves out sliding windows, softcapping,
ALiBi, sinks, fp8 scales, qq-bias, the split-KV ("3D") decode variant and
the flattened q-block grid with binary search over cu_seqlens_q.
"""

import torch
import triton
import triton.language as tl

from minivllm.kernels import next_power_of_2


# Design note
#   One program computes BLOCK_Q consecutive query tokens of one sequence for
#   all QPK (= num_q_heads / num_kv_heads) query heads that share one kv head:
#   a [BLOCK_M, HEAD_SIZE_PAD] tile with row r -> (token r // QPK, head r % QPK),
#   so each K/V block loaded is reused by the whole GQA group.
#   Grid: (num_seqs, num_kv_heads, cdiv(max_seqlen_q, BLOCK_Q)); programs whose
#   q tile starts past the sequence's q_len return at once (decode rows too).
#   The program walks the sequence's logical KV blocks 0..n-1 (n stops at the
#   last position any of its queries can see) and reads
#   block_table[seq, logical] to get each physical block, then does an online
#   softmax (running max m, running sum l, fp32 accumulator).
@triton.jit
def kernel_unified_attention_2d(
    q_ptr,  # [num_tokens, num_q_heads, head_size]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_size]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_size]
    out_ptr,  # [num_tokens, num_q_heads, head_size]
    cu_seqlens_q_ptr,  # [num_seqs + 1] int32
    seqused_k_ptr,  # [num_seqs] int32
    block_table_ptr,  # [num_seqs, max_num_blocks_per_seq] int32
    softmax_scale,
    q_stride_tok, q_stride_head,
    o_stride_tok, o_stride_head,
    k_stride_blk, k_stride_slot, k_stride_head,
    v_stride_blk, v_stride_slot, v_stride_head,
    bt_stride_seq,
    head_size,
    QPK: tl.constexpr,  # query heads per kv head
    BLOCK_SIZE: tl.constexpr,  # kv cache block size (power of two)
    HEAD_SIZE_PAD: tl.constexpr,  # next_power_of_2(head_size)
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_M: tl.constexpr,  # rows per program (>= BLOCK_Q * QPK)
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no tf32), else None
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_tile = tl.program_id(2)

    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:  # nothing to do (includes q_len == 0)
        return
    seq_len = tl.load(seqused_k_ptr + seq)
    context_len = seq_len - q_len  # keys cached before this step

    rows = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    q_local = q_tile * BLOCK_Q + rows // QPK  # [BLOCK_M] index within this seq's queries
    head = kv_head * QPK + rows % QPK  # [BLOCK_M] query head
    row_valid = (rows // QPK < BLOCK_Q) & (q_local < q_len)  # [BLOCK_M]
    q_pos = context_len + q_local  # [BLOCK_M] absolute position
    d = tl.arange(0, HEAD_SIZE_PAD)  # [HEAD_SIZE_PAD]
    d_valid = d < head_size

    tok = (q_start + q_local).to(tl.int64)  # [BLOCK_M]
    q_off = tok[:, None] * q_stride_tok + head[:, None] * q_stride_head + d[None, :]
    q_mask = row_valid[:, None] & d_valid[None, :]  # [BLOCK_M, HEAD_SIZE_PAD]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)  # [BLOCK_M, HEAD_SIZE_PAD]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp
    acc = tl.zeros([BLOCK_M, HEAD_SIZE_PAD], tl.float32)

    # Last key position any row of this tile may look at.
    if CAUSAL:
        last_q = tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_len) - 1
        kv_end = tl.minimum(context_len + last_q + 1, seq_len)
    else:
        kv_end = seq_len
    num_kv_blocks = tl.cdiv(kv_end, BLOCK_SIZE)

    slot = tl.arange(0, BLOCK_SIZE)  # [BLOCK_SIZE]
    bt_row = block_table_ptr + seq.to(tl.int64) * bt_stride_seq
    for j in range(0, num_kv_blocks):
        physical = tl.load(bt_row + j).to(tl.int64)  # int64 before * strides
        k_pos = j * BLOCK_SIZE + slot  # [BLOCK_SIZE] absolute key position
        k_valid = k_pos < seq_len
        kv_mask = k_valid[:, None] & d_valid[None, :]  # [BLOCK_SIZE, HEAD_SIZE_PAD]
        k_off = (physical * k_stride_blk + kv_head * k_stride_head
                 + slot[:, None] * k_stride_slot + d[None, :])
        v_off = (physical * v_stride_blk + kv_head * v_stride_head
                 + slot[:, None] * v_stride_slot + d[None, :])
        k = tl.load(k_cache_ptr + k_off, mask=kv_mask, other=0.0)  # [BLOCK_SIZE, HEAD_SIZE_PAD]
        v = tl.load(v_cache_ptr + v_off, mask=kv_mask, other=0.0)  # [BLOCK_SIZE, HEAD_SIZE_PAD]

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_SIZE]
        s = s * softmax_scale
        visible = row_valid[:, None] & k_valid[None, :]  # [BLOCK_M, BLOCK_SIZE]
        if CAUSAL:
            visible = visible & (k_pos[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # [BLOCK_M]
        # Rows with nothing visible yet keep m = -inf; use 0 to avoid inf - inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])  # [BLOCK_M, BLOCK_SIZE]
        alpha = tl.exp(m_i - m_safe)  # [BLOCK_M] rescale of the old state
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]  # [BLOCK_M, HEAD_SIZE_PAD]
    o_off = tok[:, None] * o_stride_tok + head[:, None] * o_stride_head + d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def unified_attention(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_size]
    k: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    v: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    out: torch.Tensor,  # [num_tokens, num_q_heads, head_size], written in place
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    max_seqlen_q: int,
    seqused_k: torch.Tensor,  # [num_seqs] int32
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    block_table: torch.Tensor,  # [num_seqs, max_num_blocks_per_seq] int32
) -> None:
    """Launch the paged attention kernel (see the design note above)."""
    num_tokens, num_q_heads, head_size = q.shape
    num_blocks, block_size, num_kv_heads, k_head_size = k.shape
    assert k_head_size == head_size and v.shape == k.shape, (q.shape, k.shape, v.shape)
    assert out.shape == q.shape, (out.shape, q.shape)
    assert num_q_heads % num_kv_heads == 0, (num_q_heads, num_kv_heads)
    assert block_size >= 16 and block_size & (block_size - 1) == 0, block_size
    for t in (q, k, v, out):
        assert t.stride(-1) == 1, "head_size dim must be contiguous"
    assert block_table.stride(-1) == 1
    num_seqs = seqused_k.shape[0]
    if num_seqs == 0 or num_tokens == 0 or max_seqlen_q <= 0:
        return

    qpk = num_q_heads // num_kv_heads
    block_m = 16 if qpk <= 16 else next_power_of_2(qpk)  # >= 16 rows for tl.dot
    block_q = block_m // qpk
    grid = (num_seqs, num_kv_heads, triton.cdiv(max_seqlen_q, block_q))
    kernel_unified_attention_2d[grid](
        q, k, v, out, cu_seqlens_q, seqused_k, block_table,
        float(softmax_scale),
        q.stride(0), q.stride(1),
        out.stride(0), out.stride(1),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        block_table.stride(0),
        head_size,
        QPK=qpk,
        BLOCK_SIZE=block_size,
        HEAD_SIZE_PAD=max(16, next_power_of_2(head_size)),
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        CAUSAL=bool(causal),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
    )

/* Mirror of vLLM's csrc/cpu/cpu_attn.cpp (the CPU attention backend's kernel): paged attention for
 * every query token of a step in one call, the read path.
 *
 * Design: one work item = (query token, KV head, a group of up to 4 of the query heads that share
 * that KV head). A token at position pos sees the first kv_len = pos + 1 positions of its request's
 * history, this step's own K/V included (they were written to the cache just before). Each of those
 * K and V rows is read once per item, straight from the paged cache, in three passes over the
 * request's block_table: scores q.k (position p lives in physical block block_table[p / block_size],
 * row p % block_size), then the softmax, then the p-weighted sum of V. Decodes and prefill chunks
 * take the same path, as in vLLM's unified attention; nothing is copied out of the cache first,
 * which is what the PyTorch path pays for. With AVX-512 and head_size a multiple of 16 the group's
 * queries and outputs stay in registers; otherwise a plain loop nest computes the same thing.
 *
 *   query/out  [num_tokens, num_heads, head_size] rows q_stride / out_stride apart
 *   key_cache, value_cache  [num_blocks, block_size, num_kv_heads, head_size], contiguous
 *   token_index[i]  the packed row of query i;  req_index[i]  its row in block_table;  kv_lens[i]  keys it sees
 *
 * The scalar path (attend_generic) comes first; the AVX-512 one computes the same sums in registers.
 * Left out: vLLM's AMX/NEON/VSX paths, sliding windows, ALiBi, soft-capping, sinks, fp8 caches.
 */
#include "cpu_types.h"
#include "ops.h"

#define GROUP 4

typedef struct {
    const void *key_cache, *value_cache;
    const int32_t *blocks;  /* this request's block_table row */
    int64_t seq_len, block_size, row, head_offset, head_size;
} History;

/* Element offset, within either cache, of position p's row for this item's KV head. */
AI int64_t history_row(const History *h, int64_t p) {
    int64_t slot = (int64_t)h->blocks[p / h->block_size] * h->block_size + p % h->block_size;
    return slot * h->row + h->head_offset;
}

/* Each head's scores become exp(score - max) in place; inv[g] gets 1 / their sum. */
static void softmax_rows(float *scores, const float *maxs, float *inv, int heads, int64_t seq_len) {
    for (int g = 0; g < heads; g++) {
        float *sg = scores + g * seq_len, m = maxs[g], total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t p = 0; p < seq_len; p++) {
            sg[p] = exp_f32(sg[p] - m);
            total += sg[p];
        }
        inv[g] = 1.0f / total;
    }
}

AI void attend_generic(void *out, int64_t out_head_stride, const void *q, const History *h, int heads,
                       float scale, float *scores, float *acc, int bf) {
    int64_t hs = h->head_size;
    float maxs[GROUP], inv[GROUP];
    for (int g = 0; g < heads; g++) maxs[g] = -INFINITY;
    for (int64_t p = 0; p < h->seq_len; p++) {
        int64_t kr = history_row(h, p);
        for (int g = 0; g < heads; g++) {
            float dot = 0.0f;
            for (int64_t d = 0; d < hs; d++) dot = fmaf(load(q, g * hs + d, bf), load(h->key_cache, kr + d, bf), dot);
            scores[g * h->seq_len + p] = dot * scale;
            maxs[g] = fmaxf(maxs[g], dot * scale);
        }
    }
    softmax_rows(scores, maxs, inv, heads, h->seq_len);
    memset(acc, 0, sizeof(float) * heads * hs);
    for (int64_t p = 0; p < h->seq_len; p++) {
        int64_t vr = history_row(h, p);
        for (int g = 0; g < heads; g++)
            for (int64_t d = 0; d < hs; d++)
                acc[g * hs + d] = fmaf(scores[g * h->seq_len + p], load(h->value_cache, vr + d, bf), acc[g * hs + d]);
    }
    for (int g = 0; g < heads; g++)
        for (int64_t d = 0; d < hs; d++) store(out, g * out_head_stride + d, acc[g * hs + d] * inv[g], bf);
}

#ifdef __AVX512F__
#define MAX_VECS 16 /* head_size <= 256 */

/* The same computation with head_size = 16 * nv; nv, heads and bf are constants after inlining. */
AI void attend_avx512(void *out, int64_t out_head_stride, const void *q, const History *h, int heads, int nv,
                      float scale, float *scores, int bf) {
    __m512 qv[GROUP][MAX_VECS], acc[GROUP][MAX_VECS];
    float maxs[GROUP], inv[GROUP];
    for (int g = 0; g < heads; g++) {
        maxs[g] = -INFINITY;
        for (int j = 0; j < nv; j++) qv[g][j] = _mm512_mul_ps(load16(q, g * 16 * nv + 16 * j, bf), _mm512_set1_ps(scale));
    }
    for (int64_t p = 0; p < h->seq_len; p++) {  /* pass 1: scores (the scale is folded into q) */
        int64_t kr = history_row(h, p);
        __m512 kv[MAX_VECS];
        for (int j = 0; j < nv; j++) kv[j] = load16(h->key_cache, kr + 16 * j, bf);
        for (int g = 0; g < heads; g++) {
            __m512 dot = _mm512_mul_ps(qv[g][0], kv[0]);
            for (int j = 1; j < nv; j++) dot = _mm512_fmadd_ps(qv[g][j], kv[j], dot);
            float sc = _mm512_reduce_add_ps(dot);
            scores[g * h->seq_len + p] = sc;
            maxs[g] = sc > maxs[g] ? sc : maxs[g];
        }
    }
    softmax_rows(scores, maxs, inv, heads, h->seq_len);  /* pass 2 */
    for (int g = 0; g < heads; g++)
        for (int j = 0; j < nv; j++) acc[g][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < h->seq_len; p++) {  /* pass 3: weighted sum of V */
        int64_t vr = history_row(h, p);
        __m512 vv[MAX_VECS];
        for (int j = 0; j < nv; j++) vv[j] = load16(h->value_cache, vr + 16 * j, bf);
        for (int g = 0; g < heads; g++) {
            __m512 w = _mm512_set1_ps(scores[g * h->seq_len + p]);
            for (int j = 0; j < nv; j++) acc[g][j] = _mm512_fmadd_ps(w, vv[j], acc[g][j]);
        }
    }
    for (int g = 0; g < heads; g++)
        for (int j = 0; j < nv; j++)
            store16(out, g * out_head_stride + 16 * j, _mm512_mul_ps(acc[g][j], _mm512_set1_ps(inv[g])), bf);
}

/* One work item on the AVX-512 path: constant shapes for the common head sizes (64 and 128). */
AI void attend_item_avx512(void *o, int64_t head_size, const void *q, const History *h, int heads, float scale,
                           float *scores, int bf) {
    int nv = (int)(head_size / 16);
#define CASE(H, NV) case (H - 1) * MAX_VECS + NV - 1: attend_avx512(o, head_size, q, h, H, NV, scale, scores, bf); break;
    switch ((heads - 1) * MAX_VECS + nv - 1) {
        CASE(1, 4) CASE(2, 4) CASE(3, 4) CASE(4, 4) CASE(1, 8) CASE(2, 8) CASE(3, 8) CASE(4, 8)
        default: attend_avx512(o, head_size, q, h, heads, nv, scale, scores, bf);
    }
#undef CASE
}
#endif

void paged_attention(void *out, const void *query, const void *key_cache, const void *value_cache,
                     const int32_t *block_table, const int64_t *token_index, const int64_t *req_index,
                     const int32_t *kv_lens, int64_t num_queries, int64_t num_heads, int64_t num_kv_heads,
                     int64_t head_size, int64_t block_size, int64_t block_table_stride, int64_t q_stride,
                     int64_t out_stride, int64_t max_kv_len, float scale, int dtype) {
    int64_t qpk = num_heads / num_kv_heads, groups = (qpk + GROUP - 1) / GROUP;
    int bf = dtype == DTYPE_BF16;
    int64_t es = elem_size(bf);
#pragma omp parallel
    {
        float *scores = malloc(sizeof(float) * GROUP * (max_kv_len > 0 ? max_kv_len : 1));
        float *acc = malloc(sizeof(float) * GROUP * head_size);
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_queries * num_kv_heads * groups; item++) {
            int64_t i = item / (num_kv_heads * groups), kvh = item / groups % num_kv_heads;
            int64_t first = item % groups * GROUP;  /* first query head of this group, within the KV head's */
            int heads = (int)(qpk - first < GROUP ? qpk - first : GROUP);
            History h = {key_cache, value_cache, block_table + req_index[i] * block_table_stride,
                         kv_lens[i], block_size, num_kv_heads * head_size, kvh * head_size, head_size};
            int64_t head = kvh * qpk + first;
            const char *q = (const char *)query + (token_index[i] * q_stride + head * head_size) * es;
            char *o = (char *)out + (token_index[i] * out_stride + head * head_size) * es;
#ifdef __AVX512F__
            if (head_size % 16 == 0 && head_size <= 16 * MAX_VECS) {
                if (bf) attend_item_avx512(o, head_size, q, &h, heads, scale, scores, 1);
                else attend_item_avx512(o, head_size, q, &h, heads, scale, scores, 0);
                continue;
            }
#endif
            if (bf) attend_generic(o, head_size, q, &h, heads, scale, scores, acc, 1);
            else attend_generic(o, head_size, q, &h, heads, scale, scores, acc, 0);
        }
        free(scores);
        free(acc);
    }
}


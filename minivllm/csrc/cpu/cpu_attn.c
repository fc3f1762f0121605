/* Mirror of vLLM's csrc/cpu/cpu_attn.cpp (the CPU attention backend's kernel): paged attention for
 * every query token of a step in one call, the read path. This file is the reading: how a request's history is
 * found in the paged cache, the plain-C reference of both paths, and the entry point that hands out the work.
 * The vector versions of the same paths are one file per instruction set: cpu_attn_avx512.c (float32 FMAs) and
 * cpu_attn_avx512_bf16.c (bf16 dot products); cpu_attn_impl.h holds what they share.
 *
 * The step comes per request, as vLLM's unified attention takes it: request r's query rows are the packed
 * rows query_start_loc[r] .. query_start_loc[r + 1] - 1, the last q_len of its seq_lens[r] positions, so
 * row j sits at position pos = seq_lens[r] - q_len + j and sees keys 0 .. pos (this step's own K/V were
 * written to the cache just before). K/V are read in place: position p lives in physical block
 * block_table[r][p / block_size], row p % block_size. A decode is a request with q_len 1; a prefill chunk
 * has q_len > 1, and, chunked, its first row sits past position 0.
 *
 * Work items are (request, tile of up to TILE_ROWS / heads-per-KV-head of its query tokens, KV head),
 * handed out by OpenMP, each request's latest tiles first (they see the most history). An item serves
 * every query head that shares its KV head, one of two ways:
 *
 *  - Tiles (flash attention's order; every request with q_len > 1). The item's rows are its (token,
 *    query head) pairs: 96 for SmolLM2, 32 tokens x 3 heads. It walks keys 0 .. (its last position)
 *    TILE_KV at a time, computes the rows x TILE_KV scores, masks each row causally, updates an online
 *    softmax (per row a running max m and sum l; when m grows, what was accumulated so far is scaled by
 *    exp(m_old - m_new)) and adds P.V into float32 accumulators, divided by l once at the end. The vector
 *    paths pack each K/V tile once, so a K/V row is read once per item instead of once per query row.
 *  - Rows (decodes): one query token, three passes over the history (scores, softmax, P.V). With one query
 *    row there is nothing to share a packed tile with. With at least two decodes per thread (and AVX-512) a
 *    decode is one item for all its heads, the block's rows (every KV head) read together; with fewer, an
 *    item per KV head spreads a request over the threads.
 *
 * Which arithmetic runs is the build's (-march=native; the library is built per CPU): bf16 with AVX512_BF16
 * runs dot products on bf16 pairs; float32, or bf16 without AVX512_BF16, runs AVX-512 float32 FMAs; without
 * AVX-512, or for a head_size the vector paths do not take (tiles: a multiple of 16; rows: a multiple of 16 up
 * to 256), the plain-C loops below compute the same.
 *
 *   query/out  [num_tokens, num_heads, head_size] rows q_stride / out_stride apart (elements)
 *   key_cache, value_cache  [num_blocks, block_size, num_kv_heads, head_size], contiguous
 *   block_table  [num_reqs, >= blocks of the longest], rows block_table_stride apart
 *   query_start_loc [num_reqs + 1], seq_lens [num_reqs]  int32
 *
 * Left out: vLLM's AMX/NEON/VSX paths, sliding windows, ALiBi, soft-capping, sinks, fp8 caches.
 */
#include "cpu_attn_impl.h"
#include "ops.h"

#include <omp.h>

/* ---- the history ------------------------------------------------------------------------------------------- */

/* Element offset, within either cache, of position p's row for this item's KV head. */
ALWAYS_INLINE int64_t history_row(const History *h, int64_t p) {
    int64_t slot = (int64_t)h->blocks[p / h->block_size] * h->block_size + p % h->block_size;
    return slot * h->row + h->head_offset;
}

/* ---- the row path, plain C ---------------------------------------------------------------------------------- */

/* Each head's scores become exp(score - max) in place; inv[g] gets 1 / their sum. */
INTERNAL void softmax_rows(float *scores, const float *maxs, float *inv, int heads, int64_t seq_len) {
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

ALWAYS_INLINE void attend_generic(void *out, int64_t out_head_stride, const void *q, const History *h, int heads,
                                  float scale, float *scores, float *acc, int bf) {
    int64_t hs = h->head_size;
    float maxs[HEAD_GROUP], inv[HEAD_GROUP];
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

/* ---- the tile path, plain C ---------------------------------------------------------------------------------- */

/* Online softmax over one KV tile, row by row: row r sees the tile's first n[r] positions. Its scores
 * (scaled dot products) become probabilities relative to the new running max, zero past n[r];
 * alpha[r] = exp(m_old - m_new) is what the accumulated P.V and sum must be scaled by. A row that sees
 * nothing of this tile keeps everything (alpha 1, probabilities 0). */
static void online_softmax(float *s, float *m, float *l, float *alpha, const int *n, int rows) {
    for (int r = 0; r < rows; r++) {
        float *sr = s + r * TILE_KV, mx = m[r], total = 0.0f;
        int nr = n[r];
        if (nr == 0) {
            alpha[r] = 1.0f;
            memset(sr, 0, sizeof(float) * TILE_KV);
            continue;
        }
#pragma omp simd reduction(max : mx)
        for (int c = 0; c < nr; c++) mx = sr[c] > mx ? sr[c] : mx;
#pragma omp simd reduction(+ : total)
        for (int c = 0; c < TILE_KV; c++) {
            float e = c < nr ? exp_f32(sr[c] - mx) : 0.0f;
            sr[c] = e;
            total += e;
        }
        alpha[r] = m[r] == -INFINITY ? 0.0f : exp_f32(m[r] - mx);
        l[r] = l[r] * alpha[r] + total;
        m[r] = mx;
    }
}

/* Scores of the rows that see this tile, one scaled dot product each, K read in place. */
ALWAYS_INLINE void scores_generic(float *s, const int *n, int rows, const char *const *q, const History *h,
                                  const int64_t *off, float scale, int bf) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < n[r]; c++) {
            float dot = 0.0f;
            for (int64_t d = 0; d < h->head_size; d++)
                dot = fmaf(load(q[r], d, bf), load(h->key_cache, off[c] + d, bf), dot);
            s[r * TILE_KV + c] = dot * scale;
        }
}

/* o[r] = o[r] * alpha[r] + sum_c p[r][c] * V[c], V read in place. */
ALWAYS_INLINE void pv_generic(float *o, const float *p, const float *alpha, const int *n, int rows, const History *h,
                              const int64_t *off, int bf) {
    int64_t hs = h->head_size;
    for (int r = 0; r < rows; r++) {
        if (n[r] == 0) continue;
        float *orow = o + r * hs;
        for (int64_t d = 0; d < hs; d++) orow[d] *= alpha[r];
        for (int c = 0; c < n[r]; c++)
            for (int64_t d = 0; d < hs; d++)
                orow[d] = fmaf(p[r * TILE_KV + c], load(h->value_cache, off[c] + d, bf), orow[d]);
    }
}

/* ---- one tile item, for every instruction set ------------------------------------------------------------ */

/* Row r of an item is token r / heads, head r % heads; tokens sit at positions pos0, pos0 + 1, ...
 * E.g. 3 heads, pos0 = 100, 16 tokens: rows 0-2 are position 100, rows 45-47 position 115. The item reads
 * keys 0..115 in two KV tiles, [0, 64) and [64, 116) (n = 52). In the second, row 0 sees n[0] = 100 - 64
 * + 1 = 37 of its positions and rows 45-47 all 52 (a row sees none of a tile that starts past its
 * position). Rows from `rows` on, padding to a multiple of BLOCK_ROWS, read row 0's query and see nothing. */
ALWAYS_INLINE void attend_tile(const TileItem *it, TileBuffers *b, float scale, int bf, int mode) {
    const History *h = &it->h;
    int64_t hs = h->head_size, es = elem_size(bf);
    int rows = it->tokens * it->heads, padded = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS * BLOCK_ROWS;
    for (int r = 0; r < padded; r++) {
        int t = r < rows ? r / it->heads : 0, g = r < rows ? r % it->heads : 0;
        b->q[r] = it->q + (t * it->q_stride + g * hs) * es;
        b->m[r] = -INFINITY;
        b->l[r] = 0.0f;
    }
    memset(b->o, 0, sizeof(float) * padded * hs);
    int64_t end = it->pos0 + it->tokens;  /* the last row sees keys 0 .. end - 1 */
    for (int64_t p0 = 0; p0 < end; p0 += TILE_KV) {
        int n = (int)(end - p0 < TILE_KV ? end - p0 : TILE_KV);
        for (int c = 0; c < n; c++) b->off[c] = history_row(h, p0 + c);
        for (int r = 0; r < padded; r++) {
            int64_t sees = r < rows ? it->pos0 + r / it->heads + 1 - p0 : 0;
            b->n[r] = (int)(sees < 0 ? 0 : sees > n ? n : sees);
        }
        if (mode == MODE_PLAIN_C) {
            scores_generic(b->s, b->n, rows, b->q, h, b->off, scale, bf);
            online_softmax(b->s, b->m, b->l, b->alpha, b->n, rows);
            pv_generic(b->o, b->s, b->alpha, b->n, rows, h, b->off, bf);
        }
#ifdef __AVX512F__
        if (mode == MODE_AVX512) tile_path_avx512(b, h, n, rows, padded, scale, bf);
#endif
#ifdef HAVE_AVX512_BF16
        if (mode == MODE_AVX512_BF16) tile_path_avx512_bf16(b, h, n, rows, padded, scale);
#endif
    }
    for (int r = 0; r < rows; r++) {
        float inv = 1.0f / b->l[r];
        char *o = it->out + (r / it->heads * it->out_stride + r % it->heads * hs) * es;
        for (int64_t d = 0; d < hs; d++) store(o, d, b->o[r * hs + d] * inv, bf);
    }
}

/* ---- the entry point ------------------------------------------------------------------------------------- */

static void *alloc64(size_t bytes) { return bytes ? aligned_alloc(64, (bytes + 63) / 64 * 64) : NULL; }

void paged_attention(void *out, const void *query, const void *key_cache, const void *value_cache,
                     const int32_t *block_table, const int32_t *query_start_loc, const int32_t *seq_lens,
                     int64_t num_reqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                     int64_t block_size, int64_t block_table_stride, int64_t q_stride, int64_t out_stride,
                     float scale, int dtype) {
    int64_t qpk = num_heads / num_kv_heads, es = elem_size(dtype == DTYPE_BF16);
    int bf = dtype == DTYPE_BF16, mode = MODE_PLAIN_C;
#ifdef __AVX512F__
    if (head_size % 16 == 0) mode = MODE_AVX512;
#ifdef HAVE_AVX512_BF16
    if (head_size % 16 == 0 && bf) mode = MODE_AVX512_BF16;
#endif
#endif
    int64_t tile_tokens = TILE_ROWS / qpk > 0 ? TILE_ROWS / qpk : 1;
    int64_t rows = (tile_tokens * qpk + BLOCK_ROWS - 1) / BLOCK_ROWS * BLOCK_ROWS;
    /* The work list: (request, first token) per tile of each request's query rows. E.g. query_start_loc
     * [0, 70, 71], 32 tokens a tile: (0, 0), (0, 32), (0, 64), (1, 0); items are those x KV heads. */
    int64_t tiles = 0, max_row_seq = 0, tile_path = 0, decodes = 0;  /* buffers only for the paths this step takes */
    for (int64_t r = 0; r < num_reqs; r++) {
        int64_t q_len = query_start_loc[r + 1] - query_start_loc[r];
        tiles += (q_len + tile_tokens - 1) / tile_tokens;
        if (q_len > ROW_PATH_MAX_QUERY) tile_path = rows;
        else if (q_len > 0) {
            decodes++;
            if (seq_lens[r] > max_row_seq) max_row_seq = seq_lens[r];
        }
    }
    /* With enough decodes to keep every thread busy, a decode is one item for all its heads
     * (cpu_attn_avx512.c); with few, an item per KV head spreads one request over the threads. */
    int whole = 0;
#ifdef __AVX512F__
    whole = head_size % 16 == 0 && head_size <= 16 * MAX_HEAD_VECS && decodes >= 2 * omp_get_max_threads();
#endif
    /* heads one row-path item holds scores for */
    int64_t row_heads = whole ? num_heads : qpk > HEAD_GROUP ? qpk : HEAD_GROUP;
    int64_t *work = malloc(sizeof(int64_t) * 2 * (tiles > 0 ? tiles : 1)), k = 0;
    for (int64_t r = 0; r < num_reqs; r++)
        for (int64_t t = 0; t < query_start_loc[r + 1] - query_start_loc[r]; t += tile_tokens) {
            work[2 * k] = r;
            work[2 * k + 1] = t;
            k++;
        }
#pragma omp parallel
    {
        int64_t tr = tile_path, kv = tile_path ? TILE_KV : 0;  /* all sizes 0 without tile items */
        TileBuffers b = {alloc64(sizeof(float) * tr * TILE_KV), alloc64(sizeof(float) * tr * head_size),
                         alloc64(sizeof(float) * tr), alloc64(sizeof(float) * tr), alloc64(sizeof(float) * tr),
                         alloc64(sizeof(int) * tr), alloc64(sizeof(char *) * tr), alloc64(sizeof(int64_t) * kv),
                         alloc64(sizeof(float) * kv * head_size), alloc64(sizeof(float) * kv * head_size),
                         alloc64(sizeof(uint32_t) * tr * TILE_KV / 2)};
        float *scores = max_row_seq ? malloc(sizeof(float) * row_heads * max_row_seq) : NULL;
        float *acc = max_row_seq ? malloc(sizeof(float) * row_heads * head_size) : NULL;
        float *maxs = max_row_seq ? malloc(sizeof(float) * 2 * row_heads) : NULL;
        bf16 *probs = max_row_seq && bf ? malloc(sizeof(bf16) * row_heads * (max_row_seq + 2)) : NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < tiles * num_kv_heads; item++) {
            /* last tiles first: a request's later tiles see the most history */
            int64_t w = tiles - 1 - item / num_kv_heads, kvh = item % num_kv_heads, r = work[2 * w];
            int64_t q_len = query_start_loc[r + 1] - query_start_loc[r], first = work[2 * w + 1];
            int64_t tokens = q_len - first < tile_tokens ? q_len - first : tile_tokens;
            int64_t row0 = query_start_loc[r] + first, pos0 = seq_lens[r] - q_len + first;
            History h = {key_cache, value_cache, block_table + r * block_table_stride, 0, block_size,
                         num_kv_heads * head_size, kvh * head_size, head_size};
            const char *q = (const char *)query + (row0 * q_stride + kvh * qpk * head_size) * es;
            char *o = (char *)out + (row0 * out_stride + kvh * qpk * head_size) * es;
            if (q_len > ROW_PATH_MAX_QUERY) {
                TileItem it = {h, pos0, q_stride, out_stride, (int)tokens, (int)qpk, q, o};
                switch (mode * 2 + bf) {
                    case MODE_AVX512_BF16 * 2 + 1: attend_tile(&it, &b, scale, 1, MODE_AVX512_BF16); break;
                    case MODE_AVX512 * 2 + 1: attend_tile(&it, &b, scale, 1, MODE_AVX512); break;
                    case MODE_AVX512 * 2: attend_tile(&it, &b, scale, 0, MODE_AVX512); break;
                    case MODE_PLAIN_C * 2 + 1: attend_tile(&it, &b, scale, 1, MODE_PLAIN_C); break;
                    default: attend_tile(&it, &b, scale, 0, MODE_PLAIN_C);
                }
                continue;
            }
            for (int64_t t = 0; t < tokens; t++) {
                h.seq_len = pos0 + t + 1;
                const char *qt = q + t * q_stride * es;
                char *ot = o + t * out_stride * es;
#ifdef __AVX512F__
                if (head_size % 16 == 0 && head_size <= 16 * MAX_HEAD_VECS) {
                    /* whole: item kvh 0 takes the request's every head, the others have nothing left */
                    int64_t nkv = whole ? num_kv_heads : 1;
                    if (whole && kvh != 0) continue;
#ifdef HAVE_AVX512_BF16
                    if (bf && head_size % 32 == 0) {
                        row_path_avx512_bf16((bf16 *)ot, (const bf16 *)qt, &h, kvh, nkv, qpk, scale, scores, probs,
                                             acc, maxs, (int)(head_size / 32));
                        continue;
                    }
#endif
                    row_path_avx512(ot, qt, &h, kvh, nkv, qpk, scale, scores, acc, maxs, maxs + row_heads, bf);
                    continue;
                }
#endif
                for (int64_t first_head = 0; first_head < qpk; first_head += HEAD_GROUP) {
                    int heads = (int)(qpk - first_head < HEAD_GROUP ? qpk - first_head : HEAD_GROUP);
                    const char *qh = qt + first_head * head_size * es;
                    char *oh = ot + first_head * head_size * es;
                    if (bf) attend_generic(oh, head_size, qh, &h, heads, scale, scores, acc, 1);
                    else attend_generic(oh, head_size, qh, &h, heads, scale, scores, acc, 0);
                }
            }
        }
        free(b.s), free(b.o), free(b.m), free(b.l), free(b.alpha), free(b.n), free(b.q), free(b.off), free(b.kt);
        free(b.v), free(b.pw), free(scores), free(acc), free(maxs), free(probs);
    }
    free(work);
}

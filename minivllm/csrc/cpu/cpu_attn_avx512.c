/* Mirror of vLLM's csrc/cpu/cpu_attn_vec16.hpp (its 16-float vector paths): cpu_attn.c's two paths in AVX-512
 * float32 FMAs, for float32, and for bf16 where the CPU has no AVX512_BF16 (K/V widened to float32 exactly).
 *
 * The row path (a decode's query heads) reads the history a KV block at a time in three passes: scores, softmax,
 * P.V, the next block's rows fetched into L2 meanwhile. The tile path packs each KV tile once (K transposed) and
 * computes BLOCK_ROWS rows x TILE_KV positions per register block, no horizontal sums in its inner loops. Shapes
 * that are constants after inlining (heads, vectors per head, bf) keep the accumulators in registers.
 */
#include "cpu_attn_impl.h"
#include "ops.h"

#ifdef __AVX512F__
#include "cpu_attn_avx512.h"

/* ---- the row path: a decode's heads, the history read block by block -------------------------------------- */

/* Row i (`bytes` long) of the block at pf into L2, for the block after the one being computed. Into L2, not L1:
 * there the prefetches of a block's rows would crowd the misses L1 serves the products. */
ALWAYS_INLINE void prefetch_row(const char *pf, int64_t i, int64_t bytes) {
    if (pf)
        for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(pf + i * bytes + b, _MM_HINT_T1);
}

/* Scores of one KV block for `heads` query heads sharing the KV head at kv_off: positions p0 .. p0 + n - 1,
 * whose rows start at element `base`, h->row apart. s[g * h->seq_len + p] gets each score, maxs[g] the max. */
ALWAYS_INLINE void decode_scores_avx512(float *s, float *maxs, const void *q, const History *h, int64_t kv_off,
                                        int heads, int nv, float scale, int64_t p0, int64_t n, int64_t base,
                                        const char *pf, int bf) {
    __m512 qv[HEAD_GROUP][MAX_HEAD_VECS];
    for (int g = 0; g < heads; g++)
        for (int j = 0; j < nv; j++) qv[g][j] = _mm512_mul_ps(load16(q, g * 16 * nv + 16 * j, bf), _mm512_set1_ps(scale));
    for (int64_t i = 0; i < n; i++) {
        int64_t kr = base + i * h->row + kv_off;
        prefetch_row(pf, i, h->row * elem_size(bf));
        __m512 kv[MAX_HEAD_VECS];
        for (int j = 0; j < nv; j++) kv[j] = load16(h->key_cache, kr + 16 * j, bf);
        for (int g = 0; g < heads; g++) {
            __m512 dot = _mm512_mul_ps(qv[g][0], kv[0]);
            for (int j = 1; j < nv; j++) dot = _mm512_fmadd_ps(qv[g][j], kv[j], dot);
            float sc = _mm512_reduce_add_ps(dot);
            s[g * h->seq_len + p0 + i] = sc;
            maxs[g] = sc > maxs[g] ? sc : maxs[g];
        }
    }
}

/* acc[g] (float32, 16 * nv wide) += p[g][p] * V[p] over the same block. */
ALWAYS_INLINE void decode_pv_avx512(float *acc, const float *s, const History *h, int64_t kv_off, int heads, int nv,
                                    int64_t p0, int64_t n, int64_t base, const char *pf, int bf) {
    __m512 a[HEAD_GROUP][MAX_HEAD_VECS];
    for (int g = 0; g < heads; g++)
        for (int j = 0; j < nv; j++) a[g][j] = _mm512_loadu_ps(acc + g * 16 * nv + 16 * j);
    for (int64_t i = 0; i < n; i++) {
        int64_t vr = base + i * h->row + kv_off;
        prefetch_row(pf, i, h->row * elem_size(bf));
        __m512 vv[MAX_HEAD_VECS];
        for (int j = 0; j < nv; j++) vv[j] = load16(h->value_cache, vr + 16 * j, bf);
        for (int g = 0; g < heads; g++) {
            __m512 w = _mm512_set1_ps(s[g * h->seq_len + p0 + i]);
            for (int j = 0; j < nv; j++) a[g][j] = _mm512_fmadd_ps(w, vv[j], a[g][j]);
        }
    }
    for (int g = 0; g < heads; g++)
        for (int j = 0; j < nv; j++) _mm512_storeu_ps(acc + g * 16 * nv + 16 * j, a[g][j]);
}

/* One KV block of one pass for `heads` query heads of nv vectors each: the scores (pass 0) or P.V (pass 1). */
ALWAYS_INLINE void decode_block_avx512(int pass, float *s, float *maxs, float *acc, const char *q, const History *h,
                                       int64_t kv_off, int heads, int nv, float scale, int64_t p0, int64_t n,
                                       int64_t base, const char *pf, int bf) {
    if (pass == 0) decode_scores_avx512(s, maxs, q, h, kv_off, heads, nv, scale, p0, n, base, pf, bf);
    else decode_pv_avx512(acc, s, h, kv_off, heads, nv, p0, n, base, pf, bf);
}

/* One query token at h->seq_len - 1 for the qpk query heads of each of KV heads kvh0 .. kvh0 + nkv - 1 (out and
 * q point at the first of those heads), in three passes (scores, softmax, P.V), the history read a KV block at
 * a time: every one of the item's KV heads in a block is done before the next block, whose rows are fetched
 * meanwhile. With nkv = num_kv_heads (a whole decode per item) the block's rows, which lie back to back in the
 * cache, are read whole; an item per KV head (nkv = 1) reads its third of each row (for SmolLM2) and leaves
 * the rest to other items. nv and bf are constants after inlining where the caller passes literals. */
ALWAYS_INLINE void attend_decode_avx512(char *out, const char *q, const History *h, int64_t kvh0, int64_t nkv,
                                        int64_t qpk, float scale, float *scores, float *acc, float *maxs, float *inv,
                                        int bf) {
    int64_t hs = h->head_size, heads_total = nkv * qpk, seq = h->seq_len, bs = h->block_size, es = elem_size(bf);
    int nv = (int)(hs / 16);
    for (int64_t g = 0; g < heads_total; g++) maxs[g] = -INFINITY;
    memset(acc, 0, sizeof(float) * heads_total * hs);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) softmax_rows(scores, maxs, inv, (int)heads_total, seq);
        for (int64_t p0 = 0; p0 < seq; p0 += bs) {
            int64_t n = seq - p0 < bs ? seq - p0 : bs, base = (int64_t)h->blocks[p0 / bs] * bs * h->row;
            /* the next block's rows are fetched a row per position while this block is computed */
            const char *next = p0 + bs < seq ? (const char *)(pass ? h->value_cache : h->key_cache) +
                                                   (int64_t)h->blocks[p0 / bs + 1] * bs * h->row * es : NULL;
            for (int64_t k = 0; k < nkv; k++)
                for (int64_t g0 = 0; g0 < qpk; g0 += HEAD_GROUP) {
                    int heads = (int)(qpk - g0 < HEAD_GROUP ? qpk - g0 : HEAD_GROUP);
                    int64_t first = k * qpk + g0, kv_off = (kvh0 + k) * hs;
                    float *s = scores + first * seq;
                    const char *pf = k == 0 && g0 == 0 ? next : NULL;
                    float *m = maxs + first, *a = acc + first * hs;
                    const char *qh = q + first * hs * es;
                    switch (heads * 32 + nv) {  /* constants for 1-4 heads of 64 or 128 dims: vectors in registers */
                        case 1 * 32 + 4:
                            decode_block_avx512(pass, s, m, a, qh, h, kv_off, 1, 4, scale, p0, n, base, pf, bf);
                            break;
                        case 2 * 32 + 4:
                            decode_block_avx512(pass, s, m, a, qh, h, kv_off, 2, 4, scale, p0, n, base, pf, bf);
                            break;
                        case 3 * 32 + 4:
                            decode_block_avx512(pass, s, m, a, qh, h, kv_off, 3, 4, scale, p0, n, base, pf, bf);
                            break;
                        case 4 * 32 + 4:
                            decode_block_avx512(pass, s, m, a, qh, h, kv_off, 4, 4, scale, p0, n, base, pf, bf);
                            break;
                        case 1 * 32 + 8:
                            decode_block_avx512(pass, s, m, a, qh, h, kv_off, 1, 8, scale, p0, n, base, pf, bf);
                            break;
                        case 2 * 32 + 8:
                            decode_block_avx512(pass, s, m, a, qh, h, kv_off, 2, 8, scale, p0, n, base, pf, bf);
                            break;
                        case 3 * 32 + 8:
                            decode_block_avx512(pass, s, m, a, qh, h, kv_off, 3, 8, scale, p0, n, base, pf, bf);
                            break;
                        case 4 * 32 + 8:
                            decode_block_avx512(pass, s, m, a, qh, h, kv_off, 4, 8, scale, p0, n, base, pf, bf);
                            break;
                        default: decode_block_avx512(pass, s, m, a, qh, h, kv_off, heads, nv, scale, p0, n, base, pf, bf);
                    }
                }
        }
    }
    for (int64_t g = 0; g < heads_total; g++)
        for (int j = 0; j < nv; j++)
            store16(out, g * hs + 16 * j, _mm512_mul_ps(_mm512_loadu_ps(acc + g * hs + 16 * j), _mm512_set1_ps(inv[g])), bf);
}

/* ---- the tile path: packing, then the register-blocked products ------------------------------------------- */

/* K tile as float32, transposed: kt[d * TILE_KV + c] = K[p0 + c][d]; positions past n are zero. */
ALWAYS_INLINE void pack_k_f32(float *kt, const History *h, const int64_t *off, int n, int bf) {
    for (int c0 = 0; c0 < TILE_KV; c0 += 16)
        for (int64_t d0 = 0; d0 < h->head_size; d0 += 16) {
            __m512i x[16];
            for (int i = 0; i < 16; i++)
                x[i] = c0 + i < n ? _mm512_castps_si512(load16(h->key_cache, off[c0 + i] + d0, bf)) : _mm512_setzero_si512();
            transpose16_store(x, (uint32_t *)kt + d0 * TILE_KV + c0, TILE_KV, 16);
        }
}

/* V tile as float32 rows: v[c * head_size + d] = V[p0 + c][d], for c < n. */
ALWAYS_INLINE void pack_v_f32(float *v, const History *h, const int64_t *off, int n, int bf) {
    for (int c = 0; c < n; c++)
        for (int64_t d = 0; d < h->head_size; d += 16)
            _mm512_store_ps(v + c * h->head_size + d, load16(h->value_cache, off[c] + d, bf));
}

/* s[r][c] = scale * q_r . K[c] for BLOCK_ROWS rows and all TILE_KV positions: per dimension d, the TILE_KV_VECS vectors
 * of kt (TILE_KV positions) times q_r[d] broadcast, into BLOCK_ROWS x TILE_KV_VECS accumulators. */
ALWAYS_INLINE void scores_f32(float *s, const float *kt, const char *const *q, int64_t hs, float scale, int bf) {
    __m512 acc[BLOCK_ROWS][TILE_KV_VECS];
    for (int r = 0; r < BLOCK_ROWS; r++)
        for (int j = 0; j < TILE_KV_VECS; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hs; d++) {
        __m512 k[TILE_KV_VECS];
        for (int j = 0; j < TILE_KV_VECS; j++) k[j] = _mm512_load_ps(kt + d * TILE_KV + 16 * j);
        for (int r = 0; r < BLOCK_ROWS; r++) {
            __m512 qb = _mm512_set1_ps(load(q[r], d, bf));
            for (int j = 0; j < TILE_KV_VECS; j++) acc[r][j] = _mm512_fmadd_ps(qb, k[j], acc[r][j]);
        }
    }
    for (int r = 0; r < BLOCK_ROWS; r++)
        for (int j = 0; j < TILE_KV_VECS; j++)
            _mm512_store_ps(s + r * TILE_KV + 16 * j, _mm512_mul_ps(acc[r][j], _mm512_set1_ps(scale)));
}

/* o[r][0 .. 16 nvc) = o * alpha[r] + sum_c p[r][c] v[c][0 .. 16 nvc) for BLOCK_ROWS rows (o, v start at the
 * chunk's first dimension; rows head_size apart). */
ALWAYS_INLINE void pv_f32(float *o, const float *p, const float *alpha, const float *v, int n, int64_t hs, int nvc) {
    __m512 acc[BLOCK_ROWS][4];
    for (int r = 0; r < BLOCK_ROWS; r++)
        for (int j = 0; j < nvc; j++) acc[r][j] = _mm512_mul_ps(_mm512_load_ps(o + r * hs + 16 * j), _mm512_set1_ps(alpha[r]));
    for (int c = 0; c < n; c++) {
        __m512 vv[4];
        for (int j = 0; j < nvc; j++) vv[j] = _mm512_load_ps(v + c * hs + 16 * j);
        for (int r = 0; r < BLOCK_ROWS; r++) {
            __m512 w = _mm512_set1_ps(p[r * TILE_KV + c]);
            for (int j = 0; j < nvc; j++) acc[r][j] = _mm512_fmadd_ps(w, vv[j], acc[r][j]);
        }
    }
    for (int r = 0; r < BLOCK_ROWS; r++)
        for (int j = 0; j < nvc; j++) _mm512_store_ps(o + r * hs + 16 * j, acc[r][j]);
}

/* P.V for rows [r0, r0 + BLOCK_ROWS) over dimensions in chunks of up to 4 vectors (64 dims): constant shapes. */
ALWAYS_INLINE void tile_pv_avx512(const TileBuffers *b, int r0, int n, int64_t hs) {
    for (int64_t d0 = 0; d0 < hs; d0 += 64) {
        int nvc = (int)((hs - d0) / 16 < 4 ? (hs - d0) / 16 : 4);
        float *o = b->o + r0 * hs + d0;
        const float *p = b->s + r0 * TILE_KV, *v = (const float *)b->v + d0;
        switch (nvc) {
            case 4: pv_f32(o, p, b->alpha + r0, v, n, hs, 4); break;
            case 3: pv_f32(o, p, b->alpha + r0, v, n, hs, 3); break;
            case 2: pv_f32(o, p, b->alpha + r0, v, n, hs, 2); break;
            default: pv_f32(o, p, b->alpha + r0, v, n, hs, 1);
        }
    }
}

/* One KV tile of n positions for a tile item's `rows` rows (padded to `padded`): pack K (transposed) and V as
 * float32, the scores of every block of rows that sees the tile, the online softmax, then P.V. */
ALWAYS_INLINE void tile_avx512(TileBuffers *b, const History *h, int n, int rows, int padded, float scale, int bf) {
    int64_t hs = h->head_size;
    pack_k_f32(b->kt, h, b->off, n, bf);
    pack_v_f32(b->v, h, b->off, n, bf);
    for (int r0 = 0; r0 < padded; r0 += BLOCK_ROWS)
        if (block_seen(b, r0, rows) > 0) scores_f32(b->s + r0 * TILE_KV, b->kt, b->q + r0, hs, scale, bf);
    online_softmax16(b->s, b->m, b->l, b->alpha, b->pw, b->n, padded, 0);
    for (int r0 = 0; r0 < padded; r0 += BLOCK_ROWS)
        if (block_seen(b, r0, rows) > 0) tile_pv_avx512(b, r0, block_seen(b, r0, rows), hs);
}

/* ---- what cpu_attn.c calls: bf a constant inside ------------------------------------------------------------ */

INTERNAL void row_path_avx512(char *out, const char *q, const History *h, int64_t kvh0, int64_t nkv, int64_t qpk,
                              float scale, float *scores, float *acc, float *maxs, float *inv, int bf) {
    if (bf) attend_decode_avx512(out, q, h, kvh0, nkv, qpk, scale, scores, acc, maxs, inv, 1);
    else attend_decode_avx512(out, q, h, kvh0, nkv, qpk, scale, scores, acc, maxs, inv, 0);
}

INTERNAL void tile_path_avx512(TileBuffers *b, const History *h, int n, int rows, int padded, float scale, int bf) {
    if (bf) tile_avx512(b, h, n, rows, padded, scale, 1);
    else tile_avx512(b, h, n, rows, padded, scale, 0);
}
#endif /* __AVX512F__ */

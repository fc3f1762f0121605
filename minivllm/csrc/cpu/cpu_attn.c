/* Mirror of vLLM's csrc/cpu/cpu_attn.cpp (the CPU attention backend's kernel): paged attention for
 * every query token of a step in one call, the read path.
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
 *    TILE_KV at a time: packs that K tile (transposed) and V tile once into per-thread buffers, computes
 *    the rows x TILE_KV scores, masks each row causally, updates an online softmax (per row a running max
 *    m and sum l; when m grows, what was accumulated so far is scaled by exp(m_old - m_new)) and adds P.V
 *    into float32 accumulators, divided by l once at the end. K/V rows are read once per item instead of
 *    once per query row, and both products are register-blocked (RB rows x TILE_KV positions, RB rows x
 *    64 dims) with no horizontal sums in their inner loops: the item is bound by arithmetic.
 *  - Rows (decodes): one query token, three passes over the history (scores, softmax, P.V), a KV block
 *    at a time with the next block fetched meanwhile. With one query row there is nothing to share a
 *    packed tile with, and this path is the faster one for it. With at least two decodes per thread (and
 *    AVX-512) a decode is one item for all its heads, the block's rows (every KV head) read together; with
 *    fewer, an item per KV head spreads a request over the threads. On 30 layers' caches (memory-bound)
 *    decode attention ran 1.1-1.2x faster than with the previous row path (README, "Decode kernels"). In bf16
 *    with AVX512_BF16 (head sizes a multiple of 32) both products are dot products on bf16 pairs, and the
 *    history is prefetched in even slices over the work (attend_decode_dp): 1.15-1.45x again.
 *
 * Arithmetic per build (-march=native; the library is built per CPU). Tiles: bf16 with AVX512_BF16 runs
 * both products as vdpbf16ps (pairs of bf16, float32 sums; the probabilities are rounded to bf16 for P.V,
 * as PyTorch's own CPU flash attention does, and their exponential is a shorter one, exp16_for_bf16);
 * float32, or bf16 without AVX512_BF16, runs AVX-512 float32 FMAs; without AVX-512, or for a head_size
 * that is not a multiple of 16, plain C loops compute the same tiles. Rows: bf16 with AVX512_BF16 runs both
 * products as vdpbf16ps (the probabilities rounded to bf16 for P.V, as in the tiles); otherwise AVX-512 float32
 * FMAs, or plain C. Each plain-C path is written first, as the reference of the vector code after it.
 *
 *   query/out  [num_tokens, num_heads, head_size] rows q_stride / out_stride apart (elements)
 *   key_cache, value_cache  [num_blocks, block_size, num_kv_heads, head_size], contiguous
 *   block_table  [num_reqs, >= blocks of the longest], rows block_table_stride apart
 *   query_start_loc [num_reqs + 1], seq_lens [num_reqs]  int32
 *
 * Left out: vLLM's AMX/NEON/VSX paths, sliding windows, ALiBi, soft-capping, sinks, fp8 caches.
 */
#include "cpu_types.h"
#include "ops.h"

#include <omp.h>

#define GROUP 4          /* query heads per row-path item */
#define TILE_KV 64       /* KV positions per tile: a multiple of 32 (score vectors per row go in pairs) */
#define KV_VECS (TILE_KV / 16)
/* query rows per tile item: TILE_TOKENS = TILE_ROWS / (query heads per KV head). 96 ran a 32-prompt prefill
 * 1.01-1.09x faster than 48 (each packed K/V tile serves twice the rows); 144 was no faster. */
#define TILE_ROWS 96
#define ROW_PATH_MAX_QUERY 1 /* requests with at most this many query tokens take the row path */
#define RB 6             /* rows per register block of the tile products */
#define MODE_GENERIC 0   /* tile path, plain C */
#define MODE_F32 1       /* tile path, AVX-512 float32 FMAs */
#define MODE_DP 2        /* tile path, AVX512_BF16 dot products */

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

/* ---- the row path ----------------------------------------------------------------------------------- */

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

/* ---- the tile path: what every instruction set shares, then the plain-C products ------------------------ */

typedef struct {  /* one thread's buffers for the tile path; rows = TILE_ROWS or more, padded to RB */
    float *s;           /* [rows][TILE_KV] scores of one KV tile, then its probabilities */
    float *o;           /* [rows][head_size] the P.V accumulators */
    float *m, *l, *alpha;  /* [rows] running max, running sum, this tile's rescale of what came before */
    int *n;             /* [rows] how many of this KV tile's positions row r sees (0 .. TILE_KV) */
    const char **q;     /* [rows] each row's query head */
    int64_t *off;       /* [TILE_KV] element offset of each position's K/V row in its cache */
    void *kt, *v;       /* the packed K tile (transposed) and V tile, layouts per instruction set */
    uint32_t *pw;       /* [rows][TILE_KV / 2] probabilities as bf16 pairs (AVX512_BF16 path) */
} TileBuffers;

typedef struct {  /* one tile item: `tokens` query tokens from position pos0 on, all `heads` of one KV head */
    History h;
    int64_t pos0, q_stride, out_stride;
    int tokens, heads;
    const char *q;  /* the first token's first query head of this KV head */
    char *out;
} TileItem;

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
AI void scores_generic(float *s, const int *n, int rows, const char *const *q, const History *h,
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
AI void pv_generic(float *o, const float *p, const float *alpha, const int *n, int rows, const History *h,
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

#ifdef __AVX512F__
/* ---- the row path with AVX-512: a decode's heads, the history read block by block -------------------------- */
#define MAX_VECS 16 /* head_size <= 256 */

/* Row i (`bytes` long) of the block at pf into L2, for the block after the one being computed. Into L2, not L1:
 * with T0 the prefetches of a block's rows crowded L1's misses, and decode attention over 30 layers' caches ran
 * 1.4x slower (4 to 32 decodes; one of 2,000 positions), the output bit for bit the same. */
AI void prefetch_row(const char *pf, int64_t i, int64_t bytes) {
    if (pf)
        for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(pf + i * bytes + b, _MM_HINT_T1);
}

/* Scores of one KV block for `heads` query heads sharing the KV head at kv_off: positions p0 .. p0 + n - 1,
 * whose rows start at element `base`, h->row apart. s[g * h->seq_len + p] gets each score, maxs[g] the max. */
AI void decode_scores_avx512(float *s, float *maxs, const void *q, const History *h, int64_t kv_off, int heads,
                             int nv, float scale, int64_t p0, int64_t n, int64_t base, const char *pf, int bf) {
    __m512 qv[GROUP][MAX_VECS];
    for (int g = 0; g < heads; g++)
        for (int j = 0; j < nv; j++) qv[g][j] = _mm512_mul_ps(load16(q, g * 16 * nv + 16 * j, bf), _mm512_set1_ps(scale));
    for (int64_t i = 0; i < n; i++) {
        int64_t kr = base + i * h->row + kv_off;
        prefetch_row(pf, i, h->row * elem_size(bf));
        __m512 kv[MAX_VECS];
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
AI void decode_pv_avx512(float *acc, const float *s, const History *h, int64_t kv_off, int heads, int nv, int64_t p0,
                         int64_t n, int64_t base, const char *pf, int bf) {
    __m512 a[GROUP][MAX_VECS];
    for (int g = 0; g < heads; g++)
        for (int j = 0; j < nv; j++) a[g][j] = _mm512_loadu_ps(acc + g * 16 * nv + 16 * j);
    for (int64_t i = 0; i < n; i++) {
        int64_t vr = base + i * h->row + kv_off;
        prefetch_row(pf, i, h->row * elem_size(bf));
        __m512 vv[MAX_VECS];
        for (int j = 0; j < nv; j++) vv[j] = load16(h->value_cache, vr + 16 * j, bf);
        for (int g = 0; g < heads; g++) {
            __m512 w = _mm512_set1_ps(s[g * h->seq_len + p0 + i]);
            for (int j = 0; j < nv; j++) a[g][j] = _mm512_fmadd_ps(w, vv[j], a[g][j]);
        }
    }
    for (int g = 0; g < heads; g++)
        for (int j = 0; j < nv; j++) _mm512_storeu_ps(acc + g * 16 * nv + 16 * j, a[g][j]);
}

/* One query token at h->seq_len - 1 for the qpk query heads of each of KV heads kvh0 .. kvh0 + nkv - 1 (out and
 * q point at the first of those heads), in three passes (scores, softmax, P.V), the history read a KV block at
 * a time: every one of the item's KV heads in a block is done before the next block, whose rows are fetched
 * meanwhile. With nkv = num_kv_heads (a whole decode per item) the block's rows, which lie back to back in the
 * cache, are read whole; an item per KV head (nkv = 1) reads its third of each row (for SmolLM2) and leaves
 * the rest to other items. nv and bf are constants after inlining where the caller passes literals. */
AI void attend_decode_avx512(char *out, const char *q, const History *h, int64_t kvh0, int64_t nkv, int64_t qpk,
                             float scale, float *scores, float *acc, float *maxs, float *inv, int bf) {
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
                for (int64_t g0 = 0; g0 < qpk; g0 += GROUP) {
                    int heads = (int)(qpk - g0 < GROUP ? qpk - g0 : GROUP);
                    int64_t first = k * qpk + g0, kv_off = (kvh0 + k) * hs;
                    float *s = scores + first * seq;
                    const char *pf = k == 0 && g0 == 0 ? next : NULL;
#define CASE(H, NV) case (H - 1) * MAX_VECS + NV - 1:                                                        \
    if (pass == 0) decode_scores_avx512(s, maxs + first, q + first * hs * es, h, kv_off, H, NV, scale, p0, n, base, pf, bf); \
    else decode_pv_avx512(acc + first * hs, s, h, kv_off, H, NV, p0, n, base, pf, bf);                            \
    break;
                    switch ((heads - 1) * MAX_VECS + nv - 1) {
                        CASE(1, 4) CASE(2, 4) CASE(3, 4) CASE(4, 4) CASE(1, 8) CASE(2, 8) CASE(3, 8) CASE(4, 8)
                        default:
                            if (pass == 0) decode_scores_avx512(s, maxs + first, q + first * hs * es, h, kv_off, heads,
                                                                nv, scale, p0, n, base, pf, bf);
                            else decode_pv_avx512(acc + first * hs, s, h, kv_off, heads, nv, p0, n, base, pf, bf);
                    }
#undef CASE
                }
        }
    }
    for (int64_t g = 0; g < heads_total; g++)
        for (int j = 0; j < nv; j++)
            store16(out, g * hs + 16 * j, _mm512_mul_ps(_mm512_loadu_ps(acc + g * hs + 16 * j), _mm512_set1_ps(inv[g])), bf);
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
/* ---- the row path with AVX512_BF16: both products as bf16 dot products ------------------------------------
 *
 * The float32 row path above spends most of its instructions widening bf16 to float32 and on one horizontal
 * sum per score. Here K and V stay bf16 and vdpbf16ps multiplies them a pair of elements at a time:
 *  - a score is the bf16 query's dot product with a K row (float32 sums), times the scale. Sixteen positions'
 *    dot vectors are summed across their lanes together (sum16x16), a few shuffles per score instead of a
 *    horizontal sum each;
 *  - P.V takes positions in pairs: the two V rows interleaved element by element, times each head's two
 *    probabilities rounded to bf16 (as the tile path, and PyTorch's CPU flash attention, do; the softmax's sum
 *    stays float32).
 * For head sizes that are a multiple of 32, at most 256; the float32 row path takes the others. */
#define DP_MAX_Z 8 /* 32-element vectors per row: head_size <= 256 */

/* sum16x16's output lane e holds the sum of input slot DP_SLOT[e]; the map is its own inverse, so position i of
 * a 16-position chunk goes to slot DP_SLOT[i] and its score comes out in lane i. */
static const int DP_SLOT[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};

/* The 16 lane sums of v[0..15] in one vector, in four rounds that each halve the vectors by adding a shuffle of
 * two to another: 256-bit halves, then 128-bit lanes, then pairs of floats, then single floats. */
AI __m512 sum16x16(const __m512 v[16]) {
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < 8; i++)
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xEE));
    for (int i = 0; i < 4; i++)
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[i], w[i + 4], 0x88), _mm512_shuffle_f32x4(w[i], w[i + 4], 0xDD));
    for (int i = 0; i < 2; i++) {
        __m512d a = _mm512_castps_pd(x[i]), b = _mm512_castps_pd(x[i + 2]);
        y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    return _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
}

/* Scores of the m (<= 16) positions whose K rows start at kr, kr + row, ... for one query head qh (nz vectors);
 * lanes m .. 15 repeat position 0 (the caller masks them). */
AI __m512 scores16_dp(const bf16 *qh, const bf16 *kr, int64_t row, int m, int nz) {
    __m512bh qv[DP_MAX_Z];
    __m512 v[16];
    for (int z = 0; z < nz; z++) qv[z] = (__m512bh)_mm512_loadu_si512(qh + 32 * z);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        const bf16 *ki = kr + (i < m ? i : 0) * row;
        __m512 dot = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_loadu_si512(ki), qv[0]);
        for (int z = 1; z < nz; z++) dot = _mm512_dpbf16_ps(dot, (__m512bh)_mm512_loadu_si512(ki + 32 * z), qv[z]);
        v[DP_SLOT[i]] = dot;
    }
    return sum16x16(v);
}

/* acc (heads x 2nz vectors) += each head's probability pair at pr[g * pstride] times the V rows va, vb (vb NULL:
 * a zero row), interleaved: lane j of the low vector is element pair (va[d], vb[d]) for d = 32z + 8L + (j % 4),
 * L = j / 4, the high vector d + 4; attend_decode_dp puts the dimensions back in order at the end. */
AI void pv_pair_dp(__m512 *acc, const bf16 *va, const bf16 *vb, const bf16 *pr, int64_t pstride, int heads, int nz) {
    __m512bh lo[DP_MAX_Z], hi[DP_MAX_Z];
    for (int z = 0; z < nz; z++) {
        __m512i a = _mm512_loadu_si512(va + 32 * z), b = vb ? _mm512_loadu_si512(vb + 32 * z) : _mm512_setzero_si512();
        lo[z] = (__m512bh)_mm512_unpacklo_epi16(a, b);
        hi[z] = (__m512bh)_mm512_unpackhi_epi16(a, b);
    }
    for (int g = 0; g < heads; g++) {
        uint32_t pair;
        memcpy(&pair, pr + g * pstride, sizeof pair);
        __m512bh p = (__m512bh)_mm512_set1_epi32((int)pair);
        for (int z = 0; z < nz; z++) {
            acc[g * 2 * nz + 2 * z] = _mm512_dpbf16_ps(acc[g * 2 * nz + 2 * z], lo[z], p);
            acc[g * 2 * nz + 2 * z + 1] = _mm512_dpbf16_ps(acc[g * 2 * nz + 2 * z + 1], hi[z], p);
        }
    }
}

/* Prefetching for the dp row path: the rows of the block a pass reads next (or of V, during the K pass), just the
 * item's KV heads' part of each, handed out in even slices over the pass's work on the current block (one slice
 * per piece of work), so that the requests stay spread out as they are in a plain stream. */
typedef struct {
    const char *from;       /* the block's first row, at the item's first KV head */
    int64_t stride, lines;  /* bytes from row to row; 64-byte lines of the item's part of each row */
    int64_t total, slices;  /* lines in all, handed out over `slices` calls */
    int64_t due, issued, row, line;  /* the running count (Bresenham's, no division), lines issued, the next one */
} Prefetch;

AI void prefetch_slice(Prefetch *pf) {
    if (!pf->from) return;
    for (pf->due += pf->total; pf->due >= pf->slices && pf->issued < pf->total; pf->due -= pf->slices, pf->issued++) {
        _mm_prefetch(pf->from + pf->row * pf->stride + pf->line * 64, _MM_HINT_T1);
        if (++pf->line == pf->lines) pf->line = 0, pf->row++;
    }
}

/* Block j of h's history in `cache` (its rows 0 .. n - 1, KV heads kvh0 .. kvh0 + nkv - 1); nothing for j < 0 or
 * past the history. */
AI Prefetch block_rows(const History *h, const bf16 *cache, int64_t j, int64_t kvh0, int64_t nkv, int64_t slices) {
    Prefetch pf = {NULL, 0, 1, 0, slices, 0, 0, 0, 0};
    int64_t p0 = j * h->block_size;
    if (j >= 0 && p0 < h->seq_len) {
        int64_t n = h->seq_len - p0 < h->block_size ? h->seq_len - p0 : h->block_size;
        pf.from = (const char *)(cache + (int64_t)h->blocks[j] * h->block_size * h->row + kvh0 * h->head_size);
        pf.stride = h->row * (int64_t)sizeof(bf16);
        pf.lines = (nkv * h->head_size * (int64_t)sizeof(bf16) + 63) / 64;
        pf.total = n * pf.lines;
    }
    return pf;
}

/* P.V of one KV block for `heads` query heads: acc_f (float32, heads x head_size, in pv_pair_dp's lane order) +=
 * their probabilities pr[g * pstride + i] times the block's V rows vr, vr + row, ... (i < n). */
AI void pv_block_dp(float *acc_f, const bf16 *vr, int64_t row, const bf16 *pr, int64_t pstride, int heads, int nz,
                    int64_t n, Prefetch *pf) {
    __m512 acc[16];
    for (int i = 0; i < heads * 2 * nz; i++) acc[i] = _mm512_loadu_ps(acc_f + 16 * i);
    for (int64_t i = 0; i < n; i += 2) {
        prefetch_slice(pf);
        pv_pair_dp(acc, vr + i * row, i + 1 < n ? vr + (i + 1) * row : NULL, pr + i, pstride, heads, nz);
    }
    for (int i = 0; i < heads * 2 * nz; i++) _mm512_storeu_ps(acc_f + 16 * i, acc[i]);
}

/* attend_decode_avx512's item (one query token; the qpk query heads of KV heads kvh0 .. kvh0 + nkv - 1) with bf16
 * dot products, in the same three passes a KV block at a time. While the K pass computes a block, the next K
 * block comes into L2, and so does this block's V where the item's whole V is at most 256 KB (a quarter of a
 * Zen 4 core's L2; the P.V pass then reads it from there); otherwise the P.V pass fetches its next block the
 * same way. scores: float32,
 * [heads][seq]; probs: bf16, [heads][seq + 2] (two zeros after the last). */
AI void attend_decode_dp(bf16 *out, const bf16 *q, const History *h, int64_t kvh0, int64_t nkv, int64_t qpk,
                         float scale, float *scores, bf16 *probs, float *acc, float *maxs, int nz) {
    int64_t hs = h->head_size, heads_total = nkv * qpk, seq = h->seq_len, bs = h->block_size, row = h->row;
    int64_t pstride = seq + 2, group = 8 / nz > 1 ? 8 / nz : 1;  /* heads per P.V pass: 16 accumulators at most */
    int64_t chunks = (bs + 15) / 16, groups = (qpk + group - 1) / group, pairs = (bs + 1) / 2;
    int v_early = seq * nkv * hs * (int64_t)sizeof(bf16) <= 256 * 1024;
    const bf16 *kc = h->key_cache, *vc = h->value_cache;
    for (int64_t g = 0; g < heads_total; g++) maxs[g] = -INFINITY;
    Prefetch first = block_rows(h, kc, 0, kvh0, nkv, 1);
    prefetch_slice(&first);
    for (int64_t p0 = 0; p0 < seq; p0 += bs) {
        int64_t n = seq - p0 < bs ? seq - p0 : bs, base = (int64_t)h->blocks[p0 / bs] * bs * row;
        Prefetch next_k = block_rows(h, kc, p0 / bs + 1, kvh0, nkv, chunks * heads_total);
        Prefetch this_v = block_rows(h, vc, v_early ? p0 / bs : -1, kvh0, nkv, chunks * heads_total);
        for (int64_t c0 = 0; c0 < n; c0 += 16) {
            int m = (int)(n - c0 < 16 ? n - c0 : 16);
            __mmask16 mask = (__mmask16)((1u << m) - 1);
            for (int64_t head = 0; head < heads_total; head++) {
                const bf16 *kr = kc + base + c0 * row + (kvh0 + head / qpk) * hs;
                prefetch_slice(&next_k);
                prefetch_slice(&this_v);
                __m512 s = _mm512_mul_ps(nz == 2 ? scores16_dp(q + head * hs, kr, row, m, 2)
                                                 : scores16_dp(q + head * hs, kr, row, m, nz), _mm512_set1_ps(scale));
                _mm512_mask_storeu_ps(scores + head * seq + p0 + c0, mask, s);
                float top = _mm512_mask_reduce_max_ps(mask, s);
                maxs[head] = top > maxs[head] ? top : maxs[head];
            }
        }
    }
    /* softmax: probabilities rounded to bf16 for P.V, their float32 sum kept for the division at the end */
    for (int64_t g = 0; g < heads_total; g++) {
        __m512 total = _mm512_setzero_ps(), mx = _mm512_set1_ps(maxs[g]);
        for (int64_t p = 0; p < seq; p += 16) {
            __mmask16 mask = seq - p >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (seq - p)) - 1);
            __m512 e = _mm512_maskz_mov_ps(mask, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, scores + g * seq + p), mx)));
            total = _mm512_add_ps(total, e);
            _mm256_mask_storeu_epi16(probs + g * pstride + p, mask, (__m256i)_mm512_cvtneps_pbh(e));
        }
        probs[g * pstride + seq] = probs[g * pstride + seq + 1] = 0;
        maxs[heads_total + g] = 1.0f / _mm512_reduce_add_ps(total);
    }
    memset(acc, 0, sizeof(float) * heads_total * hs);
    if (!v_early) {
        first = block_rows(h, vc, 0, kvh0, nkv, 1);
        prefetch_slice(&first);
    }
    for (int64_t p0 = 0; p0 < seq; p0 += bs) {
        int64_t n = seq - p0 < bs ? seq - p0 : bs, base = (int64_t)h->blocks[p0 / bs] * bs * row;
        Prefetch next_v = block_rows(h, vc, v_early ? -1 : p0 / bs + 1, kvh0, nkv, nkv * groups * pairs);
        for (int64_t k = 0; k < nkv; k++)
            for (int64_t g0 = 0; g0 < qpk; g0 += group) {
                int heads = (int)(qpk - g0 < group ? qpk - g0 : group);
                int64_t first_head = k * qpk + g0;
                const bf16 *vr = vc + base + (kvh0 + k) * hs, *pr = probs + first_head * pstride + p0;
                float *a = acc + first_head * hs;
                switch (nz * 8 + heads) {  /* constants, so that the accumulators stay in registers */
                    case 2 * 8 + 1: pv_block_dp(a, vr, row, pr, pstride, 1, 2, n, &next_v); break;
                    case 2 * 8 + 2: pv_block_dp(a, vr, row, pr, pstride, 2, 2, n, &next_v); break;
                    case 2 * 8 + 3: pv_block_dp(a, vr, row, pr, pstride, 3, 2, n, &next_v); break;
                    case 2 * 8 + 4: pv_block_dp(a, vr, row, pr, pstride, 4, 2, n, &next_v); break;
                    case 4 * 8 + 1: pv_block_dp(a, vr, row, pr, pstride, 1, 4, n, &next_v); break;
                    case 4 * 8 + 2: pv_block_dp(a, vr, row, pr, pstride, 2, 4, n, &next_v); break;
                    default: pv_block_dp(a, vr, row, pr, pstride, heads, nz, n, &next_v);
                }
            }
    }
    /* back to dimension order (see pv_pair_dp), divided by each head's sum, rounded to bf16 */
    const __m512i lo_idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi_idx = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t g = 0; g < heads_total; g++) {
        __m512 inv = _mm512_set1_ps(maxs[heads_total + g]);
        for (int z = 0; z < nz; z++) {
            __m512 lo = _mm512_loadu_ps(acc + g * hs + 32 * z), hi = _mm512_loadu_ps(acc + g * hs + 32 * z + 16);
            store16(out, g * hs + 32 * z, _mm512_mul_ps(_mm512_permutex2var_ps(lo, lo_idx, hi), inv), 1);
            store16(out, g * hs + 32 * z + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo, hi_idx, hi), inv), 1);
        }
    }
}
#endif

/* ---- the tile path with AVX-512: packing, then the register-blocked products ------------------------------ */

/* Transpose a 16 x 16 block of 32-bit elements: x[i] holds row i; column j goes to dst + j * stride (the
 * first `cols` columns only). Three rounds of shuffles: 32-bit pairs, 64-bit pairs within each 128-bit
 * lane, then the 128-bit lanes themselves. After round two, u[g][k] holds, in its 128-bit lane L, column
 * 4L + k of rows 4g .. 4g + 3; the last round gathers lane L of u[0..3][k] into column 4L + k. */
AI void transpose16_store(const __m512i x[16], uint32_t *dst, int64_t stride, int cols) {
    __m512i u[4][4];
    for (int g = 0; g < 4; g++) {
        __m512i a = x[4 * g], b = x[4 * g + 1], c = x[4 * g + 2], d = x[4 * g + 3];
        __m512i ab_lo = _mm512_unpacklo_epi32(a, b), ab_hi = _mm512_unpackhi_epi32(a, b);  /* a0 b0 a1 b1 | a2 b2 a3 b3 */
        __m512i cd_lo = _mm512_unpacklo_epi32(c, d), cd_hi = _mm512_unpackhi_epi32(c, d);
        u[g][0] = _mm512_unpacklo_epi64(ab_lo, cd_lo);  /* a0 b0 c0 d0 */
        u[g][1] = _mm512_unpackhi_epi64(ab_lo, cd_lo);  /* a1 b1 c1 d1 */
        u[g][2] = _mm512_unpacklo_epi64(ab_hi, cd_hi);
        u[g][3] = _mm512_unpackhi_epi64(ab_hi, cd_hi);
    }
    for (int k = 0; k < 4; k++) {
        __m512i x0 = _mm512_shuffle_i32x4(u[0][k], u[1][k], 0x44), x1 = _mm512_shuffle_i32x4(u[0][k], u[1][k], 0xEE);
        __m512i y0 = _mm512_shuffle_i32x4(u[2][k], u[3][k], 0x44), y1 = _mm512_shuffle_i32x4(u[2][k], u[3][k], 0xEE);
        __m512i col[4] = {_mm512_shuffle_i32x4(x0, y0, 0x88), _mm512_shuffle_i32x4(x0, y0, 0xDD),
                          _mm512_shuffle_i32x4(x1, y1, 0x88), _mm512_shuffle_i32x4(x1, y1, 0xDD)};
        for (int L = 0; L < 4; L++)
            if (4 * L + k < cols) _mm512_store_si512((__m512i *)(dst + (4 * L + k) * stride), col[L]);
    }
}

/* K tile as float32, transposed: kt[d * TILE_KV + c] = K[p0 + c][d]; positions past n are zero. */
AI void pack_k_f32(float *kt, const History *h, const int64_t *off, int n, int bf) {
    for (int c0 = 0; c0 < TILE_KV; c0 += 16)
        for (int64_t d0 = 0; d0 < h->head_size; d0 += 16) {
            __m512i x[16];
            for (int i = 0; i < 16; i++)
                x[i] = c0 + i < n ? _mm512_castps_si512(load16(h->key_cache, off[c0 + i] + d0, bf)) : _mm512_setzero_si512();
            transpose16_store(x, (uint32_t *)kt + d0 * TILE_KV + c0, TILE_KV, 16);
        }
}

/* V tile as float32 rows: v[c * head_size + d] = V[p0 + c][d], for c < n. */
AI void pack_v_f32(float *v, const History *h, const int64_t *off, int n, int bf) {
    for (int c = 0; c < n; c++)
        for (int64_t d = 0; d < h->head_size; d += 16)
            _mm512_store_ps(v + c * h->head_size + d, load16(h->value_cache, off[c] + d, bf));
}

/* s[r][c] = scale * q_r . K[c] for RB rows and all TILE_KV positions: per dimension d, the KV_VECS vectors
 * of kt (TILE_KV positions) times q_r[d] broadcast, into RB x KV_VECS accumulators. */
AI void scores_f32(float *s, const float *kt, const char *const *q, int64_t hs, float scale, int bf) {
    __m512 acc[RB][KV_VECS];
    for (int r = 0; r < RB; r++)
        for (int j = 0; j < KV_VECS; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hs; d++) {
        __m512 k[KV_VECS];
        for (int j = 0; j < KV_VECS; j++) k[j] = _mm512_load_ps(kt + d * TILE_KV + 16 * j);
        for (int r = 0; r < RB; r++) {
            __m512 qb = _mm512_set1_ps(load(q[r], d, bf));
            for (int j = 0; j < KV_VECS; j++) acc[r][j] = _mm512_fmadd_ps(qb, k[j], acc[r][j]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int j = 0; j < KV_VECS; j++)
            _mm512_store_ps(s + r * TILE_KV + 16 * j, _mm512_mul_ps(acc[r][j], _mm512_set1_ps(scale)));
}

/* Which lanes of score vector j (positions 16j .. 16j + 15 of the tile) a row that sees n positions sees. */
AI __mmask16 seen16(int n, int j) {
    int k = n - 16 * j;
    return k >= 16 ? (__mmask16)0xffff : k <= 0 ? (__mmask16)0 : (__mmask16)((1u << k) - 1);
}

/* e^x for finite x <= 0 to within 3.3e-6 (relative), for probabilities that are rounded to bf16 (2^-8)
 * next: e^x = 2^t, t = x log2(e) = n + f with n an integer and |f| <= 1/2; 2^f by its Taylor series to
 * f^5, 2^n by vscalefps (0 far below). Half the instructions of exp16; masked-off lanes may come out NaN. */
AI __m512 exp16_for_bf16(__m512 x) {
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.3333558e-3f);  /* ln2^5 / 5! */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));  /* ln2^4 / 4! */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));  /* ln2^3 / 3! */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));  /* ln2^2 / 2! */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));  /* ln2 */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* online_softmax on 16 lanes, in three loops so that the core overlaps independent rows: each row's new
 * max, then the rescale factors 16 rows at a time, then each row's exponentials and sum. With `dp` the
 * probabilities are also written as bf16 pairs, pw[r][m] = (p[r][2m], p[r][2m + 1]), for pv_dp. */
AI void online_softmax16(float *s, float *m, float *l, float *alpha, uint32_t *pw, const int *n, int rows, int dp) {
    for (int r = 0; r < rows; r++) {
        __m512 mx = _mm512_set1_ps(-INFINITY);  /* stays -inf where the row sees nothing */
        for (int j = 0; j < KV_VECS; j++)
            mx = _mm512_mask_max_ps(mx, seen16(n[r], j), mx, _mm512_load_ps(s + r * TILE_KV + 16 * j));
        float tile_max = _mm512_reduce_max_ps(mx);
        alpha[r] = m[r];  /* the old max, until the next loop */
        m[r] = tile_max > m[r] ? tile_max : m[r];
    }
    for (int r = 0; r < rows; r += 16) {
        __mmask16 k = rows - r >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (rows - r)) - 1);
        __m512 old = _mm512_maskz_loadu_ps(k, alpha + r), cur = _mm512_maskz_loadu_ps(k, m + r);
        __m512 a = exp16(_mm512_sub_ps(old, cur));
        a = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(old, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), _mm512_setzero_ps());
        a = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(old, cur, _CMP_EQ_OQ), _mm512_set1_ps(1.0f));  /* no growth */
        _mm512_mask_storeu_ps(alpha + r, k, a);
    }
    for (int r = 0; r < rows; r++) {
        __m512 mx = _mm512_set1_ps(m[r]), total = _mm512_setzero_ps(), e[KV_VECS];
        for (int j = 0; j < KV_VECS; j++) {
            e[j] = _mm512_sub_ps(_mm512_load_ps(s + r * TILE_KV + 16 * j), mx);
            e[j] = _mm512_maskz_mov_ps(seen16(n[r], j), dp ? exp16_for_bf16(e[j]) : exp16(e[j]));
            total = _mm512_add_ps(total, e[j]);
        }
        l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(total);
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
        if (dp) {  /* two vectors of probabilities -> 16 bf16 pairs, in order */
            for (int j = 0; j < KV_VECS; j += 2)
                _mm512_store_si512((__m512i *)(pw + r * (TILE_KV / 2) + 8 * j), (__m512i)_mm512_cvtne2ps_pbh(e[j + 1], e[j]));
            continue;
        }
#endif
        (void)pw, (void)dp;
        for (int j = 0; j < KV_VECS; j++) _mm512_store_ps(s + r * TILE_KV + 16 * j, e[j]);
    }
}

/* o[r][0 .. 16 nvc) = o * alpha[r] + sum_c p[r][c] v[c][0 .. 16 nvc) for RB rows (o, v start at the
 * chunk's first dimension; rows head_size apart). */
AI void pv_f32(float *o, const float *p, const float *alpha, const float *v, int n, int64_t hs, int nvc) {
    __m512 acc[RB][4];
    for (int r = 0; r < RB; r++)
        for (int j = 0; j < nvc; j++) acc[r][j] = _mm512_mul_ps(_mm512_load_ps(o + r * hs + 16 * j), _mm512_set1_ps(alpha[r]));
    for (int c = 0; c < n; c++) {
        __m512 vv[4];
        for (int j = 0; j < nvc; j++) vv[j] = _mm512_load_ps(v + c * hs + 16 * j);
        for (int r = 0; r < RB; r++) {
            __m512 w = _mm512_set1_ps(p[r * TILE_KV + c]);
            for (int j = 0; j < nvc; j++) acc[r][j] = _mm512_fmadd_ps(w, vv[j], acc[r][j]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int j = 0; j < nvc; j++) _mm512_store_ps(o + r * hs + 16 * j, acc[r][j]);
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
/* vdpbf16ps: acc lane i += a[2i] * b[2i] + a[2i + 1] * b[2i + 1], each 32-bit lane a pair of bf16. Both
 * products take pairs along the summed index: scores sum over dimensions, so K's 32-bit words (dims
 * 2w, 2w + 1 of one position) are transposed to put positions in lanes; P.V sums over positions, so
 * V is re-paired to put (position 2m, position 2m + 1) of one dimension in each word. */

/* kt[w * TILE_KV + c] = word w of K[p0 + c] (dims 2w, 2w + 1); positions from n to the next multiple of 16 are
 * zero (scores_dp reads no further). With head_size 80 a row is 40 words: blocks of 16, 16 and a last one of 8
 * (a masked load; its columns 8..15 unused). */
AI void pack_k_dp(uint32_t *kt, const History *h, const int64_t *off, int n) {
    int64_t words = h->head_size / 2;
    for (int c0 = 0; c0 < n; c0 += 16)
        for (int64_t w0 = 0; w0 < words; w0 += 16) {
            int cols = (int)(words - w0 < 16 ? words - w0 : 16);
            __mmask16 mask = (__mmask16)((1u << cols) - 1);
            __m512i x[16];
            for (int i = 0; i < 16; i++)
                x[i] = c0 + i < n ? _mm512_maskz_loadu_epi32(mask, (const bf16 *)h->key_cache + off[c0 + i] + 2 * w0)
                                  : _mm512_setzero_si512();
            transpose16_store(x, kt + w0 * TILE_KV + c0, TILE_KV, cols);
        }
}

/* vi[m * head_size + d] = (V[p0 + 2m][d], V[p0 + 2m + 1][d]) as one word, low half first; a position
 * past n is zero. Two rows a, b of 32 bf16 give 32 words: vpermt2w with index 2i -> a[i], 2i + 1 -> b[i]
 * (b's elements are numbered 32..63) for dims 0..15, and a[16 + i], b[16 + i] for dims 16..31. E.g.
 * word 3 of the first = (a[3], b[3]) = (V[2m][d0 + 3], V[2m + 1][d0 + 3]). */
AI void pack_v_dp(uint32_t *vi, const History *h, const int64_t *off, int n) {
    int64_t hs = h->head_size;
    uint16_t lo_idx[32], hi_idx[32];
    for (int i = 0; i < 16; i++) {
        lo_idx[2 * i] = (uint16_t)i, lo_idx[2 * i + 1] = (uint16_t)(32 + i);
        hi_idx[2 * i] = (uint16_t)(16 + i), hi_idx[2 * i + 1] = (uint16_t)(48 + i);
    }
    __m512i lo = _mm512_loadu_si512(lo_idx), hi = _mm512_loadu_si512(hi_idx);
    for (int m = 0; m < (n + 1) / 2; m++)
        for (int64_t d0 = 0; d0 < hs; d0 += 32) {
            int dims = (int)(hs - d0 < 32 ? hs - d0 : 32);  /* 32, or 16 at the end of head_size 80 */
            __mmask32 mask = dims == 32 ? ~(__mmask32)0 : ((__mmask32)1 << dims) - 1;
            const bf16 *vc = (const bf16 *)h->value_cache;
            __m512i a = _mm512_maskz_loadu_epi16(mask, vc + off[2 * m] + d0);
            __m512i b = 2 * m + 1 < n ? _mm512_maskz_loadu_epi16(mask, vc + off[2 * m + 1] + d0) : _mm512_setzero_si512();
            _mm512_store_si512((__m512i *)(vi + m * hs + d0), _mm512_permutex2var_epi16(a, lo, b));
            if (dims > 16) _mm512_store_si512((__m512i *)(vi + m * hs + d0 + 16), _mm512_permutex2var_epi16(a, hi, b));
        }
}

/* scores_f32 with bf16 pairs: per word w (two dims), kt's first nv vectors (the tile's positions up to 16 nv; a
 * short tile leaves the rest of s unwritten, past what any row sees) times q_r's word w broadcast. */
AI void scores_dp(float *s, const uint32_t *kt, const char *const *q, int64_t hs, float scale, int nv) {
    __m512 acc[RB][KV_VECS];
    for (int r = 0; r < RB; r++)
        for (int j = 0; j < nv; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t w = 0; w < hs / 2; w++) {
        __m512bh k[KV_VECS];
        for (int j = 0; j < nv; j++) k[j] = (__m512bh)_mm512_load_si512(kt + w * TILE_KV + 16 * j);
        for (int r = 0; r < RB; r++) {
            uint32_t qw;
            memcpy(&qw, q[r] + 4 * w, sizeof qw);
            __m512bh qb = (__m512bh)_mm512_set1_epi32((int)qw);
            for (int j = 0; j < nv; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], qb, k[j]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int j = 0; j < nv; j++)
            _mm512_store_ps(s + r * TILE_KV + 16 * j, _mm512_mul_ps(acc[r][j], _mm512_set1_ps(scale)));
}

/* pv_f32 with bf16 pairs: pw[r][m] = (p[r][2m], p[r][2m + 1]) broadcast times vi's words of pair m. */
AI void pv_dp(float *o, const uint32_t *pw, const float *alpha, const uint32_t *vi, int pairs, int64_t hs, int nvc) {
    __m512 acc[RB][4];
    for (int r = 0; r < RB; r++)
        for (int j = 0; j < nvc; j++) acc[r][j] = _mm512_mul_ps(_mm512_load_ps(o + r * hs + 16 * j), _mm512_set1_ps(alpha[r]));
    for (int m = 0; m < pairs; m++) {
        __m512bh vv[4];
        for (int j = 0; j < nvc; j++) vv[j] = (__m512bh)_mm512_load_si512(vi + m * hs + 16 * j);
        for (int r = 0; r < RB; r++) {
            __m512bh w = (__m512bh)_mm512_set1_epi32((int)pw[r * (TILE_KV / 2) + m]);
            for (int j = 0; j < nvc; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], w, vv[j]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int j = 0; j < nvc; j++) _mm512_store_ps(o + r * hs + 16 * j, acc[r][j]);
}
#endif /* AVX512_BF16 */
#endif /* __AVX512F__ */

/* ---- one tile item, for every instruction set ------------------------------------------------------------ */

/* P.V for rows [r0, r0 + RB) over dimensions in chunks of up to 4 vectors (64 dims): constant shapes. */
AI void pv_block(const TileBuffers *b, int r0, int n, int64_t hs, int mode) {
    (void)mode;  /* read only where AVX512_BF16 is built in */
#ifdef __AVX512F__
    for (int64_t d0 = 0; d0 < hs; d0 += 64) {
        int nvc = (int)((hs - d0) / 16 < 4 ? (hs - d0) / 16 : 4);
        float *o = b->o + r0 * hs + d0;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
        if (mode == MODE_DP) {
            const uint32_t *pw = b->pw + r0 * (TILE_KV / 2), *vi = (const uint32_t *)b->v + d0;
            switch (nvc) {
                case 4: pv_dp(o, pw, b->alpha + r0, vi, (n + 1) / 2, hs, 4); break;
                case 3: pv_dp(o, pw, b->alpha + r0, vi, (n + 1) / 2, hs, 3); break;
                case 2: pv_dp(o, pw, b->alpha + r0, vi, (n + 1) / 2, hs, 2); break;
                default: pv_dp(o, pw, b->alpha + r0, vi, (n + 1) / 2, hs, 1);
            }
            continue;
        }
#endif
        const float *p = b->s + r0 * TILE_KV, *v = (const float *)b->v + d0;
        switch (nvc) {
            case 4: pv_f32(o, p, b->alpha + r0, v, n, hs, 4); break;
            case 3: pv_f32(o, p, b->alpha + r0, v, n, hs, 3); break;
            case 2: pv_f32(o, p, b->alpha + r0, v, n, hs, 2); break;
            default: pv_f32(o, p, b->alpha + r0, v, n, hs, 1);
        }
    }
#else
    (void)b, (void)r0, (void)n, (void)hs;
#endif
}

/* Row r of an item is token r / heads, head r % heads; tokens sit at positions pos0, pos0 + 1, ...
 * E.g. 3 heads, pos0 = 100, 16 tokens: rows 0-2 are position 100, rows 45-47 position 115. The item reads
 * keys 0..115 in two KV tiles, [0, 64) and [64, 116) (n = 52). In the second, row 0 sees n[0] = 100 - 64
 * + 1 = 37 of its positions and rows 45-47 all 52 (a row sees none of a tile that starts past its
 * position). Rows from `rows` on, padding to a multiple of RB, read row 0's query and see nothing. */
AI void attend_tile(const TileItem *it, TileBuffers *b, float scale, int bf, int mode) {
    const History *h = &it->h;
    int64_t hs = h->head_size, es = elem_size(bf);
    int rows = it->tokens * it->heads, padded = (rows + RB - 1) / RB * RB;
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
        if (mode == MODE_GENERIC) {
            scores_generic(b->s, b->n, rows, b->q, h, b->off, scale, bf);
            online_softmax(b->s, b->m, b->l, b->alpha, b->n, rows);
            pv_generic(b->o, b->s, b->alpha, b->n, rows, h, b->off, bf);
            continue;
        }
#ifdef __AVX512F__
        /* a block of rows is skipped while its last real row (the latest position) sees nothing yet, and computes
         * only the positions that row sees (the block's other rows see no more: their probabilities past it are 0) */
#define BLOCK_SEEN(r0) (b->n[(r0) + RB - 1 < rows ? (r0) + RB - 1 : rows - 1])
#define BLOCK_SEES(r0) (BLOCK_SEEN(r0) > 0)
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
        if (mode == MODE_DP) {
            pack_k_dp(b->kt, h, b->off, n);
            pack_v_dp(b->v, h, b->off, n);
            for (int r0 = 0; r0 < padded; r0 += RB)
                if (BLOCK_SEES(r0)) switch ((BLOCK_SEEN(r0) + 15) / 16) {  /* constants: accumulators in registers */
                    case 1: scores_dp(b->s + r0 * TILE_KV, b->kt, b->q + r0, hs, scale, 1); break;
                    case 2: scores_dp(b->s + r0 * TILE_KV, b->kt, b->q + r0, hs, scale, 2); break;
                    case 3: scores_dp(b->s + r0 * TILE_KV, b->kt, b->q + r0, hs, scale, 3); break;
                    default: scores_dp(b->s + r0 * TILE_KV, b->kt, b->q + r0, hs, scale, KV_VECS);
                }
            online_softmax16(b->s, b->m, b->l, b->alpha, b->pw, b->n, padded, 1);
        }
#endif
        if (mode == MODE_F32) {
            pack_k_f32(b->kt, h, b->off, n, bf);
            pack_v_f32(b->v, h, b->off, n, bf);
            for (int r0 = 0; r0 < padded; r0 += RB)
                if (BLOCK_SEES(r0)) scores_f32(b->s + r0 * TILE_KV, b->kt, b->q + r0, hs, scale, bf);
            online_softmax16(b->s, b->m, b->l, b->alpha, b->pw, b->n, padded, 0);
        }
        for (int r0 = 0; r0 < padded; r0 += RB)
            if (BLOCK_SEES(r0)) pv_block(b, r0, BLOCK_SEEN(r0), hs, mode);
#undef BLOCK_SEES
#undef BLOCK_SEEN
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
    int bf = dtype == DTYPE_BF16, mode = MODE_GENERIC;
#ifdef __AVX512F__
    if (head_size % 16 == 0) mode = MODE_F32;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
    if (head_size % 16 == 0 && bf) mode = MODE_DP;
#endif
#endif
    int64_t tile_tokens = TILE_ROWS / qpk > 0 ? TILE_ROWS / qpk : 1;
    int64_t rows = (tile_tokens * qpk + RB - 1) / RB * RB;
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
     * (attend_decode_avx512); with few, an item per KV head spreads one request over the threads. */
    int whole = 0;
#ifdef __AVX512F__
    whole = head_size % 16 == 0 && head_size <= 16 * MAX_VECS && decodes >= 2 * omp_get_max_threads();
#endif
    int64_t row_heads = whole ? num_heads : qpk > GROUP ? qpk : GROUP;  /* heads one row-path item holds scores for */
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
                    case MODE_DP * 2 + 1: attend_tile(&it, &b, scale, 1, MODE_DP); break;
                    case MODE_F32 * 2 + 1: attend_tile(&it, &b, scale, 1, MODE_F32); break;
                    case MODE_F32 * 2: attend_tile(&it, &b, scale, 0, MODE_F32); break;
                    case MODE_GENERIC * 2 + 1: attend_tile(&it, &b, scale, 1, MODE_GENERIC); break;
                    default: attend_tile(&it, &b, scale, 0, MODE_GENERIC);
                }
                continue;
            }
            for (int64_t t = 0; t < tokens; t++) {
                h.seq_len = pos0 + t + 1;
                const char *qt = q + t * q_stride * es;
                char *ot = o + t * out_stride * es;
#ifdef __AVX512F__
                if (head_size % 16 == 0 && head_size <= 16 * MAX_VECS) {
                    /* whole: item kvh 0 takes the request's every head, the others have nothing left */
                    int64_t nkv = whole ? num_kv_heads : 1;
                    if (whole && kvh != 0) continue;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
                    if (bf && head_size % 32 == 0) {
                        attend_decode_dp((bf16 *)ot, (const bf16 *)qt, &h, kvh, nkv, qpk, scale, scores, probs, acc,
                                         maxs, (int)(head_size / 32));
                        continue;
                    }
#endif
                    if (bf) attend_decode_avx512(ot, qt, &h, kvh, nkv, qpk, scale, scores, acc, maxs, maxs + row_heads, 1);
                    else attend_decode_avx512(ot, qt, &h, kvh, nkv, qpk, scale, scores, acc, maxs, maxs + row_heads, 0);
                    continue;
                }
#endif
                for (int64_t first_head = 0; first_head < qpk; first_head += GROUP) {
                    int heads = (int)(qpk - first_head < GROUP ? qpk - first_head : GROUP);
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

/* Counterpart of vLLM's csrc/cpu/cpu_attn_amx.hpp (its bf16 path, on AMX tiles there): cpu_attn.c's two paths
 * for bf16 where the CPU has AVX512_BF16, both products as vdpbf16ps dot products on pairs of bf16 with float32
 * sums. The probabilities are rounded to bf16 for P.V, as PyTorch's own CPU flash attention does; the softmax's
 * sums stay float32.
 */
#include "cpu_attn_impl.h"
#include "ops.h"

#ifdef HAVE_AVX512_BF16
#include "cpu_attn_avx512.h"

/* ---- the row path: both products as bf16 dot products --------------------------------------------------------
 *
 * The float32 row path (cpu_attn_avx512.c) spends most of its instructions widening bf16 to float32 and on one
 * horizontal sum per score. Here K and V stay bf16 and vdpbf16ps multiplies them a pair of elements at a time:
 *  - a score is the bf16 query's dot product with a K row (float32 sums), times the scale. Sixteen positions'
 *    dot vectors are summed across their lanes together (sum16x16), a few shuffles per score instead of a
 *    horizontal sum each;
 *  - P.V takes positions in pairs: the two V rows interleaved element by element, times each head's two
 *    probabilities rounded to bf16 (as the tile path, and PyTorch's CPU flash attention, do; the softmax's sum
 *    stays float32).
 * For head sizes that are a multiple of 32, at most 256; the float32 row path takes the others. */
#define MAX_BF16_VECS 8 /* 32-element vectors per row: head_size <= 256 */

/* sum16x16's output lane e holds the sum of input slot SUM16_SLOT[e]; the map is its own inverse, so position i of
 * a 16-position chunk goes to slot SUM16_SLOT[i] and its score comes out in lane i. */
static const int SUM16_SLOT[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};

/* The 16 lane sums of v[0..15] in one vector, in four rounds that each halve the vectors by adding a shuffle of
 * two to another: 256-bit halves, then 128-bit lanes, then pairs of floats, then single floats. */
ALWAYS_INLINE __m512 sum16x16(const __m512 v[16]) {
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
ALWAYS_INLINE __m512 scores16_dp(const bf16 *qh, const bf16 *kr, int64_t row, int m, int nz) {
    __m512bh qv[MAX_BF16_VECS];
    __m512 v[16];
    for (int z = 0; z < nz; z++) qv[z] = (__m512bh)_mm512_loadu_si512(qh + 32 * z);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        const bf16 *ki = kr + (i < m ? i : 0) * row;
        __m512 dot = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_loadu_si512(ki), qv[0]);
        for (int z = 1; z < nz; z++) dot = _mm512_dpbf16_ps(dot, (__m512bh)_mm512_loadu_si512(ki + 32 * z), qv[z]);
        v[SUM16_SLOT[i]] = dot;
    }
    return sum16x16(v);
}

/* acc (heads x 2nz vectors) += each head's probability pair at pr[g * pstride] times the V rows va, vb (vb NULL:
 * a zero row), interleaved: lane j of the low vector is element pair (va[d], vb[d]) for d = 32z + 8L + (j % 4),
 * L = j / 4, the high vector d + 4; attend_decode_dp puts the dimensions back in order at the end. */
ALWAYS_INLINE void pv_pair_dp(__m512 *acc, const bf16 *va, const bf16 *vb, const bf16 *pr, int64_t pstride, int heads,
                              int nz) {
    __m512bh lo[MAX_BF16_VECS], hi[MAX_BF16_VECS];
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

ALWAYS_INLINE void prefetch_slice(Prefetch *pf) {
    if (!pf->from) return;
    for (pf->due += pf->total; pf->due >= pf->slices && pf->issued < pf->total; pf->due -= pf->slices, pf->issued++) {
        _mm_prefetch(pf->from + pf->row * pf->stride + pf->line * 64, _MM_HINT_T1);
        if (++pf->line == pf->lines) pf->line = 0, pf->row++;
    }
}

/* Block j of h's history in `cache` (its rows 0 .. n - 1, KV heads kvh0 .. kvh0 + nkv - 1); nothing for j < 0 or
 * past the history. */
ALWAYS_INLINE Prefetch block_rows(const History *h, const bf16 *cache, int64_t j, int64_t kvh0, int64_t nkv,
                                  int64_t slices) {
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
ALWAYS_INLINE void pv_block_dp(float *acc_f, const bf16 *vr, int64_t row, const bf16 *pr, int64_t pstride, int heads,
                               int nz, int64_t n, Prefetch *pf) {
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
ALWAYS_INLINE void attend_decode_dp(bf16 *out, const bf16 *q, const History *h, int64_t kvh0, int64_t nkv, int64_t qpk,
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

/* ---- the tile path: packing into bf16 pairs, then the products ------------------------------------------------ */

/* vdpbf16ps: acc lane i += a[2i] * b[2i] + a[2i + 1] * b[2i + 1], each 32-bit lane a pair of bf16. Both
 * products take pairs along the summed index: scores sum over dimensions, so K's 32-bit words (dims
 * 2w, 2w + 1 of one position) are transposed to put positions in lanes; P.V sums over positions, so
 * V is re-paired to put (position 2m, position 2m + 1) of one dimension in each word. */

/* kt[w * TILE_KV + c] = word w of K[p0 + c] (dims 2w, 2w + 1); positions from n to the next multiple of 16 are
 * zero (scores_dp reads no further). With head_size 80 a row is 40 words: blocks of 16, 16 and a last one of 8
 * (a masked load; its columns 8..15 unused). */
ALWAYS_INLINE void pack_k_dp(uint32_t *kt, const History *h, const int64_t *off, int n) {
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
ALWAYS_INLINE void pack_v_dp(uint32_t *vi, const History *h, const int64_t *off, int n) {
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
ALWAYS_INLINE void scores_dp(float *s, const uint32_t *kt, const char *const *q, int64_t hs, float scale, int nv) {
    __m512 acc[BLOCK_ROWS][TILE_KV_VECS];
    for (int r = 0; r < BLOCK_ROWS; r++)
        for (int j = 0; j < nv; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t w = 0; w < hs / 2; w++) {
        __m512bh k[TILE_KV_VECS];
        for (int j = 0; j < nv; j++) k[j] = (__m512bh)_mm512_load_si512(kt + w * TILE_KV + 16 * j);
        for (int r = 0; r < BLOCK_ROWS; r++) {
            uint32_t qw;
            memcpy(&qw, q[r] + 4 * w, sizeof qw);
            __m512bh qb = (__m512bh)_mm512_set1_epi32((int)qw);
            for (int j = 0; j < nv; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], qb, k[j]);
        }
    }
    for (int r = 0; r < BLOCK_ROWS; r++)
        for (int j = 0; j < nv; j++)
            _mm512_store_ps(s + r * TILE_KV + 16 * j, _mm512_mul_ps(acc[r][j], _mm512_set1_ps(scale)));
}

/* pv_f32 with bf16 pairs: pw[r][m] = (p[r][2m], p[r][2m + 1]) broadcast times vi's words of pair m. */
ALWAYS_INLINE void pv_dp(float *o, const uint32_t *pw, const float *alpha, const uint32_t *vi, int pairs, int64_t hs,
                         int nvc) {
    __m512 acc[BLOCK_ROWS][4];
    for (int r = 0; r < BLOCK_ROWS; r++)
        for (int j = 0; j < nvc; j++) acc[r][j] = _mm512_mul_ps(_mm512_load_ps(o + r * hs + 16 * j), _mm512_set1_ps(alpha[r]));
    for (int m = 0; m < pairs; m++) {
        __m512bh vv[4];
        for (int j = 0; j < nvc; j++) vv[j] = (__m512bh)_mm512_load_si512(vi + m * hs + 16 * j);
        for (int r = 0; r < BLOCK_ROWS; r++) {
            __m512bh w = (__m512bh)_mm512_set1_epi32((int)pw[r * (TILE_KV / 2) + m]);
            for (int j = 0; j < nvc; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], w, vv[j]);
        }
    }
    for (int r = 0; r < BLOCK_ROWS; r++)
        for (int j = 0; j < nvc; j++) _mm512_store_ps(o + r * hs + 16 * j, acc[r][j]);
}

/* ---- the tile path with one KV tile's products ---------------------------------------------------------------- */

/* P.V for rows [r0, r0 + BLOCK_ROWS) over dimensions in chunks of up to 4 vectors (64 dims): constant shapes. */
ALWAYS_INLINE void tile_pv_avx512_bf16(const TileBuffers *b, int r0, int n, int64_t hs) {
    for (int64_t d0 = 0; d0 < hs; d0 += 64) {
        int nvc = (int)((hs - d0) / 16 < 4 ? (hs - d0) / 16 : 4);
        float *o = b->o + r0 * hs + d0;
        const uint32_t *pw = b->pw + r0 * (TILE_KV / 2), *vi = (const uint32_t *)b->v + d0;
        switch (nvc) {
            case 4: pv_dp(o, pw, b->alpha + r0, vi, (n + 1) / 2, hs, 4); break;
            case 3: pv_dp(o, pw, b->alpha + r0, vi, (n + 1) / 2, hs, 3); break;
            case 2: pv_dp(o, pw, b->alpha + r0, vi, (n + 1) / 2, hs, 2); break;
            default: pv_dp(o, pw, b->alpha + r0, vi, (n + 1) / 2, hs, 1);
        }
    }
}

/* ---- what cpu_attn.c calls -------------------------------------------------------------------------------- */

INTERNAL void row_path_avx512_bf16(bf16 *out, const bf16 *q, const History *h, int64_t kvh0, int64_t nkv, int64_t qpk,
                                   float scale, float *scores, bf16 *probs, float *acc, float *maxs, int nz) {
    attend_decode_dp(out, q, h, kvh0, nkv, qpk, scale, scores, probs, acc, maxs, nz);
}

/* One KV tile of n positions for a tile item's `rows` rows (padded to `padded`): pack K (transposed) and V into
 * bf16 pairs, the scores of every block of rows that sees the tile, the online softmax, then P.V. */
INTERNAL void tile_path_avx512_bf16(TileBuffers *b, const History *h, int n, int rows, int padded, float scale) {
    int64_t hs = h->head_size;
    pack_k_dp(b->kt, h, b->off, n);
    pack_v_dp(b->v, h, b->off, n);
    for (int r0 = 0; r0 < padded; r0 += BLOCK_ROWS) {
        int seen = block_seen(b, r0, rows);
        if (seen > 0) switch ((seen + 15) / 16) {  /* constants: accumulators in registers */
            case 1: scores_dp(b->s + r0 * TILE_KV, b->kt, b->q + r0, hs, scale, 1); break;
            case 2: scores_dp(b->s + r0 * TILE_KV, b->kt, b->q + r0, hs, scale, 2); break;
            case 3: scores_dp(b->s + r0 * TILE_KV, b->kt, b->q + r0, hs, scale, 3); break;
            default: scores_dp(b->s + r0 * TILE_KV, b->kt, b->q + r0, hs, scale, TILE_KV_VECS);
        }
    }
    online_softmax16(b->s, b->m, b->l, b->alpha, b->pw, b->n, padded, 1);
    for (int r0 = 0; r0 < padded; r0 += BLOCK_ROWS)
        if (block_seen(b, r0, rows) > 0) tile_pv_avx512_bf16(b, r0, block_seen(b, r0, rows), hs);
}
#endif /* HAVE_AVX512_BF16 */

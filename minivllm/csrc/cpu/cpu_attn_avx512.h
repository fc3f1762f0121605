/* The AVX-512 helpers both vector tile paths share (cpu_attn_avx512.c, cpu_attn_avx512_bf16.c): the 16 x 16
 * transpose that packs a K tile, and the online softmax over a KV tile's scores on 16 lanes. Included only where
 * the build machine has AVX-512. */
#ifndef MINIVLLM_CPU_ATTN_AVX512_H
#define MINIVLLM_CPU_ATTN_AVX512_H

#include "cpu_attn_impl.h"

/* Transpose a 16 x 16 block of 32-bit elements: x[i] holds row i; column j goes to dst + j * stride (the
 * first `cols` columns only). Three rounds of shuffles: 32-bit pairs, 64-bit pairs within each 128-bit
 * lane, then the 128-bit lanes themselves. After round two, u[g][k] holds, in its 128-bit lane L, column
 * 4L + k of rows 4g .. 4g + 3; the last round gathers lane L of u[0..3][k] into column 4L + k. */
ALWAYS_INLINE void transpose16_store(const __m512i x[16], uint32_t *dst, int64_t stride, int cols) {
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

/* Which lanes of score vector j (positions 16j .. 16j + 15 of the tile) a row that sees n positions sees. */
ALWAYS_INLINE __mmask16 seen16(int n, int j) {
    int k = n - 16 * j;
    return k >= 16 ? (__mmask16)0xffff : k <= 0 ? (__mmask16)0 : (__mmask16)((1u << k) - 1);
}

/* e^x for finite x <= 0 to within 3.3e-6 (relative), for probabilities that are rounded to bf16 (2^-8)
 * next: e^x = 2^t, t = x log2(e) = n + f with n an integer and |f| <= 1/2; 2^f by its Taylor series to
 * f^5, 2^n by vscalefps (0 far below). Half the instructions of exp16; masked-off lanes may come out NaN. */
ALWAYS_INLINE __m512 exp16_for_bf16(__m512 x) {
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
ALWAYS_INLINE void online_softmax16(float *s, float *m, float *l, float *alpha, uint32_t *pw, const int *n, int rows,
                                    int dp) {
    for (int r = 0; r < rows; r++) {
        __m512 mx = _mm512_set1_ps(-INFINITY);  /* stays -inf where the row sees nothing */
        for (int j = 0; j < TILE_KV_VECS; j++)
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
        __m512 mx = _mm512_set1_ps(m[r]), total = _mm512_setzero_ps(), e[TILE_KV_VECS];
        for (int j = 0; j < TILE_KV_VECS; j++) {
            e[j] = _mm512_sub_ps(_mm512_load_ps(s + r * TILE_KV + 16 * j), mx);
            e[j] = _mm512_maskz_mov_ps(seen16(n[r], j), dp ? exp16_for_bf16(e[j]) : exp16(e[j]));
            total = _mm512_add_ps(total, e[j]);
        }
        l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(total);
#if defined(HAVE_AVX512_BF16)
        if (dp) {  /* two vectors of probabilities -> 16 bf16 pairs, in order */
            for (int j = 0; j < TILE_KV_VECS; j += 2)
                _mm512_store_si512((__m512i *)(pw + r * (TILE_KV / 2) + 8 * j), (__m512i)_mm512_cvtne2ps_pbh(e[j + 1], e[j]));
            continue;
        }
#endif
        (void)pw, (void)dp;
        for (int j = 0; j < TILE_KV_VECS; j++) _mm512_store_ps(s + r * TILE_KV + 16 * j, e[j]);
    }
}

#endif /* MINIVLLM_CPU_ATTN_AVX512_H */

/* Mirror of vLLM's csrc/cpu/sgl-kernels/gemm.cpp (convert_weight_packed, weight_packed_linear), flattened
 * to csrc/cpu/: a float32 GEMM for decode-sized batches, out [m, n] = x [m, k] @ W^T + bias.
 *
 * Design: a decode step multiplies a few dozen rows by every weight of the model, so its GEMMs
 * are bound by streaming the weights, and a library GEMM tuned for big m leaves bandwidth unused.
 * W [n, k] is repacked once into panels of 32 output columns, [cdiv(n, 32)][k][32], so one panel
 * is read front to back as a single stream. For each panel, rows of x are taken 8 at a time: 8 x 32
 * accumulators live in registers while k runs, each step loading 32 weights once and broadcasting
 * one x value per row. Threads split the panels; a panel re-read for the next 8 rows hits the cache.
 *
 * The scalar tile comes first; with AVX-512 the same tile keeps its accumulators in registers.
 * bfloat16 (below) packs the same panels with k in pairs for AVX512_BF16's dot product.
 * Left out: int8/fp8 weights, AMX tiles, fused activations.
 */
#include "cpu_types.h"
#include "ops.h"

#define PANEL 32
#define ROWS 8

int64_t panel_width(void) { return PANEL; }  /* the packed layout's panel, read by _C.py */

/* Both dtypes' GEMMs: threads split the panels (PANEL_ELEMS elements each); each panel's rows go to the tile
 * ROW_CASES calls, at most MAX_ROWS at a time, with the row count a constant in every case so that the
 * tile's accumulators stay in registers. Expects out, x, packed, bias, m, n, k, x_stride in scope. */
#define PANEL_LOOP(T, MAX_ROWS, PANEL_ELEMS, ROW_CASES)                                                     \
    do {                                                                                                     \
        int64_t panels = (n + PANEL - 1) / PANEL;                                                            \
        _Pragma("omp parallel for schedule(static)")                                                         \
        for (int64_t p = 0; p < panels; p++) {                                                               \
            const T *panel = packed + p * (PANEL_ELEMS), *b = bias ? bias + p * PANEL : NULL;                \
            int64_t cols = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;                                    \
            for (int64_t r0 = 0; r0 < m; r0 += MAX_ROWS) {                                                   \
                T *o = out + r0 * n + p * PANEL;                                                             \
                const T *xr = x + r0 * x_stride;                                                             \
                switch (m - r0 < MAX_ROWS ? m - r0 : MAX_ROWS) { ROW_CASES }                                 \
            }                                                                                                \
        }                                                                                                    \
    } while (0)
#define ROWS_1_TO_8(F) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8)

#ifdef __AVX512F__
/* Which of a panel's two 16-column vectors' lanes hold one of its first `cols` columns. */
ALWAYS_INLINE __mmask16 panel_mask(int64_t cols, int half) {
    int64_t c = cols - 16 * half;
    return c >= 16 ? (__mmask16)0xFFFF : c <= 0 ? (__mmask16)0 : (__mmask16)((1u << c) - 1);
}
#endif

void pack_linear_weight(float *packed, const float *weight, int64_t n, int64_t k) {
    int64_t panels = (n + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++)
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t j = 0; j < PANEL; j++) {
                int64_t col = p * PANEL + j;
                packed[(p * k + kk) * PANEL + j] = col < n ? weight[col * k + kk] : 0.0f;
            }
}

/* One tile: `rows` (<= ROWS) rows of x times one panel, plus bias, into the first `cols` columns of out. */
#ifndef __AVX512F__
ALWAYS_INLINE void linear_tile(float *out, int64_t out_stride, const float *x, int64_t x_stride, const float *panel,
                               int64_t k, const float *bias, int64_t cols, int rows) {
    float acc[ROWS][PANEL] = {{0}};
    for (int64_t kk = 0; kk < k; kk++)
        for (int r = 0; r < rows; r++) {
            float xv = x[r * x_stride + kk];
#pragma omp simd
            for (int j = 0; j < PANEL; j++) acc[r][j] = fmaf(xv, panel[kk * PANEL + j], acc[r][j]);
        }
    for (int r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) out[r * out_stride + j] = acc[r][j] + (bias ? bias[j] : 0.0f);
}
#else
ALWAYS_INLINE void linear_tile(float *out, int64_t out_stride, const float *x, int64_t x_stride, const float *panel,
                               int64_t k, const float *bias, int64_t cols, int rows) {
    __m512 acc[ROWS][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        __m512 w0 = _mm512_loadu_ps(panel + kk * PANEL), w1 = _mm512_loadu_ps(panel + kk * PANEL + 16);
        for (int r = 0; r < rows; r++) {
            __m512 xv = _mm512_set1_ps(x[r * x_stride + kk]);
            acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
        }
    }
    __mmask16 m0 = panel_mask(cols, 0), m1 = panel_mask(cols, 1);
    __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
        _mm512_mask_storeu_ps(out + r * out_stride, m0, _mm512_add_ps(acc[r][0], b0));
        _mm512_mask_storeu_ps(out + r * out_stride + 16, m1, _mm512_add_ps(acc[r][1], b1));
    }
}
#endif

void linear_small_batch(float *out, const float *x, const float *packed, const float *bias, int64_t m, int64_t n,
                        int64_t k, int64_t x_stride) {
#define F32_CASE(R) case R: linear_tile(o, n, xr, x_stride, panel, k, b, cols, R); break;
    PANEL_LOOP(float, ROWS, k * PANEL, ROWS_1_TO_8(F32_CASE));
#undef F32_CASE
}

/* ---- bfloat16: the same panels, with k taken in pairs ---------------------------------------------------------
 *
 * W [n, k] bf16 is packed into [cdiv(n, 32)][cdiv(k, 2)][32][2]: for each k pair, the two weights of each of the
 * panel's 32 columns side by side (an odd k gets a zero partner). With AVX512_BF16 one vdpbf16ps then multiplies 16
 * columns' pairs by a row's pair of x values (broadcast as one 32-bit lane) and adds both products into float32
 * accumulators: 32 multiply-adds per instruction, the weights read once per 12 rows (24 accumulators;
 * benchmarks/decode_gemm.py compares 8 and 12 rows). The output is rounded to bf16 once, after the bias, as
 * oneDNN's bf16 linear does. With AVX-512 but no AVX512_BF16 (Skylake to Ice Lake Xeons) the same panels are
 * widened to float32 in registers (a 16-bit shift for the even k, a mask for the odd one) and multiplied by two
 * FMAs in the order Intel documents for vdpbf16ps (the odd product first; a product of two bf16 values is exact in
 * float32, so each FMA rounds as the dot product does): the weights still stream as bf16, half float32's bytes,
 * which is what a decode step is bound by. Without AVX-512 the plain-C tile computes the same sums (the Python side
 * then keeps bf16 on oneDNN, where that tile would be slower). */

#define ROWS_BF16 12

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define BF16_TILE 2 /* vdpbf16ps */
#elif defined(__AVX512F__) && defined(__AVX512BW__)
#define BF16_TILE 1 /* float32 FMAs on widened weights */
#else
#define BF16_TILE 0 /* plain C */
#endif

int linear_bf16_tile(void) { return BF16_TILE; }  /* which tile is compiled in, for _C.linear_bf16_tile */

void pack_linear_weight_bf16(uint16_t *packed, const uint16_t *weight, int64_t n, int64_t k) {
    int64_t panels = (n + PANEL - 1) / PANEL, pairs = (k + 1) / 2;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++)
        for (int64_t kp = 0; kp < pairs; kp++)
            for (int64_t j = 0; j < PANEL; j++)
                for (int64_t e = 0; e < 2; e++) {
                    int64_t col = p * PANEL + j, kk = 2 * kp + e;
                    packed[((p * pairs + kp) * PANEL + j) * 2 + e] = col < n && kk < k ? weight[col * k + kk] : 0;
                }
}

/* x's pair (kk, kk + 1) of row r as one 32-bit word; the partner of an odd k's last element is zero. */
ALWAYS_INLINE uint32_t x_pair(const uint16_t *x, int64_t kk, int64_t k) {
    return (uint32_t)x[kk] | (kk + 1 < k ? (uint32_t)x[kk + 1] << 16 : 0u);
}

/* How far ahead, in k pairs (128 bytes of panel each), a panel's first row tile prefetches it into L2. */
#define PF_AHEAD 40

#if BF16_TILE > 0
/* A panel's first row tile reads it from memory: it prefetches PF_AHEAD k pairs ahead, into the next panel at its
 * end (they lie back to back; addresses as integers: past the last panel there is no object, and a prefetch never
 * faults). The out-of-order window alone keeps too few lines in flight once a k pair carries 24 products. */
ALWAYS_INLINE void prefetch_panel(const uint16_t *panel, int64_t kp) {
    uintptr_t ahead = (uintptr_t)(panel + kp * 2 * PANEL) + PF_AHEAD * 2 * PANEL * sizeof *panel;
    _mm_prefetch((const char *)ahead, _MM_HINT_T1);
    _mm_prefetch((const char *)(ahead + 64), _MM_HINT_T1);
}

/* A row's pair (2 kp, 2 kp + 1) of x as one 32-bit word: one load where the pair is whole (building it from two
 * halves took five scalar instructions and a GPR-to-vector move per row and k pair). */
ALWAYS_INLINE uint32_t x_word(const uint16_t *xr, int64_t kp, int64_t whole, int64_t k) {
    uint32_t xp;
    if (kp < whole) memcpy(&xp, xr + 2 * kp, sizeof xp);
    else xp = x_pair(xr, 2 * kp, k);
    return xp;
}

/* The tile's float32 sums plus bias, rounded to bf16 once, into the first `cols` columns of `rows` rows. */
ALWAYS_INLINE void store_tile_bf16(uint16_t *out, int64_t out_stride, __m512 acc[][2], const uint16_t *bias,
                                   int64_t cols, int rows) {
    __mmask16 m0 = panel_mask(cols, 0), m1 = panel_mask(cols, 1);
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (bias) {
        b0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m0, bias)), 16));
        b1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m1, bias + 16)), 16));
    }
    for (int r = 0; r < rows; r++) {
        _mm256_mask_storeu_epi16(out + r * out_stride, m0, f32x16_to_bf16(_mm512_add_ps(acc[r][0], b0)));
        _mm256_mask_storeu_epi16(out + r * out_stride + 16, m1, f32x16_to_bf16(_mm512_add_ps(acc[r][1], b1)));
    }
}
#endif

#if BF16_TILE == 2
/* acc + the dot products of 16 columns' weight pairs `w` with a row's x pair `xp`: one vdpbf16ps. */
ALWAYS_INLINE __m512 madd_pair(__m512 acc, uint32_t xp, __m512i w) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)xp), (__m512bh)w);
}
#elif BF16_TILE == 1
/* The same with two FMAs on the pairs widened to float32, the odd product first (as vdpbf16ps adds them). The
 * weights' widening does not depend on the row, so the compiler hoists it out of the tile's row loop. */
ALWAYS_INLINE __m512 madd_pair(__m512 acc, uint32_t xp, __m512i w) {
    const __m512i odd = _mm512_set1_epi32((int)0xffff0000u);  /* a 32-bit lane's upper bf16, as float32 */
    __m512i xv = _mm512_set1_epi32((int)xp);
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(xv, odd)),
                          _mm512_castsi512_ps(_mm512_and_si512(w, odd)), acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(xv, 16)),
                           _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), acc);
}
#endif

#if BF16_TILE > 0
/* `stream`: this is the panel's first row tile, the one that reads it from memory (prefetch_panel). */
ALWAYS_INLINE void linear_tile_bf16(uint16_t *out, int64_t out_stride, const uint16_t *x, int64_t x_stride,
                                    const uint16_t *panel, int64_t k, const uint16_t *bias, int64_t cols, int rows,
                                    int stream) {
    __m512 acc[ROWS_BF16][2];
    int64_t pairs = (k + 1) / 2, whole = k / 2;
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < pairs; kp++) {
        if (stream) prefetch_panel(panel, kp);
        __m512i w0 = _mm512_loadu_si512(panel + kp * 2 * PANEL);
        __m512i w1 = _mm512_loadu_si512(panel + kp * 2 * PANEL + PANEL);
        for (int r = 0; r < rows; r++) {
            uint32_t xp = x_word(x + r * x_stride, kp, whole, k);
            acc[r][0] = madd_pair(acc[r][0], xp, w0);
            acc[r][1] = madd_pair(acc[r][1], xp, w1);
        }
    }
    store_tile_bf16(out, out_stride, acc, bias, cols, rows);
}
#else
ALWAYS_INLINE void linear_tile_bf16(uint16_t *out, int64_t out_stride, const uint16_t *x, int64_t x_stride,
                                    const uint16_t *panel, int64_t k, const uint16_t *bias, int64_t cols, int rows,
                                    int stream) {
    (void)stream;
    float acc[ROWS_BF16][PANEL] = {{0}};
    int64_t pairs = (k + 1) / 2;
    for (int64_t kp = 0; kp < pairs; kp++)
        for (int r = 0; r < rows; r++) {
            uint32_t xp = x_pair(x + r * x_stride, 2 * kp, k);
            float x0 = bf16_to_f32((bf16)(xp & 0xffff)), x1 = bf16_to_f32((bf16)(xp >> 16));
            const uint16_t *w = panel + kp * 2 * PANEL;
            for (int j = 0; j < PANEL; j++)
                acc[r][j] += x0 * bf16_to_f32(w[2 * j]) + x1 * bf16_to_f32(w[2 * j + 1]);
        }
    for (int r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++)
            out[r * out_stride + j] = f32_to_bf16(acc[r][j] + (bias ? bf16_to_f32(bias[j]) : 0.0f));
}
#endif

void linear_small_batch_bf16(uint16_t *out, const uint16_t *x, const uint16_t *packed, const uint16_t *bias,
                             int64_t m, int64_t n, int64_t k, int64_t x_stride) {
#define BF16_CASE(R) case R: linear_tile_bf16(o, n, xr, x_stride, panel, k, b, cols, R, r0 == 0); break;
    PANEL_LOOP(uint16_t, ROWS_BF16, (k + 1) / 2 * 2 * PANEL, ROWS_1_TO_8(BF16_CASE) BF16_CASE(9) BF16_CASE(10)
               BF16_CASE(11) BF16_CASE(12));
#undef BF16_CASE
}

/* Mirror of vLLM's csrc/cpu/layernorm.cpp: RMSNorm, plain and with the residual add fused in.
 *
 * One row per token: the mean of squares, then weight * (x * rsqrt) rounded as HF rounds it. A plain
 * loop first, then (with AVX-512) the same row 16 lanes at a time, the same bits (checked on 300 rows of
 * scales 1e-3 to 1e3, hidden 64, 576 and 577, against the loop). Left out: LayerNorm
 * (OPT's runs in PyTorch), the variants with quantized outputs.
 */
#include "cpu_types.h"
#include "ops.h"

/* x[from .. hidden)'s squares summed in double: exact enough to be order-independent, so they are summed in
 * vector lanes (a serial sum: 4 cycles an element). */
ALWAYS_INLINE double sum_squares(const void *x, int64_t from, int64_t hidden, int bf) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = from; i < hidden; i++) {
        double v = load(x, i, bf);
        sum += v * v;
    }
    return sum;
}

ALWAYS_INLINE float rms_inv(double sum, int64_t hidden, float eps) {
    return 1.0f / sqrtf((float)(sum / (double)hidden) + eps);
}

/* out[from .. hidden) = weight * (x * inv), rounded as HF's weight * (x * rsqrt).to(dtype). */
ALWAYS_INLINE void scale_row(void *out, const void *x, const void *weight, int64_t from, int64_t hidden, float inv,
                             int bf) {
#pragma omp simd
    for (int64_t i = from; i < hidden; i++) store(out, i, load(weight, i, bf) * rnd(load(x, i, bf) * inv, bf), bf);
}

ALWAYS_INLINE void rms_norm_row(void *out, const void *x, const void *weight, int64_t hidden, float eps, int bf) {
    scale_row(out, x, weight, 0, hidden, rms_inv(sum_squares(x, 0, hidden, bf), hidden, eps), bf);
}

#ifdef __AVX512F__
/* rms_norm_row 16 lanes at a time: the squares summed in double in two vectors of 8 (so the sum may differ from
 * the loop's in its last bits, far below float's), the scaling the loop's operations in the same order; the
 * row's tail (hidden not a multiple of 16) by the loops. */
ALWAYS_INLINE void rms_norm_row16(void *out, const void *x, const void *weight, int64_t hidden, float eps, int bf) {
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    int64_t whole = hidden / 16 * 16;
    for (int64_t i = 0; i < whole; i += 16) {
        __m512 v = load16(x, i, bf);
        __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        lo = _mm512_add_pd(lo, _mm512_mul_pd(a, a));
        hi = _mm512_add_pd(hi, _mm512_mul_pd(b, b));
    }
    float inv = rms_inv(_mm512_reduce_add_pd(_mm512_add_pd(lo, hi)) + sum_squares(x, whole, hidden, bf), hidden, eps);
    __m512 vinv = _mm512_set1_ps(inv);
    for (int64_t i = 0; i < whole; i += 16)
        store16(out, i, _mm512_mul_ps(load16(weight, i, bf), rnd16(_mm512_mul_ps(load16(x, i, bf), vinv), bf)), bf);
    scale_row(out, x, weight, whole, hidden, inv, bf);
}
#define RMS_ROW rms_norm_row16
#else
#define RMS_ROW rms_norm_row
#endif

/* out[t] = rms_norm(x[t]) * weight; x rows `x_stride` apart, out contiguous [num_tokens, hidden]. */
void rms_norm(void *out, const void *x, const void *weight, int64_t num_tokens, int64_t hidden,
              int64_t x_stride, float eps, int dtype) {
    int64_t es = elem_size(dtype == DTYPE_BF16);
#pragma omp parallel for schedule(static) if (num_tokens > 1)
    for (int64_t t = 0; t < num_tokens; t++) {
        void *o = (char *)out + t * hidden * es;
        const void *xr = (const char *)x + t * x_stride * es;
        if (dtype == DTYPE_BF16) RMS_ROW(o, xr, weight, hidden, eps, 1);
        else RMS_ROW(o, xr, weight, hidden, eps, 0);
    }
}

ALWAYS_INLINE void add_rms_norm_row(void *x, void *residual, const void *weight, int64_t hidden, float eps, int bf) {
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= hidden; i += 16) store16(residual, i, _mm512_add_ps(load16(residual, i, bf), load16(x, i, bf)), bf);
#endif
#pragma omp simd
    for (int64_t j = i; j < hidden; j++) store(residual, j, load(residual, j, bf) + load(x, j, bf), bf);
    RMS_ROW(x, residual, weight, hidden, eps, bf);
}

/* In place, both contiguous [num_tokens, hidden]: residual = x + residual; x = rms_norm(residual) * weight. */
void fused_add_rms_norm(void *x, void *residual, const void *weight, int64_t num_tokens, int64_t hidden,
                        float eps, int dtype) {
    int64_t es = elem_size(dtype == DTYPE_BF16);
#pragma omp parallel for schedule(static) if (num_tokens > 1)
    for (int64_t t = 0; t < num_tokens; t++) {
        char *xr = (char *)x + t * hidden * es, *rr = (char *)residual + t * hidden * es;
        if (dtype == DTYPE_BF16) add_rms_norm_row(xr, rr, weight, hidden, eps, 1);
        else add_rms_norm_row(xr, rr, weight, hidden, eps, 0);
    }
}

/* Mirror of vLLM's csrc/cpu/activation.cpp: SiluAndMul, the gated MLP's activation.
 *
 * silu(g) = g / (1 + e^-g) with cpu_types.h's exp_f32, so that `omp simd` vectorizes the row; each
 * step rounded to the dtype as HF's act_fn(gate) * up rounds it. Left out: GeLU and the other gates.
 */
#include "cpu_types.h"
#include "ops.h"

ALWAYS_INLINE void silu_and_mul_row(void *out, const void *gate, const void *up, int64_t d, int bf) {
#pragma omp simd
    for (int64_t i = 0; i < d; i++) {  /* HF: act_fn(gate) * up, each op rounded to the dtype */
        float g = load(gate, i, bf);
        store(out, i, rnd(g / (1.0f + exp_f32(-g)), bf) * load(up, i, bf), bf);
    }
}

#ifdef __AVX512F__
/* The same row 16 lanes at a time (exp16 is exp_f32's operations in the same order, so the same bits). */
ALWAYS_INLINE void silu_and_mul_row16(void *out, const void *gate, const void *up, int64_t d, int bf) {
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m512 g = load16(gate, i, bf), one = _mm512_set1_ps(1.0f);
        __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        store16(out, i, _mm512_mul_ps(rnd16(s, bf), load16(up, i, bf)), bf);
    }
    if (i < d) silu_and_mul_row((char *)out + i * elem_size(bf), (const char *)gate + i * elem_size(bf),
                                (const char *)up + i * elem_size(bf), d - i, bf);
}
#endif

/* out [num_tokens, d] = silu(x[:, :d]) * x[:, d:], x contiguous [num_tokens, 2d]; silu(g) = g / (1 + e^-g). */
void silu_and_mul(void *out, const void *x, int64_t num_tokens, int64_t d, int dtype) {
    int64_t es = elem_size(dtype == DTYPE_BF16);
#pragma omp parallel for schedule(static) if (num_tokens > 1)
    for (int64_t t = 0; t < num_tokens; t++) {
        const char *gate = (const char *)x + t * 2 * d * es, *up = gate + d * es;
        char *o = (char *)out + t * d * es;
#ifdef __AVX512F__
        if (dtype == DTYPE_BF16) silu_and_mul_row16(o, gate, up, d, 1);
        else silu_and_mul_row16(o, gate, up, d, 0);
#else
        if (dtype == DTYPE_BF16) silu_and_mul_row(o, gate, up, d, 1);
        else silu_and_mul_row(o, gate, up, d, 0);
#endif
    }
}

/* Mirror of vLLM's csrc/cpu/pos_encoding.cpp: the neox-style rotary embedding, in place.
 *
 * Every head of q and k rotated by its token's cos/sin row, each multiply and add rounded to the
 * dtype as HF's x * cos + rotate_half(x) * sin, so float32 gives torch's bits exactly.
 * Left out: the GPT-J (interleaved) style, partial rotary dims, rope scaling inside the kernel.
 */
#include "cpu_types.h"
#include "ops.h"

ALWAYS_INLINE void rotate_head(void *x, const void *c, const void *s, int64_t half, int bf) {
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {  /* HF: x * cos + rotate_half(x) * sin, each op rounded */
        float x1 = load(x, i, bf), x2 = load(x, i + half, bf);
        store(x, i, rnd(x1 * load(c, i, bf), bf) - rnd(x2 * load(s, i, bf), bf), bf);
        store(x, i + half, rnd(x2 * load(c, i + half, bf), bf) + rnd(x1 * load(s, i + half, bf), bf), bf);
    }
}

#ifdef __AVX512F__
/* rotate_head 16 lanes at a time (half a multiple of 16), the same operations in the same order: the same bits. */
ALWAYS_INLINE void rotate_head16(void *x, const void *c, const void *s, int64_t half, int bf) {
    for (int64_t i = 0; i < half; i += 16) {
        __m512 x1 = load16(x, i, bf), x2 = load16(x, i + half, bf);
        store16(x, i, _mm512_sub_ps(rnd16(_mm512_mul_ps(x1, load16(c, i, bf)), bf),
                                    rnd16(_mm512_mul_ps(x2, load16(s, i, bf)), bf)), bf);
        store16(x, i + half, _mm512_add_ps(rnd16(_mm512_mul_ps(x2, load16(c, i + half, bf)), bf),
                                           rnd16(_mm512_mul_ps(x1, load16(s, i + half, bf)), bf)), bf);
    }
}
#endif

/* For token t at positions[t], every head of q and k (rows q_stride / k_stride apart, heads
 * contiguous) becomes x * cos + rotate_half(x) * sin, with cos/sin rows [max_position, head_size]. */
void rotary_embedding(const int64_t *positions, void *q, void *k, const void *cos_cache, const void *sin_cache,
                      int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                      int64_t q_stride, int64_t k_stride, int dtype) {
    int64_t half = head_size / 2, es = elem_size(dtype == DTYPE_BF16);
#pragma omp parallel for schedule(static) if (num_tokens > 1)
    for (int64_t t = 0; t < num_tokens; t++) {
        const char *c = (const char *)cos_cache + positions[t] * head_size * es;
        const char *s = (const char *)sin_cache + positions[t] * head_size * es;
        for (int64_t h = 0; h < num_heads + num_kv_heads; h++) {
            char *x = h < num_heads ? (char *)q + (t * q_stride + h * head_size) * es
                                    : (char *)k + (t * k_stride + (h - num_heads) * head_size) * es;
#ifdef __AVX512F__
            if (half % 16 == 0) {
                if (dtype == DTYPE_BF16) rotate_head16(x, c, s, half, 1);
                else rotate_head16(x, c, s, half, 0);
                continue;
            }
#endif
            if (dtype == DTYPE_BF16) rotate_head(x, c, s, half, 1);
            else rotate_head(x, c, s, half, 0);
        }
    }
}

/* minivllm's compiled CPU ops: the counterpart of vLLM's csrc/cpu/ (layernorm, activation,
 * pos_encoding, paged attention), built on first use by minivllm/_C.py and called through ctypes.
 *
 * Plain C11 + OpenMP. Every function takes raw pointers, sizes and row strides (in elements) and,
 * where it serves both, a `dtype` (DTYPE_F32 or DTYPE_BF16, vLLM's VLLM_DISPATCH_FLOATING_TYPES in
 * one int); the Python wrappers check dtypes and shapes. Nothing here knows of requests.
 *
 * bfloat16: tensors hold bf16, arithmetic runs in float32 and each result is rounded back to bf16
 * (round to nearest even) wherever PyTorch's own bf16 ops round, so the elementwise ops give HF's
 * bf16 bits. Each op's row loop is one always_inline function called with a constant `bf`, so the
 * compiler emits a float32 and a bf16 copy and no per-element branch. With AVX512_BF16 the bf16
 * rounding is the vcvtneps2bf16 instruction; without it, integer arithmetic gives the same bits.
 *
 * Numerics: the file is compiled with -ffp-contract=off, so `a * b + c` rounds twice, exactly as
 * torch's separate elementwise kernels do; fmaf() is written out where a fused multiply-add is
 * wanted (dot products, the exp polynomial). -fno-trapping-math only lets gcc vectorize floorf.
 * Left out: fp16, bf16 in the small-batch linear (bf16 GEMMs go to oneDNN), quantized caches, ALiBi,
 * sliding windows, soft-capping.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#define DTYPE_F32 0
#define DTYPE_BF16 1
typedef uint16_t bf16;

AI float bf16_to_f32(bf16 v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as torch's float -> bfloat16; a NaN stays a (quiet) NaN. */
AI bf16 f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
    return (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Element i of a float32 or bf16 array, as float; `bf` is a constant wherever these inline. */
AI float load(const void *p, int64_t i, int bf) { return bf ? bf16_to_f32(((const bf16 *)p)[i]) : ((const float *)p)[i]; }
AI void store(void *p, int64_t i, float v, int bf) {
    if (bf) ((bf16 *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}
/* What one PyTorch op in this dtype leaves behind: v itself in float32, v rounded to bf16 in bf16. */
AI float rnd(float v, int bf) { return bf ? bf16_to_f32(f32_to_bf16(v)) : v; }
AI int64_t elem_size(int bf) { return bf ? 2 : 4; }

/* e^x in float32 to about 1 ulp, written so that gcc vectorizes it inside `omp simd` loops:
 * x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two for an exact product), e^r by a degree-6
 * polynomial, 2^n put straight into the exponent bits. Inputs are clamped to [-87.3, 88.7]. */
AI float exp_f32(float x) {
    x = x < -87.3f ? -87.3f : x > 88.7f ? 88.7f : x;  /* not fminf/fmaxf: those stay scalar libm calls */
    float n = floorf(fmaf(x, 1.44269504088896341f, 0.5f));
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);  /* folded by the compiler into a register move */
    return p * scale;
}

/* ---- layernorm.cpp: RMSNorm, plain and with the residual add fused in ---------------------- */

AI void rms_norm_row(void *out, const void *x, const void *weight, int64_t hidden, float eps, int bf) {
    double sum = 0.0;  /* mean of squares accumulated in double: exact enough to be order-independent */
    for (int64_t i = 0; i < hidden; i++) {
        double v = load(x, i, bf);
        sum += v * v;
    }
    float variance = (float)(sum / (double)hidden);
    float inv = 1.0f / sqrtf(variance + eps);
#pragma omp simd
    for (int64_t i = 0; i < hidden; i++)  /* HF: weight * (x * rsqrt).to(dtype) */
        store(out, i, load(weight, i, bf) * rnd(load(x, i, bf) * inv, bf), bf);
}

/* out[t] = rms_norm(x[t]) * weight; x rows `x_stride` apart, out contiguous [num_tokens, hidden]. */
void rms_norm(void *out, const void *x, const void *weight, int64_t num_tokens, int64_t hidden,
              int64_t x_stride, float eps, int dtype) {
    int64_t es = elem_size(dtype == DTYPE_BF16);
#pragma omp parallel for schedule(static) if (num_tokens > 1)
    for (int64_t t = 0; t < num_tokens; t++) {
        void *o = (char *)out + t * hidden * es;
        const void *xr = (const char *)x + t * x_stride * es;
        if (dtype == DTYPE_BF16) rms_norm_row(o, xr, weight, hidden, eps, 1);
        else rms_norm_row(o, xr, weight, hidden, eps, 0);
    }
}

AI void add_rms_norm_row(void *x, void *residual, const void *weight, int64_t hidden, float eps, int bf) {
#pragma omp simd
    for (int64_t i = 0; i < hidden; i++) store(residual, i, load(residual, i, bf) + load(x, i, bf), bf);
    rms_norm_row(x, residual, weight, hidden, eps, bf);
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

/* ---- activation.cpp: SiluAndMul ------------------------------------------------------------ */

AI void silu_and_mul_row(void *out, const void *gate, const void *up, int64_t d, int bf) {
#pragma omp simd
    for (int64_t i = 0; i < d; i++) {  /* HF: act_fn(gate) * up, each op rounded to the dtype */
        float g = load(gate, i, bf);
        store(out, i, rnd(g / (1.0f + exp_f32(-g)), bf) * load(up, i, bf), bf);
    }
}

/* out [num_tokens, d] = silu(x[:, :d]) * x[:, d:], x contiguous [num_tokens, 2d]; silu(g) = g / (1 + e^-g). */
void silu_and_mul(void *out, const void *x, int64_t num_tokens, int64_t d, int dtype) {
    int64_t es = elem_size(dtype == DTYPE_BF16);
#pragma omp parallel for schedule(static) if (num_tokens > 1)
    for (int64_t t = 0; t < num_tokens; t++) {
        const char *gate = (const char *)x + t * 2 * d * es, *up = gate + d * es;
        char *o = (char *)out + t * d * es;
        if (dtype == DTYPE_BF16) silu_and_mul_row(o, gate, up, d, 1);
        else silu_and_mul_row(o, gate, up, d, 0);
    }
}

/* ---- pos_encoding.cpp: neox-style rotary embedding, in place ------------------------------- */

AI void rotate_head(void *x, const void *c, const void *s, int64_t half, int bf) {
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {  /* HF: x * cos + rotate_half(x) * sin, each op rounded */
        float x1 = load(x, i, bf), x2 = load(x, i + half, bf);
        store(x, i, rnd(x1 * load(c, i, bf), bf) - rnd(x2 * load(s, i, bf), bf), bf);
        store(x, i + half, rnd(x2 * load(c, i + half, bf), bf) + rnd(x1 * load(s, i + half, bf), bf), bf);
    }
}

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
            if (dtype == DTYPE_BF16) rotate_head(x, c, s, half, 1);
            else rotate_head(x, c, s, half, 0);
        }
    }
}

/* ---- cache.cpp: write this step's K/V into the paged cache -------------------------------- */

/* Token t's K and V rows (num_kv_heads * head_size elements each, `key_stride` / `value_stride`
 * apart) go to slot slot_mapping[t] = block * block_size + offset of caches laid out [num_slots, row];
 * a negative slot (padding) is skipped. A copy: float32 and bf16 differ only in the element size. */
void reshape_and_cache(const void *key, const void *value, void *key_cache, void *value_cache,
                       const int64_t *slot_mapping, int64_t num_tokens, int64_t row, int64_t key_stride,
                       int64_t value_stride, int dtype) {
    int64_t es = elem_size(dtype == DTYPE_BF16);
#pragma omp parallel for schedule(static) if (num_tokens > 64)
    for (int64_t t = 0; t < num_tokens; t++) {
        int64_t slot = slot_mapping[t];
        if (slot < 0) continue;
        memcpy((char *)key_cache + slot * row * es, (const char *)key + t * key_stride * es, es * row);
        memcpy((char *)value_cache + slot * row * es, (const char *)value + t * value_stride * es, es * row);
    }
}

/* ---- cpu_attn: paged attention, every query token of the step in one call ------------------ */

/* Design: one work item = (query token, KV head, a group of up to 4 of the query heads that share
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
 */
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
#include <immintrin.h>
#define MAX_VECS 16 /* head_size <= 256 */

/* 16 elements from i on, as float32: bf16 widened by a 16-bit shift (exact). */
AI __m512 load16(const void *p, int64_t i, int bf) {
    if (!bf) return _mm512_loadu_ps((const float *)p + i);
    __m256i raw = _mm256_loadu_si256((const __m256i *)((const bf16 *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

AI void store16(void *p, int64_t i, __m512 v, int bf) {
    if (!bf) {
        _mm512_storeu_ps((float *)p + i, v);
        return;
    }
#ifdef __AVX512BF16__
    __m256i r = (__m256i)_mm512_cvtneps_pbh(v);  /* round to nearest even in one instruction */
#else
    __m512i u = _mm512_castps_si512(v);  /* f32_to_bf16, 16 lanes at once */
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nan);
    __m256i r = _mm512_cvtepi32_epi16(rounded);
#endif
    _mm256_storeu_si256((__m256i *)((bf16 *)p + i), r);
}

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

/* ---- small-batch linear: out [m, n] = x [m, k] @ W^T + bias, for decode-sized m ------------- */

/* Design: a decode step multiplies a few dozen rows by every weight of the model, so its GEMMs
 * are bound by streaming the weights, and a library GEMM tuned for big m leaves bandwidth unused.
 * W [n, k] is repacked once into panels of 32 output columns, [cdiv(n, 32)][k][32], so one panel
 * is read front to back as a single stream. For each panel, rows of x are taken 8 at a time: 8 x 32
 * accumulators live in registers while k runs, each step loading 32 weights once and broadcasting
 * one x value per row. Threads split the panels; a panel re-read for the next 8 rows hits the cache. */
#define PANEL 32
#define ROWS 8

int64_t panel_width(void) { return PANEL; }  /* the packed layout's panel, read by _C.py */

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

#ifdef __AVX512F__
static inline __attribute__((always_inline)) void linear_tile(float *out, int64_t out_stride, const float *x,
                                                               int64_t x_stride, const float *panel, int64_t k,
                                                               const float *bias, int64_t cols, int rows) {
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
    __mmask16 m0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    __mmask16 m1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
        _mm512_mask_storeu_ps(out + r * out_stride, m0, _mm512_add_ps(acc[r][0], b0));
        _mm512_mask_storeu_ps(out + r * out_stride + 16, m1, _mm512_add_ps(acc[r][1], b1));
    }
}
#else
static inline __attribute__((always_inline)) void linear_tile(float *out, int64_t out_stride, const float *x,
                                                               int64_t x_stride, const float *panel, int64_t k,
                                                               const float *bias, int64_t cols, int rows) {
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
#endif

void linear_small_batch(float *out, const float *x, const float *packed, const float *bias, int64_t m, int64_t n,
                        int64_t k, int64_t x_stride) {
    int64_t panels = (n + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        const float *panel = packed + p * k * PANEL, *b = bias ? bias + p * PANEL : NULL;
        int64_t cols = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
        for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
            float *o = out + r0 * n + p * PANEL;
            const float *xr = x + r0 * x_stride;
            switch (m - r0 < ROWS ? m - r0 : ROWS) {  /* constant row counts let the tile stay in registers */
                case 1: linear_tile(o, n, xr, x_stride, panel, k, b, cols, 1); break;
                case 2: linear_tile(o, n, xr, x_stride, panel, k, b, cols, 2); break;
                case 3: linear_tile(o, n, xr, x_stride, panel, k, b, cols, 3); break;
                case 4: linear_tile(o, n, xr, x_stride, panel, k, b, cols, 4); break;
                case 5: linear_tile(o, n, xr, x_stride, panel, k, b, cols, 5); break;
                case 6: linear_tile(o, n, xr, x_stride, panel, k, b, cols, 6); break;
                case 7: linear_tile(o, n, xr, x_stride, panel, k, b, cols, 7); break;
                default: linear_tile(o, n, xr, x_stride, panel, k, b, cols, 8); break;
            }
        }
    }
}

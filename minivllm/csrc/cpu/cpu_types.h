/* Mirror of vLLM's csrc/cpu/cpu_types.hpp: what every compiled CPU op of minivllm shares.
 *
 * Plain C11 + OpenMP. Every op takes raw pointers, sizes and row strides (in elements) and,
 * where it serves both, a `dtype` (DTYPE_F32 or DTYPE_BF16, vLLM's VLLM_DISPATCH_FLOATING_TYPES in
 * one int); the Python wrappers (minivllm/_C.py) check dtypes and shapes. Nothing here knows of requests.
 *
 * bfloat16: tensors hold bf16, arithmetic runs in float32 and each result is rounded back to bf16
 * (round to nearest even) wherever PyTorch's own bf16 ops round, so the elementwise ops give HF's
 * bf16 bits. Each op's row loop is one always_inline function called with a constant `bf`, so the
 * compiler emits a float32 and a bf16 copy and no per-element branch. With AVX512_BF16 the bf16
 * rounding is the vcvtneps2bf16 instruction; without it, integer arithmetic gives the same bits.
 *
 * Numerics: every file is compiled with -ffp-contract=off, so `a * b + c` rounds twice, exactly as
 * torch's separate elementwise kernels do; fmaf() is written out where a fused multiply-add is
 * wanted (dot products, the exp polynomial). -fno-trapping-math only lets gcc vectorize floorf.
 * The instruction set is the build machine's (-march=native): the AVX-512 helpers below exist only
 * where the CPU has AVX-512, and each op's scalar path, written first, serves everywhere else.
 * Left out: vLLM's vector classes per ISA (FP32Vec16, BF16Vec16, ...), fp16, fp8.
 */
#ifndef MINIVLLM_CPU_TYPES_H
#define MINIVLLM_CPU_TYPES_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define DTYPE_F32 0
#define DTYPE_BF16 1
typedef uint16_t bf16;

ALWAYS_INLINE float bf16_to_f32(bf16 v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as torch's float -> bfloat16; a NaN stays a (quiet) NaN. */
ALWAYS_INLINE bf16 f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
    return (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Element i of a float32 or bf16 array, as float; `bf` is a constant wherever these inline. */
ALWAYS_INLINE float load(const void *p, int64_t i, int bf) {
    return bf ? bf16_to_f32(((const bf16 *)p)[i]) : ((const float *)p)[i];
}
ALWAYS_INLINE void store(void *p, int64_t i, float v, int bf) {
    if (bf) ((bf16 *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}
/* What one PyTorch op in this dtype leaves behind: v itself in float32, v rounded to bf16 in bf16. */
ALWAYS_INLINE float rnd(float v, int bf) { return bf ? bf16_to_f32(f32_to_bf16(v)) : v; }
ALWAYS_INLINE int64_t elem_size(int bf) { return bf ? 2 : 4; }

/* e^x in float32 to about 1 ulp, written so that gcc vectorizes it inside `omp simd` loops:
 * x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two for an exact product), e^r by a degree-6
 * polynomial, 2^n put straight into the exponent bits. Inputs are clamped to [-87.3, 88.7]. */
ALWAYS_INLINE float exp_f32(float x) {
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

/* AVX-512, where the build machine has it: 16 floats per register, for the vector paths of
 * cpu_attn_avx512*.c and gemm.c (the elementwise ops rely on `omp simd` instead). */
#ifdef __AVX512F__
#include <immintrin.h>

/* 16 elements from i on, as float32: bf16 widened by a 16-bit shift (exact). */
ALWAYS_INLINE __m512 load16(const void *p, int64_t i, int bf) {
    if (!bf) return _mm512_loadu_ps((const float *)p + i);
    __m256i raw = _mm256_loadu_si256((const __m256i *)((const bf16 *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

/* 16 floats rounded to bf16 (round to nearest even; a NaN stays a quiet NaN), as f32_to_bf16 does one. */
ALWAYS_INLINE __m256i f32x16_to_bf16(__m512 v) {
#ifdef __AVX512BF16__
    return (__m256i)_mm512_cvtneps_pbh(v);  /* round to nearest even in one instruction */
#else
    __m512i u = _mm512_castps_si512(v);  /* f32_to_bf16, 16 lanes at once */
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nan);
    return _mm512_cvtepi32_epi16(rounded);
#endif
}

ALWAYS_INLINE void store16(void *p, int64_t i, __m512 v, int bf) {
    if (bf) _mm256_storeu_si256((__m256i *)((bf16 *)p + i), f32x16_to_bf16(v));
    else _mm512_storeu_ps((float *)p + i, v);
}

/* rnd on 16 lanes: v in float32, v rounded to bf16 (and widened back, exactly) in bf16. */
ALWAYS_INLINE __m512 rnd16(__m512 v, int bf) {
    return bf ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(f32x16_to_bf16(v)), 16)) : v;
}

/* exp_f32 on 16 lanes, the same operations in the same order (so the same bits). */
ALWAYS_INLINE __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

#endif /* __AVX512F__ */

#endif /* MINIVLLM_CPU_TYPES_H */

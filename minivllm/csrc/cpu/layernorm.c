/* Mirror of vLLM's csrc/cpu/layernorm.cpp: RMSNorm, plain and with the residual add fused in.
 *
 * One row per token: the mean of squares, then weight * (x * rsqrt) rounded as HF rounds it. A plain
 * loop (`omp simd` vectorizes the scaling); there is no separate vector path. Left out: LayerNorm
 * (OPT's runs in PyTorch), the variants with quantized outputs.
 */
#include "cpu_types.h"
#include "ops.h"

AI void rms_norm_row(void *out, const void *x, const void *weight, int64_t hidden, float eps, int bf) {
    double sum = 0.0;  /* mean of squares accumulated in double: exact enough to be order-independent, so */
#pragma omp simd reduction(+ : sum)  /* it is summed in vector lanes (a serial sum: 4 cycles an element) */
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

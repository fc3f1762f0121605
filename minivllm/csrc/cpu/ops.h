/* Counterpart of vLLM's csrc/ops.h: every function the compiled CPU library exports, one prototype each.
 *
 * Each .c file includes this header, so the compiler holds each definition to its prototype here;
 * minivllm/_C.py declares the same signatures for ctypes, and tests/test_ops_dispatch.py parses this
 * file and the definitions to check that the two agree. Pointers are raw tensor data; `dtype` is
 * DTYPE_F32 or DTYPE_BF16 (cpu_types.h). Left out: vLLM's torch::Tensor signatures and op registration.
 */
#ifndef MINIVLLM_OPS_H
#define MINIVLLM_OPS_H

#include <stdint.h>

/* cache.c */
void reshape_and_cache(const void *key, const void *value, void *key_cache, void *value_cache,
                       const int64_t *slot_mapping, int64_t num_tokens, int64_t row, int64_t key_stride,
                       int64_t value_stride, int dtype);

/* cpu_attn.c */
void paged_attention(void *out, const void *query, const void *key_cache, const void *value_cache,
                     const int32_t *block_table, const int32_t *query_start_loc, const int32_t *seq_lens,
                     int64_t num_reqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                     int64_t block_size, int64_t block_table_stride, int64_t q_stride, int64_t out_stride,
                     float scale, int dtype);

/* layernorm.c */
void rms_norm(void *out, const void *x, const void *weight, int64_t num_tokens, int64_t hidden,
              int64_t x_stride, float eps, int dtype);
void fused_add_rms_norm(void *x, void *residual, const void *weight, int64_t num_tokens, int64_t hidden,
                        float eps, int dtype);

/* activation.c */
void silu_and_mul(void *out, const void *x, int64_t num_tokens, int64_t d, int dtype);

/* pos_encoding.c */
void rotary_embedding(const int64_t *positions, void *q, void *k, const void *cos_cache, const void *sin_cache,
                      int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                      int64_t q_stride, int64_t k_stride, int dtype);

/* gemm.c */
int64_t panel_width(void);
void pack_linear_weight(float *packed, const float *weight, int64_t n, int64_t k);
void linear_small_batch(float *out, const float *x, const float *packed, const float *bias, int64_t m, int64_t n,
                        int64_t k, int64_t x_stride);
int linear_bf16_tile(void);
void pack_linear_weight_bf16(uint16_t *packed, const uint16_t *weight, int64_t n, int64_t k);
void linear_small_batch_bf16(uint16_t *out, const uint16_t *x, const uint16_t *packed, const uint16_t *bias,
                             int64_t m, int64_t n, int64_t k, int64_t x_stride);

/* shm.c: the handle is caller-owned memory of shm_handle_size() bytes; ints returned are 0 or -errno */
int64_t shm_handle_size(void);
int shm_group_open(void *handle, const char *name, int64_t rank, int64_t world_size, int64_t slot_bytes,
                   int64_t timeout_ms);
int shm_group_unlink(void *handle);
void shm_group_close(void *handle);
int shm_all_reduce(void *handle, void *data, int64_t numel, int dtype);
int shm_all_gather(void *handle, const void *in, void *out, int64_t nbytes);

#endif /* MINIVLLM_OPS_H */

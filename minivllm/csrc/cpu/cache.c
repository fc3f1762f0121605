/* Mirror of vLLM's csrc/cpu/cache.cpp: write this step's K/V into the paged cache (the write path).
 *
 * The copy is addressed per token by slot_mapping, the same table the Triton reshape_and_cache_flash
 * and the PyTorch reference use. Left out: fp8 caches and their scales, the HND layout.
 */
#include "cpu_types.h"
#include "ops.h"

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

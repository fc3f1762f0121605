/* Mirror of vLLM's csrc/cpu/cpu_attn_impl.hpp: what the attention paths of cpu_attn.c and its instruction-set
 * files (cpu_attn_avx512.c, cpu_attn_avx512_bf16.c, cpu_attn_avx512.h) share.
 *
 * A work item reads one request's history (History); a tile item (TileItem) fills a thread's TileBuffers one KV
 * tile at a time. The vector files export one function per path, hidden inside the library (INTERNAL): each is
 * called once per item or per KV tile, and inlines its products with constant shapes below that.
 */
#ifndef MINIVLLM_CPU_ATTN_IMPL_H
#define MINIVLLM_CPU_ATTN_IMPL_H

#include "cpu_types.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define HAVE_AVX512_BF16 1  /* the build machine has the bf16 dot product vdpbf16ps */
#endif

/* Not exported from the library: shared between its files only. */
#define INTERNAL __attribute__((visibility("hidden")))

#define HEAD_GROUP 4         /* query heads per call of the row path's products */
#define TILE_KV 64           /* KV positions per tile: a multiple of 32 (score vectors per row go in pairs) */
#define TILE_KV_VECS (TILE_KV / 16)
#define TILE_ROWS 96         /* query rows per tile item: TILE_ROWS / (query heads per KV head) tokens */
#define ROW_PATH_MAX_QUERY 1 /* requests with at most this many query tokens take the row path */
#define BLOCK_ROWS 6         /* rows per register block of the tile products */
#define MAX_HEAD_VECS 16     /* 16-float vectors per head in the AVX-512 row path: head_size <= 256 */
#define MODE_PLAIN_C 0       /* tile path, plain C */
#define MODE_AVX512 1        /* tile path, AVX-512 float32 FMAs */
#define MODE_AVX512_BF16 2   /* tile path, AVX512_BF16 dot products */

typedef struct {
    const void *key_cache, *value_cache;
    const int32_t *blocks;  /* this request's block_table row */
    int64_t seq_len, block_size, row, head_offset, head_size;
} History;

typedef struct {  /* one thread's buffers for the tile path; rows = TILE_ROWS or more, padded to BLOCK_ROWS */
    float *s;           /* [rows][TILE_KV] scores of one KV tile, then its probabilities */
    float *o;           /* [rows][head_size] the P.V accumulators */
    float *m, *l, *alpha;  /* [rows] running max, running sum, this tile's rescale of what came before */
    int *n;             /* [rows] how many of this KV tile's positions row r sees (0 .. TILE_KV) */
    const char **q;     /* [rows] each row's query head */
    int64_t *off;       /* [TILE_KV] element offset of each position's K/V row in its cache */
    void *kt, *v;       /* the packed K tile (transposed) and V tile, layouts per instruction set */
    uint32_t *pw;       /* [rows][TILE_KV / 2] probabilities as bf16 pairs (AVX512_BF16 path) */
} TileBuffers;

typedef struct {  /* one tile item: `tokens` query tokens from position pos0 on, all `heads` of one KV head */
    History h;
    int64_t pos0, q_stride, out_stride;
    int tokens, heads;
    const char *q;  /* the first token's first query head of this KV head */
    char *out;
} TileItem;

/* How many of this KV tile's positions the block of rows from r0 on sees: those its last real row (the latest
 * position) sees; the block's other rows see no more (their probabilities past it are 0). 0: skip the block. */
ALWAYS_INLINE int block_seen(const TileBuffers *b, int r0, int rows) {
    return b->n[r0 + BLOCK_ROWS - 1 < rows ? r0 + BLOCK_ROWS - 1 : rows - 1];
}

/* cpu_attn.c: each head's scores become exp(score - max) in place; inv[g] gets 1 / their sum. */
INTERNAL void softmax_rows(float *scores, const float *maxs, float *inv, int heads, int64_t seq_len);

#ifdef __AVX512F__
/* cpu_attn_avx512.c: one decode's row path (qpk query heads of KV heads kvh0 .. kvh0 + nkv - 1), and one KV tile
 * of a tile item (b's offsets and rows' counts set), in float32 FMAs. */
INTERNAL void row_path_avx512(char *out, const char *q, const History *h, int64_t kvh0, int64_t nkv, int64_t qpk,
                              float scale, float *scores, float *acc, float *maxs, float *inv, int bf);
INTERNAL void tile_path_avx512(TileBuffers *b, const History *h, int n, int rows, int padded, float scale, int bf);
#endif

#ifdef HAVE_AVX512_BF16
/* cpu_attn_avx512_bf16.c: the same two in bf16 with dot products (head_size a multiple of 32 for the row path). */
INTERNAL void row_path_avx512_bf16(bf16 *out, const bf16 *q, const History *h, int64_t kvh0, int64_t nkv,
                                   int64_t qpk, float scale, float *scores, bf16 *probs, float *acc, float *maxs,
                                   int nz);
INTERNAL void tile_path_avx512_bf16(TileBuffers *b, const History *h, int n, int rows, int padded, float scale);
#endif

#endif /* MINIVLLM_CPU_ATTN_IMPL_H */

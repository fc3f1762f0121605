/* Mirror of vLLM's csrc/cpu/shm.cpp: all-reduce and all-gather for tensor-parallel ranks on one machine,
 * through one POSIX shared-memory segment instead of gloo's TCP loopback.
 *
 * Layout of the segment: a header (the barrier's two atomics), then two sets of `world_size` slots of
 * `slot_bytes` each. A collective moves its tensor in pieces of at most one slot; each piece uses the other
 * set than the piece before, so a rank may write its next piece while a slower rank still reads the last:
 *   all-reduce: each rank copies its piece into its own slot; barrier; rank r sums its share r/world_size
 *     of the piece over every slot, in rank order, in float32 (bf16 rounded once at the end, to nearest
 *     even, as torch rounds), and writes the sum into slot 0; barrier; each rank copies slot 0 out.
 *     Every rank reads the same bits, so the ranks never drift apart.
 *   all-gather: each rank copies its piece into its slot; barrier; each rank copies every slot out.
 * Reusing a set two pieces later is safe: every rank has passed the barrier of the piece between, so every
 * rank has finished reading. The barrier is a sense-reversing one on C11 atomics: spin, then sched_yield,
 * then short sleeps, and after `timeout_ms` an error (-ETIMEDOUT) instead of waiting for a dead rank
 * forever; the handle is then broken and every later call fails at once (-EPIPE).
 *
 * The caller owns the handle's memory (shm_handle_size bytes) and the naming: rank 0 creates the segment
 * (O_EXCL, mode 0600), the others open it by name, and once all have mapped it rank 0 unlinks the name, so
 * the memory is freed when the last rank unmaps it or dies. The loops are plain C that the compiler
 * vectorizes; there is no ISA-specific path. Differs from vLLM: one segment per group rather than one per
 * rank, no thread-parallel copies (each rank is one OpenMP share of the cores already). float16 (dtype 2,
 * shm.c's own code) is summed where the compiler has _Float16; shm_all_reduce of 0 elements tells whether.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cpu_types.h"
#include "ops.h"

#define SHM_HEADER_BYTES 4096
#define SHM_NAME_MAX 128
#define SHM_SPINS 4096      /* busy polls before the first sched_yield */
#define SHM_YIELD_NS 2000000 /* then yield this many ns, then sleep SHM_SLEEP_NS between polls */
#define SHM_SLEEP_NS 20000
#define SHM_BLOCK 256       /* elements summed per pass (a float32 accumulator on the stack) */
#define SHM_DTYPE_F16 2     /* float16 (beside cpu_types.h's DTYPE_F32 / DTYPE_BF16): only here */
#ifdef __FLT16_MAX__       /* the compiler has _Float16 (gcc 12+ on x86-64 and aarch64) */
#define SHM_HAS_F16 1
#else
#define SHM_HAS_F16 0
#endif

typedef struct {
    _Atomic int64_t arrived; /* ranks at the barrier in this round */
    _Atomic int64_t sense;   /* flipped by the last rank to arrive */
} ShmHeader;

typedef struct {
    char name[SHM_NAME_MAX];
    unsigned char *base;
    int64_t bytes, world_size, rank, slot_bytes, timeout_ns;
    int64_t sense;  /* this rank's sense: what the header's sense becomes when the current round ends */
    int64_t set;    /* which set of slots the next piece uses */
    int64_t broken; /* a barrier timed out: the ranks are out of step for good */
} ShmHandle;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int barrier(ShmHandle *h) {
    ShmHeader *hd = (ShmHeader *)h->base;
    int64_t sense = h->sense = !h->sense;
    if (atomic_fetch_add(&hd->arrived, 1) == h->world_size - 1) {
        atomic_store(&hd->arrived, 0); /* before the flip: nobody arrives at the next round before it */
        atomic_store(&hd->sense, sense);
        return 0;
    }
    int64_t start = -1;
    for (int64_t polls = 0; atomic_load(&hd->sense) != sense; polls++) {
        if (polls < SHM_SPINS) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        int64_t t = now_ns();
        if (start < 0) start = t;
        if (t - start > h->timeout_ns) {
            h->broken = 1;
            return -ETIMEDOUT;
        }
        if (t - start < SHM_YIELD_NS) {
            sched_yield();
        } else {
            struct timespec pause = {0, SHM_SLEEP_NS};
            nanosleep(&pause, NULL);
        }
    }
    return 0;
}

static unsigned char *slot(const ShmHandle *h, int64_t rank) {
    return h->base + SHM_HEADER_BYTES + (h->set * h->world_size + rank) * h->slot_bytes;
}

int64_t shm_handle_size(void) { return (int64_t)sizeof(ShmHandle); }

int shm_group_open(void *handle, const char *name, int64_t rank, int64_t world_size, int64_t slot_bytes,
                   int64_t timeout_ms) {
    ShmHandle *h = (ShmHandle *)handle;
    memset(h, 0, sizeof *h);
    if (strlen(name) >= SHM_NAME_MAX || world_size < 1 || rank < 0 || rank >= world_size || slot_bytes < 64 ||
        slot_bytes % 64 || timeout_ms < 0)
        return -EINVAL;
    strcpy(h->name, name);
    h->world_size = world_size, h->rank = rank, h->slot_bytes = slot_bytes;
    h->timeout_ns = timeout_ms * 1000000;
    h->bytes = SHM_HEADER_BYTES + 2 * world_size * slot_bytes;
    int fd = rank == 0 ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name, O_RDWR, 0);
    if (fd < 0) return -errno;
    int err = 0;
    struct stat st;
    if (rank == 0 && ftruncate(fd, h->bytes) != 0) err = -errno; /* a new segment reads as zeros */
    else if (rank != 0 && (fstat(fd, &st) != 0 || st.st_size != h->bytes)) err = -EINVAL; /* not our layout */
    if (!err) {
        void *p = mmap(NULL, (size_t)h->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) err = -errno;
        else h->base = (unsigned char *)p;
    }
    close(fd);
    if (err && rank == 0) shm_unlink(name);
    return err;
}

int shm_group_unlink(void *handle) {
    ShmHandle *h = (ShmHandle *)handle;
    return h->name[0] && shm_unlink(h->name) != 0 ? -errno : 0;
}

void shm_group_close(void *handle) {
    ShmHandle *h = (ShmHandle *)handle;
    if (h->base) munmap(h->base, (size_t)h->bytes);
    h->base = NULL;
    h->broken = 1;
}

#if SHM_HAS_F16
/* As reduce_share below, for float16 (the cast back rounds to nearest even). */
static void reduce_share_f16(const ShmHandle *h, int64_t lo, int64_t hi) {
    float acc[SHM_BLOCK];
    _Float16 *out = (_Float16 *)slot(h, 0);
    for (int64_t b = lo; b < hi; b += SHM_BLOCK) {
        int64_t m = hi - b < SHM_BLOCK ? hi - b : SHM_BLOCK;
        for (int64_t i = 0; i < m; i++) acc[i] = (float)out[b + i];
        for (int64_t r = 1; r < h->world_size; r++) {
            const _Float16 *in = (const _Float16 *)slot(h, r);
            for (int64_t i = 0; i < m; i++) acc[i] += (float)in[b + i];
        }
        for (int64_t i = 0; i < m; i++) out[b + i] = (_Float16)acc[i];
    }
}
#endif

/* Elements lo..hi of the current piece: slot 0 = slot 0 + slot 1 + ... in float32, rounded once. */
ALWAYS_INLINE void reduce_share(const ShmHandle *h, int64_t lo, int64_t hi, int bf) {
    float acc[SHM_BLOCK];
    void *out = slot(h, 0);
    for (int64_t b = lo; b < hi; b += SHM_BLOCK) {
        int64_t m = hi - b < SHM_BLOCK ? hi - b : SHM_BLOCK;
        for (int64_t i = 0; i < m; i++) acc[i] = load(out, b + i, bf);
        for (int64_t r = 1; r < h->world_size; r++) {
            const void *in = slot(h, r);
            for (int64_t i = 0; i < m; i++) acc[i] += load(in, b + i, bf);
        }
        for (int64_t i = 0; i < m; i++) store(out, b + i, acc[i], bf);
    }
}

int shm_all_reduce(void *handle, void *data, int64_t numel, int dtype) {
    ShmHandle *h = (ShmHandle *)handle;
    if (h->broken || !h->base) return -EPIPE;
    int f16 = dtype == SHM_DTYPE_F16 && SHM_HAS_F16; /* numel 0 asks whether a dtype is served, at no cost */
    if ((dtype != DTYPE_F32 && dtype != DTYPE_BF16 && !f16) || numel < 0) return -EINVAL;
    int bf = dtype == DTYPE_BF16, rc;
    int64_t es = f16 ? 2 : elem_size(bf), per_piece = h->slot_bytes / es;
    for (int64_t off = 0; off < numel; off += per_piece) {
        int64_t n = numel - off < per_piece ? numel - off : per_piece;
        unsigned char *mine = (unsigned char *)data + off * es;
        memcpy(slot(h, h->rank), mine, (size_t)(n * es));
        if ((rc = barrier(h))) return rc;
        int64_t lo = n * h->rank / h->world_size, hi = n * (h->rank + 1) / h->world_size;
        if (bf) reduce_share(h, lo, hi, 1);
#if SHM_HAS_F16
        else if (f16) reduce_share_f16(h, lo, hi);
#endif
        else reduce_share(h, lo, hi, 0);
        if ((rc = barrier(h))) return rc;
        memcpy(mine, slot(h, 0), (size_t)(n * es));
        h->set ^= 1;
    }
    return 0;
}

int shm_all_gather(void *handle, const void *in, void *out, int64_t nbytes) {
    ShmHandle *h = (ShmHandle *)handle;
    if (h->broken || !h->base) return -EPIPE;
    if (nbytes < 0) return -EINVAL;
    int rc;
    for (int64_t off = 0; off < nbytes; off += h->slot_bytes) {
        int64_t n = nbytes - off < h->slot_bytes ? nbytes - off : h->slot_bytes;
        memcpy(slot(h, h->rank), (const unsigned char *)in + off, (size_t)n);
        if ((rc = barrier(h))) return rc;
        for (int64_t r = 0; r < h->world_size; r++)
            memcpy((unsigned char *)out + r * nbytes + off, slot(h, r), (size_t)n);
        h->set ^= 1;
    }
    return 0;
}

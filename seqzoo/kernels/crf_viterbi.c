/* Viterbi decoding of a linear-chain CRF for CPU, one call per batch (Lafferty et al. 2001; the
 * max-plus recursion delta_t[j] = max_i (delta_{t-1}[i] + A[i, j]) + e_t[j] and its backtrace).
 *
 * Plain C99 with pthreads, no Python or torch headers: setuptools compiles it at install time and
 * seqzoo/kernels/crf_viterbi.py loads it with ctypes. The reference is viterbi_reference in
 * seqzoo/heads/crf.py; a step here is the same max over previous tags, ties to the lowest index.
 *
 * Layouts (row-major, contiguous):
 *   emissions (B, T, K); lengths (B,) int64 real tokens per row (right-padded), each in [0, T]
 *   start, end (K,); trans (K, K), trans[i * K + j] = score of tag i followed by tag j
 *   paths (B, T) int64 out: the best path, -1 at pads; scores (B,) out: its score (0 for empty rows)
 * Rows are independent: a worker thread takes a contiguous range of them, with its own scratch for
 * the back pointers (T x K int32), the running scores (2 x K) and the candidate tags (K int32).
 * With many tags a step first tries the PRUNE best previous tags and proves the result exact by a
 * bound, else scans every previous tag for that tag (viterbi_step in crf_viterbi_body.h).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"

enum { PRUNE = 6 }; /* candidate previous tags tried first, from 4 PRUNE tags on */

typedef struct {
    int dtype; /* 0 = float32, 1 = float64 */
    const void *emissions, *start, *trans, *end;
    void *col_max;       /* max_i A[i, j] (K,), filled before the rows are decoded */
    const int32_t *all; /* 0, 1, ..., K - 1: every previous tag */
    const int64_t *lengths;
    int64_t *paths;
    void *scores;
    int64_t batch, time, tags;
} Args;

/* 64-byte vectors (GCC/Clang vector extensions): one AVX-512 register, two AVX2 ones, four SSE ones */
typedef float vec_f32 __attribute__((vector_size(64)));
typedef int32_t ivec_f32 __attribute__((vector_size(64)));
typedef double vec_f64 __attribute__((vector_size(64)));
typedef int64_t ivec_f64 __attribute__((vector_size(64)));

#define SCALAR float
#define SFX f32
#define VEC vec_f32
#define IVEC ivec_f32
#define WIDTH 16
#include "crf_viterbi_body.h"
#undef SCALAR
#undef SFX
#undef VEC
#undef IVEC
#undef WIDTH

#define SCALAR double
#define SFX f64
#define VEC vec_f64
#define IVEC ivec_f64
#define WIDTH 8
#include "crf_viterbi_body.h"

typedef struct {
    const Args *args;
    int64_t begin, end; /* rows */
    int status;
} Range;

static void *run_range(void *p) {
    Range *r = (Range *)p;
    const Args *a = r->args;
    const size_t scalar_bytes = a->dtype == 0 ? sizeof(float) : sizeof(double);
    int32_t *back = malloc((size_t)(a->time > 0 ? a->time : 1) * (size_t)a->tags * sizeof(int32_t));
    void *delta = malloc(2 * (size_t)a->tags * scalar_bytes + (size_t)a->tags * sizeof(int32_t));
    if (!back || !delta) {
        r->status = 1;
    } else {
        for (int64_t b = r->begin; b < r->end; b++) {
            if (a->dtype == 0) viterbi_row_f32(a, b, back, delta); else viterbi_row_f64(a, b, back, delta);
        }
    }
    free(back);
    free(delta);
    return NULL;
}

/* Bumped whenever an exported signature changes; the loader refuses a library built from other sources. */
int crf_viterbi_abi_version(void) { return 1; }

/* dtype: 0 = float32, 1 = float64. Returns 0 on success, 1 if memory or threads were lacking. */
int crf_viterbi(int dtype, const void *emissions, const int64_t *lengths, const void *start, const void *trans,
                const void *end, int64_t batch, int64_t time, int64_t tags, int64_t *paths, void *scores,
                int nthreads) {
    enum { MIN_WORK_PER_THREAD = 1 << 22 };
    const size_t scalar_bytes = dtype == 0 ? sizeof(float) : sizeof(double);
    void *col_max = malloc((size_t)tags * scalar_bytes);
    int32_t *all = malloc((size_t)tags * sizeof(int32_t));
    if (!col_max || !all) {
        free(col_max);
        free(all);
        return 1;
    }
    for (int64_t i = 0; i < tags; i++) all[i] = (int32_t)i;
    Args args = {.dtype = dtype, .emissions = emissions, .start = start, .trans = trans, .end = end,
                 .col_max = col_max, .all = all, .lengths = lengths, .paths = paths, .scores = scores,
                 .batch = batch, .time = time, .tags = tags};
    if (dtype == 0) prepare_f32(&args); else prepare_f64(&args);
    /* a thread costs tens of microseconds to start: only for at least ~4M max-plus operations each
     * (a step tries every previous tag below 4 PRUNE tags, about 2 PRUNE per tag from there on) */
    const double work = (double)batch * (double)time * (double)tags * (double)(tags < 4 * PRUNE ? tags : 2 * PRUNE);
    const int64_t n = thread_count(nthreads, batch, work, MIN_WORK_PER_THREAD);
    Range ranges[MAX_THREADS];
    for (int64_t i = 0; i < n; i++) ranges[i] = (Range){&args, batch * i / n, batch * (i + 1) / n, 0};
    int status = run_ranges(run_range, ranges, sizeof(Range), n);
    for (int64_t i = 0; i < n; i++) status |= ranges[i].status;
    free(col_max);
    free(all);
    return status;
}

/* The log partition function of a linear-chain CRF and its gradient for CPU, one call per batch each
 * (Lafferty et al. 2001; the forward-backward algorithm, Rabiner 1989, in scaled form).
 *
 * Plain C99 with pthreads, no Python or torch headers: setuptools compiles it at install time and
 * seqzoo/kernels/crf_forward.py loads it with ctypes. The reference is log_partition_reference in
 * seqzoo/heads/crf.py. Per row of length L, in exp space with E = exp(A - max A), w_t = exp(e_t - max_j e_t[j]):
 *   (1) alpha_t[j] = sum_i alpha_{t-1}[i] exp(A[i, j] + e_t[j]), Z = sum_j alpha_{L-1}[j] exp(end[j])
 *   (2) a_0 = exp(start - max start) w_0 / n_0, a_t = (a_{t-1} @ E) w_t / n_t, n_t normalising a_t to sum 1
 *   (3) log Z = sum_t (log n_t + max_j e_t[j]) + (L - 1) max A + max start + max end
 *               + log sum_j a_{L-1}[j] exp(end[j] - max end)
 *   (4) b_{L-1} = exp(end - max end), b_{t-1} = E (w_t b_t) normalised to sum 1
 *   (5) p_t(j) = a_t[j] b_t[j] / S_t, S_t = sum_j a_t[j] b_t[j]: dlogZ/de_t = p_t, dlogZ/dstart = p_0,
 *       dlogZ/dend = p_{L-1}
 *   (6) p_t(i, j) = a_{t-1}[i] E[i, j] w_t[j] b_t[j] / (n_t S_t): dlogZ/dA[i, j] = sum_{t >= 1} p_t(i, j)
 * A normaliser (n_t, the final sum, the sums of b_t and S_t) under sqrt(tiny) means exp space lost
 * precision (scores tens of nats apart in float32): the call then returns 2 and the caller takes the
 * log-space reference instead.
 *
 * Layouts (row-major, contiguous):
 *   emissions (B, T, K); lengths (B,) int64 real tokens per row (right-padded), each in [0, T]
 *   start, end (K,); trans (K, K), trans[i * K + j] = score of tag i followed by tag j
 *   forward out: log_z (B,) (0 for empty rows); alpha (B, T, K) = a_t and norm (B, T) = n_t at real steps
 *   backward in: alpha, norm from the forward, grad (B,); out: the gradients of sum_b grad[b] log Z_b,
 *     grad_emissions (B, T, K) (0 at pads), grad_start (K,), grad_trans (K, K), grad_end (K,)
 * Rows are independent: a worker thread takes a contiguous range of them; in the backward each has its own
 * accumulators for start, trans and end, summed in thread order at the end (deterministic).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"

typedef struct {
    int dtype; /* 0 = float32, 1 = float64 */
    const void *emissions, *start, *trans, *end, *grad;
    const int64_t *lengths;
    void *log_z, *alpha, *norm, *grad_emissions;
    int64_t batch, time, tags;
} Args;

typedef struct {
    void *exp_trans, *exp_trans_t, *exp_start, *exp_end; /* E, E^T, and the shifted start and end, exponentiated */
    double shift_trans, shift_ends;                      /* max A, max start + max end */
} Shared;

typedef struct {
    const Args *args;
    const Shared *shared;
    int64_t begin, end;
    int backward;
    void *acc; /* backward: start (K), end (K), trans (K, K) of this range's rows, then (3 + PAIRS) K of scratch */
    int status;
} Range;

enum { PAIRS = 4 }; /* PAIRS: pair-marginal terms added to the accumulator per pass */

#define SCALAR float
#define SFX f32
#define EXP expf
#define TINY 1.0842022e-19f /* sqrt(FLT_MIN) */
#include "crf_forward_body.h"
#undef SCALAR
#undef SFX
#undef EXP
#undef TINY

#define SCALAR double
#define SFX f64
#define EXP exp
#define TINY 1.4916681462400413e-154 /* sqrt(DBL_MIN) */
#include "crf_forward_body.h"

static void *run_range(void *p) {
    Range *r = (Range *)p;
    const Args *a = r->args;
    const int64_t tags = a->tags;
    if (!r->backward) {
        for (int64_t b = r->begin; b < r->end; b++) {
            const int lost = a->dtype == 0 ? forward_row_f32(a, r->shared, b) : forward_row_f64(a, r->shared, b);
            if (lost) r->status = 2;
        }
        return NULL;
    }
    const size_t scalar = a->dtype == 0 ? sizeof(float) : sizeof(double);
    r->acc = calloc((size_t)(tags * tags + (5 + PAIRS) * tags), scalar);
    if (!r->acc) {
        r->status = 1;
        return NULL;
    }
    for (int64_t b = r->begin; b < r->end && !r->status; b++) {
        int lost;
        if (a->dtype == 0) {
            float *acc = r->acc;
            lost = backward_row_f32(a, r->shared, b, acc + 2 * tags + tags * tags, acc, acc + 2 * tags, acc + tags);
        } else {
            double *acc = r->acc;
            lost = backward_row_f64(a, r->shared, b, acc + 2 * tags + tags * tags, acc, acc + 2 * tags, acc + tags);
        }
        if (lost) r->status = 2;
    }
    return NULL;
}

/* Rows over threads: a thread costs tens of microseconds to start, so only for at least ~1M multiply-adds
 * each (a row step costs about K^2). Returns 0, 1 if memory or threads were lacking, 2 if precision was lost. */
static int run_rows(const Args *a, const Shared *s, int backward, int nthreads, Range *ranges, int64_t *count) {
    enum { MIN_WORK_PER_THREAD = 1 << 20 };
    const double work = (double)a->batch * (double)a->time * (double)a->tags * (double)a->tags * (backward ? 2 : 1);
    const int64_t n = thread_count(nthreads, a->batch, work, MIN_WORK_PER_THREAD);
    *count = n;
    for (int64_t i = 0; i < n; i++) {
        ranges[i] = (Range){a, s, a->batch * i / n, a->batch * (i + 1) / n, backward, NULL, 0};
    }
    int status = run_ranges(run_range, ranges, sizeof(Range), n);
    for (int64_t i = 0; i < n; i++) status = status == 1 || ranges[i].status == 1 ? 1 : status | ranges[i].status;
    return status;
}

/* E, E^T, exp(start - max), exp(end - max) in one block (freed by the caller), or NULL. */
static void *prepare(const Args *a, Shared *s) {
    const size_t scalar = a->dtype == 0 ? sizeof(float) : sizeof(double), tags = (size_t)a->tags;
    char *block = malloc((2 * tags * tags + 2 * tags) * scalar);
    if (!block) return NULL;
    s->exp_trans = block;
    s->exp_trans_t = block + tags * tags * scalar;
    s->exp_start = block + 2 * tags * tags * scalar;
    s->exp_end = block + (2 * tags * tags + tags) * scalar;
    if (a->dtype == 0) prepare_f32(a, s); else prepare_f64(a, s);
    return block;
}

/* Bumped whenever an exported signature changes; the loader refuses a library built from other sources. */
int crf_forward_abi_version(void) { return 1; }

/* The exp tables, then the rows over threads; a backward (grad_start != NULL) then sums the threads'
 * accumulators into grad_start, grad_trans and grad_end. Returns 0, 1 (memory, threads) or 2 (precision). */
static int run(const Args *a, int nthreads, void *grad_start, void *grad_trans, void *grad_end) {
    const int backward = grad_start != NULL;
    Shared shared;
    void *block = prepare(a, &shared);
    if (!block) return 1;
    Range ranges[MAX_THREADS];
    int64_t count;
    const int status = run_rows(a, &shared, backward, nthreads, ranges, &count);
    if (backward && status == 0) {
        if (a->dtype == 0) finish_backward_f32(a, &shared, ranges, count, grad_start, grad_trans, grad_end);
        else finish_backward_f64(a, &shared, ranges, count, grad_start, grad_trans, grad_end);
    }
    for (int64_t r = 0; r < count; r++) free(ranges[r].acc);
    free(block);
    return status;
}

/* log Z (B,) and the a_t, n_t the backward reads; returns 0, 1 (memory, threads) or 2 (precision lost). */
int crf_forward(int dtype, const void *emissions, const int64_t *lengths, const void *start, const void *trans,
                const void *end, int64_t batch, int64_t time, int64_t tags, void *log_z, void *alpha, void *norm,
                int nthreads) {
    const Args args = {.dtype = dtype, .emissions = emissions, .start = start, .trans = trans, .end = end,
                       .lengths = lengths, .log_z = log_z, .alpha = alpha, .norm = norm,
                       .batch = batch, .time = time, .tags = tags};
    return run(&args, nthreads, NULL, NULL, NULL);
}

/* The gradients of sum_b grad[b] log Z_b (see the layouts); returns 0, 1 (memory, threads) or 2 (precision). */
int crf_backward(int dtype, const void *emissions, const int64_t *lengths, const void *start, const void *trans,
                 const void *end, int64_t batch, int64_t time, int64_t tags, const void *alpha, const void *norm,
                 const void *grad, void *grad_emissions, void *grad_start, void *grad_trans, void *grad_end,
                 int nthreads) {
    const Args args = {.dtype = dtype, .emissions = emissions, .start = start, .trans = trans, .end = end,
                       .grad = grad, .lengths = lengths, .alpha = (void *)alpha, .norm = (void *)norm,
                       .grad_emissions = grad_emissions, .batch = batch, .time = time, .tags = tags};
    return run(&args, nthreads, grad_start, grad_trans, grad_end);
}

/* The recurrence of a (bidirectional) single-layer LSTM over the real tokens of a batch, for CPU inference:
 * one call per batch, no operator dispatch per step and no step over a pad.
 *
 * Plain C99 with pthreads, no Python or torch headers: setuptools compiles it at install time and
 * seqzoo/kernels/lstm_recurrence.py loads it with ctypes; lstm_recurrence_reference there is the reference.
 * For each row and direction, over the row's words in order (the reverse direction from its last word back),
 * from h_0 = c_0 = 0, with PyTorch's gate order (i, f, g, o):
 *   (1) z_t = x_t W_ih^T + b_ih + b_hh + h_{t-1} W_hh^T   (the first three terms are given: gates_x)
 *       c_t = sigmoid(f_t) c_{t-1} + sigmoid(i_t) tanh(g_t),   h_t = sigmoid(o_t) tanh(c_t)
 *
 * Layouts (row-major, contiguous; M real words, those of row b following those of row b - 1):
 *   gates_x (M, D, 4H) the input part of z for each word and direction (D = 1 or 2)
 *   weight_t (D, H, 4H) each direction's W_hh transposed; lengths (B,) int64 words per row, summing to M
 *   out (M, D, H) h_t of each word and direction
 * order (B,) int64 lists the rows longest first. Each direction runs them in that order in bundles of ROWS,
 * which step together so that each piece of W_hh is read once per step for all of them (W_hh is larger than
 * the L1 cache from H = 64 on); a worker thread takes a contiguous range of bundles of about equal steps.
 * Each row's result is the same in any bundle and on any thread. float32 uses the
 * branch-free exp of vector_math.h (about 1 ulp); float64 libm's.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"
#include "vector_math.h"

typedef struct {
    int dtype; /* 0 = float32, 1 = float64 */
    const void *gates_x, *weight_t;
    const int64_t *lengths, *first, *order; /* first: each row's first word; order: the rows, longest first */
    void *out;
    int64_t batch, hidden, directions;
} Args;

typedef struct {
    const Args *args;
    int64_t begin, end; /* bundles */
    int status;
} Range;

enum { ROWS = 4 }; /* rows of a bundle */

#define BODY "lstm_recurrence_body.h"
#include "both_types.h"

static void *run_range(void *p) {
    Range *r = (Range *)p;
    const Args *a = r->args;
    const int64_t per_direction = (a->batch + ROWS - 1) / ROWS; /* bundles */
    void *scratch = malloc((size_t)(6 * ROWS * a->hidden) * (a->dtype ? sizeof(double) : sizeof(float)));
    if (scratch == NULL) {
        r->status = 1;
        return NULL;
    }
    for (int64_t bundle = r->begin; bundle < r->end; bundle++) {
        const int64_t d = bundle / per_direction, begin = (bundle % per_direction) * ROWS;
        const int64_t count = begin + ROWS < a->batch ? ROWS : a->batch - begin;
        if (a->dtype)
            run_bundle_f64(a, d, a->order + begin, count, scratch);
        else
            run_bundle_f32(a, d, a->order + begin, count, scratch);
    }
    free(scratch);
    r->status = 0;
    return NULL;
}

int lstm_recurrence_abi_version(void) { return 2; }

/* Returns 0, or 1 where memory or a thread was lacking. */
int lstm_recurrence(int dtype, const void *gates_x, const void *weight_t, const int64_t *lengths, const int64_t *order,
                    int64_t batch, int64_t hidden, int64_t directions, void *out, int nthreads) {
    const int64_t per_direction = (batch + ROWS - 1) / ROWS, bundles = directions * per_direction;
    int64_t *first = malloc((size_t)(batch + 1) * sizeof(int64_t));
    if (first == NULL) return 1;
    first[0] = 0;
    for (int64_t b = 0; b < batch; b++) first[b + 1] = first[b] + lengths[b];
    Args args = {dtype, gates_x, weight_t, lengths, first, order, out, batch, hidden, directions};
    int64_t steps = 0; /* a bundle runs as many steps as its first (longest) row */
    for (int64_t i = 0; i < per_direction; i++) steps += directions * lengths[order[i * ROWS]];
    /* a thread pays for itself from about 64 bundle steps of a 64-wide LSTM */
    const int64_t n = thread_count(nthreads, bundles, (double)steps * (double)(hidden * hidden), 64.0 * 64.0 * 64.0);
    Range ranges[MAX_THREADS];
    int64_t bundle = 0, done = 0; /* steps of the bundles handed out so far */
    for (int64_t i = 0; i < n; i++) {
        ranges[i] = (Range){&args, bundle, bundle, 1};
        const int64_t goal = steps * (i + 1) / n;
        for (; bundle < bundles && (done < goal || i == n - 1); bundle++) {
            done += lengths[order[(bundle % per_direction) * ROWS]];
        }
        ranges[i].end = bundle;
    }
    int status = run_ranges(run_range, ranges, sizeof(Range), n);
    for (int64_t i = 0; i < n; i++) status |= ranges[i].status;
    free(first);
    return status;
}

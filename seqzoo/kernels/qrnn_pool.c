/* Fused QRNN pooling for CPU: activations, zoneout and f/fo/ifo-pooling in one pass over the
 * gates, forward and backward (Bradbury et al., "Quasi-Recurrent Neural Networks", ICLR 2017,
 * eqs. 1 and 3-6; paper convention: f multiplies the OLD state).
 *
 * Plain C99 with pthreads, no Python or torch headers: setuptools compiles it at install time and
 * seqzoo/kernels/qrnn_pool.py loads it with ctypes. float32 is the fast path (vectorisable exp,
 * AVX-512 / AVX2 clones picked at load time); float64 uses libm and exists for gradcheck.
 *
 * Layouts (row-major, contiguous):
 *   gates   (B, gate_time, G, H) pre-activations less the bias, G = 2 (z, f), 3 (z, f, o) or 4 (z, f, o, i);
 *           rows t >= T are not read (a QRNN layer's convolution output has k - 1 spare rows per
 *           batch row); a training forward (store) replaces them by their activations, which the
 *           backward reads (recomputing the cell states from them) and overwrites with the gradients
 *   bias    (G, H) added to the gates, or NULL; dbias (B, G, H): row 0 returns the bias gradient
 *   lengths (B,) int64, real tokens per row (right-padded); pads leave the state unchanged
 *   keep    (B, T, H) uint8 zoneout keep mask or NULL; keep_prob scales 1 - f (eval expectation)
 *   h, dh (B, T, H); c0, c_last, dc_last, dc0 (B, H); c0 / dc_last may be NULL (zeros)
 *   reverse != 0 runs each row from its last real token back to its first.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"
#include "vector_math.h"

enum { POOL_F = 0, POOL_FO = 1, POOL_IFO = 2 };
#define BLOCK 256 /* channels per work item: long contiguous rows per step keep the prefetchers streaming */

typedef struct {
    const void *bias, *c0, *dh, *dc_last;
    const int64_t *lengths;
    const uint8_t *keep;
    double keep_prob;
    void *gates, *h, *c_last, *dbias, *dc0;
    int64_t batch, time, gate_time, hidden;
    int pooling, reverse, store;
} Args;

#define BODY "qrnn_pool_body.h"
#include "both_types.h"

typedef void (*item_fn)(const Args *, int64_t, void *);

typedef struct {
    item_fn fn;
    const Args *args;
    int64_t begin, end;
    size_t scratch_bytes;
    int status;
} Range;

static void *run_range(void *p) {
    Range *r = (Range *)p;
    void *scratch = r->scratch_bytes ? malloc(r->scratch_bytes) : NULL; /* reused by all the range's items */
    if (r->scratch_bytes && !scratch) {
        r->status = 1;
        return NULL;
    }
    for (int64_t item = r->begin; item < r->end; item++) r->fn(r->args, item, scratch);
    free(scratch);
    return NULL;
}

/* Split items (batch row x channel block) into nthreads contiguous ranges, each with scratch_bytes of
 * scratch memory; the caller runs one. Returns 0 on success. */
static int run_parallel(item_fn fn, const Args *args, int nthreads, size_t scratch_bytes) {
    const int64_t items = args->batch * ((args->hidden + BLOCK - 1) / BLOCK);
    const int64_t n = thread_count(nthreads, items, 0.0, 0.0);
    Range ranges[MAX_THREADS];
    for (int64_t i = 0; i < n; i++) ranges[i] = (Range){fn, args, items * i / n, items * (i + 1) / n, scratch_bytes, 0};
    int status = run_ranges(run_range, ranges, sizeof(Range), n);
    for (int64_t i = 0; i < n; i++) status |= ranges[i].status;
    return status;
}

/* Bumped whenever an exported signature changes; the loader refuses a library built from other sources. */
int qrnn_pool_abi_version(void) { return 3; }

/* dtype: 0 = float32, 1 = float64; store != 0 (training) leaves the activations in gates. Returns 0 on success. */
int qrnn_pool_forward(int dtype, void *gates, int64_t gate_time, const void *bias, const int64_t *lengths,
                      const void *c0, const uint8_t *keep, double keep_prob, int64_t batch, int64_t time,
                      int64_t hidden, int pooling, int reverse, int store, void *h, void *c_last, int nthreads) {
    const Args args = {.gates = gates, .bias = bias, .c0 = c0, .lengths = lengths, .keep = keep,
                       .keep_prob = keep_prob, .h = h, .c_last = c_last, .batch = batch, .time = time,
                       .gate_time = gate_time, .hidden = hidden, .pooling = pooling, .reverse = reverse,
                       .store = store};
    return run_parallel(dtype == 0 ? forward_f32 : forward_f64, &args, nthreads, 0);
}

int qrnn_pool_backward(int dtype, void *gates, int64_t gate_time, const void *bias, const int64_t *lengths,
                       const void *c0, const uint8_t *keep, double keep_prob, int64_t batch, int64_t time,
                       int64_t hidden, int pooling, int reverse, const void *dh, const void *dc_last,
                       void *dbias, void *dc0, int nthreads) {
    const Args args = {.gates = gates, .bias = bias, .c0 = c0, .lengths = lengths, .keep = keep,
                       .keep_prob = keep_prob, .dh = dh, .dc_last = dc_last, .dbias = dbias, .dc0 = dc0,
                       .batch = batch, .time = time, .gate_time = gate_time, .hidden = hidden,
                       .pooling = pooling, .reverse = reverse};
    const size_t cells = (size_t)(time > 0 ? time : 1) * BLOCK * (dtype == 0 ? sizeof(float) : sizeof(double));
    const int status = run_parallel(dtype == 0 ? backward_f32 : backward_f64, &args, nthreads, cells);
    const int64_t n = (pooling == POOL_F ? 2 : pooling == POOL_FO ? 3 : 4) * hidden; /* per-row sums into row 0 */
    for (int64_t b = 1; b < batch; b++) {
        if (dtype == 0) {
            float *db = (float *)dbias;
            for (int64_t j = 0; j < n; j++) db[j] += db[b * n + j];
        } else {
            double *db = (double *)dbias;
            for (int64_t j = 0; j < n; j++) db[j] += db[b * n + j];
        }
    }
    return status;
}

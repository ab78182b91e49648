/* The S-LSTM global node's step (Zhang et al. 2018, eqs. 3; MODELS.md 2.1 "Global node"), for CPU inference:
 * one pass over every word of a batch and the node's gates, where PyTorch takes about twenty operations.
 *
 * Plain C99 with pthreads, no Python or torch headers: setuptools compiles it at install time and
 * seqzoo/kernels/slstm_global.py loads it with ctypes; global_step_reference there is the reference.
 * For sentence b with global node (g_b, c_g_b) and gate products gates_g_b = [W_g g_b; W_o g_b; W_f g_b],
 * and each of its words i with cell c_i, state h_i and U_f h_i + b_f (forget_pre):
 *   (1) e_i = exp(sigmoid(W_f g_b + U_f h_i + b_f))   (the global softmax's numerators; the gates lie
 *       in (0, 1), so exp needs no shift)
 *   (2) weighted = sum_i e_i c_i,  weights = sum_i e_i,  h_sum = sum_i h_i
 *   (3) h̄ = h_sum / max(n_b, 1)
 *   (4) [U_g h̄ + b_g; U_o h̄ + b_o] = mean_wtᵀ h̄ + mean_b     (mean_wt: U = [U_g; U_o] transposed)
 *   (5) f_g = sigmoid(W_g g + U_g h̄ + b_g), o = sigmoid(W_o g + U_o h̄ + b_o), e_g = exp(f_g),
 *       c_g' = (weighted + e_g c_g) / (weights + e_g),  g' = o tanh(c_g')
 *
 * Layouts (row-major, contiguous): gates_g (B, 3H); forget_pre, cell, h (M, H), the words in any order;
 * rows (M,) int64 the rows of sentence 0's words, then sentence 1's, ...; lengths (B,) int64 words per
 * sentence, summing to M; c_g (B, H); mean_wt (H, 2H); mean_b (2H). Out: g', c_g' (B, H). An empty
 * sentence keeps its own cell (weighted = weights = 0). Each sentence's sums run over its words in the
 * order given, and its products in a fixed order, so the result does not depend on the number of threads;
 * a worker thread takes a contiguous range of sentences of about equal words. float32 uses the branch-free
 * exp of vector_math.h (about 1 ulp); float64 libm's.
 */
#include <stdint.h>
#include <stdlib.h>

#include "parallel.h"
#include "vector_math.h"

typedef struct {
    int dtype; /* 0 = float32, 1 = float64 */
    const void *gates_g, *forget_pre, *cell, *h, *c_g, *mean_wt, *mean_b;
    const int64_t *rows, *first; /* first: where each sentence's rows start, B + 1 entries */
    void *out_g, *out_c_g;
    int64_t batch, hidden;
} Args;

typedef struct {
    const Args *args;
    int64_t begin, end; /* sentences */
    int failed;         /* no memory for the scratch */
} Range;

enum { BLOCK = 16 }; /* columns of (4) at a time: one AVX-512 register of float32 */

#define BODY "slstm_global_body.h"
#include "both_types.h"

static void *run_range(void *p) {
    Range *r = (Range *)p;
    const int64_t size = r->args->dtype ? (int64_t)sizeof(double) : (int64_t)sizeof(float);
    void *scratch = malloc((size_t)(5 * r->args->hidden * (r->end - r->begin) * size + 1));
    if (scratch == NULL) {
        r->failed = 1;
        return NULL;
    }
    if (r->args->dtype)
        sentence_steps_f64(r->args, r->begin, r->end, scratch);
    else
        sentence_steps_f32(r->args, r->begin, r->end, scratch);
    free(scratch);
    return NULL;
}

int slstm_global_abi_version(void) { return 2; }

/* Returns 0, or 1 where memory was lacking or a thread could not be joined. */
int slstm_global_step(int dtype, const void *gates_g, const void *forget_pre, const void *cell, const void *h,
                      const int64_t *rows, const int64_t *lengths, const void *c_g, const void *mean_wt,
                      const void *mean_b, int64_t batch, int64_t hidden, void *out_g, void *out_c_g, int nthreads) {
    int64_t *first = malloc((size_t)(batch + 1) * sizeof(int64_t));
    if (first == NULL) return 1;
    first[0] = 0;
    for (int64_t b = 0; b < batch; b++) first[b + 1] = first[b] + lengths[b];
    const int64_t words = first[batch];
    Args args = {dtype, gates_g, forget_pre, cell, h, c_g, mean_wt, mean_b, rows, first, out_g, out_c_g, batch, hidden};
    /* a thread pays for itself from about 64k word-dimensions */
    const int64_t n = thread_count(nthreads, batch, (double)words * (double)hidden, 65536.0);
    Range ranges[MAX_THREADS];
    int64_t b = 0;
    for (int64_t i = 0; i < n; i++) {
        ranges[i] = (Range){&args, b, b, 0};
        const int64_t goal = words * (i + 1) / n;
        while (b < batch && (first[b] < goal || i == n - 1)) b++;
        ranges[i].end = b;
    }
    int status = run_ranges(run_range, ranges, sizeof(Range), n);
    for (int64_t i = 0; i < n; i++) status |= ranges[i].failed;
    free(first);
    return status;
}

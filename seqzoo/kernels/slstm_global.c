/* The sums over words that the S-LSTM global node's update reads (Zhang et al. 2018, eqs. 3; MODELS.md 2.1
 * "Global node"), for CPU inference: one pass over every word of a batch per step, where PyTorch takes
 * about ten operations, each over every word.
 *
 * Plain C99 with pthreads, no Python or torch headers: setuptools compiles it at install time and
 * seqzoo/kernels/slstm_global.py loads it with ctypes; global_sums_reference there is the reference.
 * For word i of sentence b, with the forget gate pre-activations W_f g_b (forget_g) and U_f h_i + b_f
 * (forget_pre):
 *   (1) e_i = exp(sigmoid(W_f g_b + U_f h_i + b_f))   (the global softmax's numerators; the gates lie
 *       in (0, 1), so exp needs no shift)
 *   (2) weighted_b = sum_i e_i c_i,  weights_b = sum_i e_i,  h_sum_b = sum_i h_i
 *
 * Layouts (row-major, contiguous): forget_g (B, H); forget_pre, cell, h (M, H), the words in any order;
 * rows (M,) int64 the rows of sentence 0's words, then sentence 1's, ...; lengths (B,) int64 words per
 * sentence, summing to M. Out: weighted, weights, h_sum (B, H), written whole (0 for an empty sentence).
 * Each sentence's sums stay in registers, BLOCK dimensions at a time, over its words in the order given
 * (so the result does not depend on the number of threads); a worker thread takes a contiguous range of
 * sentences of about equal words. float32 uses the branch-free exp of vector_math.h (about 1 ulp); float64
 * libm's.
 */
#include <stdint.h>
#include <stdlib.h>

#include "parallel.h"
#include "vector_math.h"

typedef struct {
    int dtype; /* 0 = float32, 1 = float64 */
    const void *forget_g, *forget_pre, *cell, *h;
    const int64_t *rows, *first; /* first: where each sentence's rows start, B + 1 entries */
    void *weighted, *weights, *h_sum;
    int64_t batch, hidden;
} Args;

typedef struct {
    const Args *args;
    int64_t begin, end; /* sentences */
} Range;

enum { BLOCK = 16 }; /* dimensions summed in registers at a time: one AVX-512 register of float32 */

#define BODY "slstm_global_body.h"
#include "both_types.h"

static void *run_range(void *p) {
    Range *r = (Range *)p;
    if (r->args->dtype)
        sentence_sums_f64(r->args, r->begin, r->end);
    else
        sentence_sums_f32(r->args, r->begin, r->end);
    return NULL;
}

int slstm_global_abi_version(void) { return 1; }

/* Returns 0, or 1 where memory was lacking or a thread could not be joined. */
int slstm_global_sums(int dtype, const void *forget_g, const void *forget_pre, const void *cell, const void *h,
                      const int64_t *rows, const int64_t *lengths, int64_t batch, int64_t hidden, void *weighted,
                      void *weights, void *h_sum, int nthreads) {
    int64_t *first = malloc((size_t)(batch + 1) * sizeof(int64_t));
    if (first == NULL) return 1;
    first[0] = 0;
    for (int64_t b = 0; b < batch; b++) first[b + 1] = first[b] + lengths[b];
    const int64_t words = first[batch];
    Args args = {dtype, forget_g, forget_pre, cell, h, rows, first, weighted, weights, h_sum, batch, hidden};
    /* a thread pays for itself from about 64k word-dimensions */
    const int64_t n = thread_count(nthreads, batch, (double)words * (double)hidden, 65536.0);
    Range ranges[MAX_THREADS];
    int64_t b = 0;
    for (int64_t i = 0; i < n; i++) {
        ranges[i] = (Range){&args, b, b};
        const int64_t goal = words * (i + 1) / n;
        while (b < batch && (first[b] < goal || i == n - 1)) b++;
        ranges[i].end = b;
    }
    const int status = run_ranges(run_range, ranges, sizeof(Range), n);
    free(first);
    return status;
}

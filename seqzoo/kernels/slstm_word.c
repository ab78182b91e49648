/* The S-LSTM word nodes' cell and output (Zhang et al. 2018, eqs. 2; MODELS.md 2.1 and 2.2), for CPU inference:
 * one pass over the words being updated, where PyTorch takes about twenty operations, each over all of them.
 *
 * Plain C99 with pthreads, no Python or torch headers: setuptools compiles it at install time and
 * seqzoo/kernels/slstm_word.py loads it with ctypes; word_cells_reference there is the reference.
 * For word r of sentence b = sentence[r], with its gate pre-activations z = pre_r + global_pre_b (G groups of H:
 * W ξ + U x + b, and V g of its sentence's global node), its own cell c_r = cells[r], its neighbours' cells
 * c_left = sum of cells[near[r, k]] over k < per_side and c_right over the next per_side, the global cell
 * c_g = c_global[b]:
 *   (1) the first five gates' weights: w_k = exp(sigmoid(z_k)) / sum_k' exp(sigmoid(z_k')), per dimension
 *       (the sigmoids lie in (0, 1), so the softmax needs no shift)
 *   (2) paper (G = 7: i, l, r, f, s, o, u):
 *         c = w_l c_left + w_f c_r + w_r c_right + w_s c_g + w_i tanh(z_u)
 *       official (G = 6: f1, f2, f3, f4, i, o; x_cell given):
 *         c = w_f1 c_left + w_f2 c_right + w_f3 x_cell_r + w_f4 c_g + w_i c_r
 *   (3) h = sigmoid(z_o) tanh(c)
 *
 * Layouts (row-major, contiguous): pre (N, G H); global_pre (B, G H); sentence (N,) int64; cells (R, H), its
 * first N rows the words' own cells; near (N, 2 per_side) int64 rows of cells; c_global (B, H); x_cell (N, H)
 * or NULL. Out: h, c (N, H), which must not overlap the inputs. Each word is computed alone, so the result
 * does not depend on the number of threads; a worker thread takes a contiguous range of words. float32 uses
 * the branch-free exp of vector_math.h (about 1 ulp); float64 libm's.
 */
#include <stdint.h>
#include <stdlib.h>

#include "parallel.h"
#include "vector_math.h"

typedef struct {
    int dtype; /* 0 = float32, 1 = float64 */
    const void *pre, *global_pre, *cells, *c_global, *x_cell;
    const int64_t *sentence, *near;
    void *h, *c;
    int64_t groups, per_side, hidden;
} Args;

typedef struct {
    const Args *args;
    int64_t begin, end; /* words */
    int failed;         /* no memory for the scratch */
} Range;

#define BODY "slstm_word_body.h"
#include "both_types.h"

static void *run_range(void *p) {
    Range *r = (Range *)p;
    const size_t size = r->args->dtype ? sizeof(double) : sizeof(float);
    void *scratch = malloc((size_t)(2 * r->args->hidden) * size + 1);
    if (scratch == NULL) {
        r->failed = 1;
        return NULL;
    }
    if (r->args->dtype)
        word_cells_f64(r->args, r->begin, r->end, scratch);
    else
        word_cells_f32(r->args, r->begin, r->end, scratch);
    free(scratch);
    return NULL;
}

int slstm_word_abi_version(void) { return 1; }

/* Returns 0, or 1 where memory was lacking or a thread could not be joined. */
int slstm_word_cells(int dtype, const void *pre, const void *global_pre, const int64_t *sentence, const void *cells,
                     const int64_t *near, const void *c_global, const void *x_cell, int64_t words, int64_t groups,
                     int64_t per_side, int64_t hidden, void *h, void *c, int nthreads) {
    Args args = {dtype, pre, global_pre, cells, c_global, x_cell, sentence, near, h, c, groups, per_side, hidden};
    /* a thread pays for itself from about 16k word-dimensions */
    const int64_t n = thread_count(nthreads, words, (double)words * (double)hidden, 16384.0);
    Range ranges[MAX_THREADS];
    for (int64_t i = 0; i < n; i++) ranges[i] = (Range){&args, words * i / n, words * (i + 1) / n, 0};
    int status = run_ranges(run_range, ranges, sizeof(Range), n);
    for (int64_t i = 0; i < n; i++) status |= ranges[i].failed;
    return status;
}

/* A bundle of ROWS LSTM rows of one direction for SCALAR (float or double), named with SFX; included twice by
 * lstm_recurrence.c. Equations: see lstm_recurrence.c. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

typedef SCALAR CAT(vec, SFX) __attribute__((vector_size(64))); /* one AVX-512 register; split on smaller ones */

#define LOAD(v, p) memcpy(&(v), (p), sizeof(v)) /* an unaligned vector load */

/* gates (ROWS, 4H) += h (ROWS, H) @ W_hh^T for one step of a bundle. A register of gates at a time over all k,
 * for the ROWS rows at once: each piece of W_hh is loaded once for all of them (weight_t (H, 4H) is W_hh
 * transposed, so each k reads contiguous gates), and the rows' sums are independent chains of multiply-adds.
 * The last gates (fewer than a register) one by one. */
CLONES static void CAT(recurrent_product, SFX)(SCALAR *restrict gates, const SCALAR *restrict h,
                                                const SCALAR *restrict weight_t, int64_t hidden) {
    typedef CAT(vec, SFX) vec;
    const int64_t width = 4 * hidden, lanes = (int64_t)(sizeof(vec) / sizeof(SCALAR));
    int64_t from = 0;
    for (; from + lanes <= width; from += lanes) {
        vec a0, a1, a2, a3, w;
        LOAD(a0, gates + from), LOAD(a1, gates + width + from);
        LOAD(a2, gates + 2 * width + from), LOAD(a3, gates + 3 * width + from);
        for (int64_t k = 0; k < hidden; k++) {
            LOAD(w, weight_t + k * width + from);
            a0 += h[k] * w, a1 += h[hidden + k] * w, a2 += h[2 * hidden + k] * w, a3 += h[3 * hidden + k] * w;
        }
        memcpy(gates + from, &a0, sizeof a0), memcpy(gates + width + from, &a1, sizeof a1);
        memcpy(gates + 2 * width + from, &a2, sizeof a2), memcpy(gates + 3 * width + from, &a3, sizeof a3);
    }
    for (int64_t r = 0; r < ROWS && from < width; r++) {
        for (int64_t k = 0; k < hidden; k++) {
            for (int64_t j = from; j < width; j++) gates[r * width + j] += h[r * hidden + k] * weight_t[k * width + j];
        }
    }
}

/* (eq. 1) the cell and output of one step from its gate pre-activations (i, f, g, o). */
CLONES static void CAT(cell_step, SFX)(const SCALAR *restrict gates, SCALAR *restrict h, SCALAR *restrict c,
                                        int64_t hidden) {
    const SCALAR *gi = gates, *gf = gates + hidden, *gg = gates + 2 * hidden, *go = gates + 3 * hidden;
    for (int64_t j = 0; j < hidden; j++) {
        SCALAR cell = CAT(sigmoid, SFX)(gf[j]) * c[j] + CAT(sigmoid, SFX)(gi[j]) * CAT(tanh, SFX)(gg[j]);
        c[j] = cell;
        h[j] = CAT(sigmoid, SFX)(go[j]) * CAT(tanh, SFX)(cell);
    }
}

/* Rows rows[0, count) (at most ROWS, longest first) in direction d. scratch holds h, c (ROWS, H) each and the
 * gates (ROWS, 4H). A row past its length keeps computing on its last state; its results are not read. */
static void CAT(run_bundle, SFX)(const Args *a, int64_t d, const int64_t *rows, int64_t count, SCALAR *scratch) {
    const int64_t hidden = a->hidden, width = 4 * hidden, dirs = a->directions;
    const SCALAR *gates_x = (const SCALAR *)a->gates_x, *weight_t = (const SCALAR *)a->weight_t + d * hidden * width;
    SCALAR *out = (SCALAR *)a->out, *h = scratch, *c = scratch + ROWS * hidden, *gates = scratch + 2 * ROWS * hidden;
    for (int64_t j = 0; j < (2 + 4) * ROWS * hidden; j++) scratch[j] = 0; /* h_0 = c_0 = 0 */
    const int64_t steps = a->lengths[rows[0]];
    for (int64_t s = 0; s < steps; s++) {
        int64_t live = 0; /* the rows still running: a prefix, as they are longest first */
        while (live < count && s < a->lengths[rows[live]]) live++;
        for (int64_t r = 0; r < live; r++) {
            const int64_t length = a->lengths[rows[r]];
            const int64_t word = a->first[rows[r]] + (d ? length - 1 - s : s); /* the reverse direction reads back */
            memcpy(gates + r * width, gates_x + (word * dirs + d) * width, (size_t)width * sizeof(SCALAR));
        }
        CAT(recurrent_product, SFX)(gates, h, weight_t, hidden);
        for (int64_t r = 0; r < live; r++) {
            const int64_t length = a->lengths[rows[r]], word = a->first[rows[r]] + (d ? length - 1 - s : s);
            CAT(cell_step, SFX)(gates + r * width, h + r * hidden, c + r * hidden, hidden);
            memcpy(out + (word * dirs + d) * hidden, h + r * hidden, (size_t)hidden * sizeof(SCALAR));
        }
    }
}

#undef LOAD
#undef CAT
#undef CAT_

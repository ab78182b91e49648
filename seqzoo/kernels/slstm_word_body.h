/* The S-LSTM word nodes' cell and output for SCALAR (float or double), named with SFX; included twice by
 * slstm_word.c. Equations: see slstm_word.c. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

/* left += l, right += q: one neighbour on each side (the cells' window sums). */
static ALWAYS_INLINE void CAT(add_rows, SFX)(SCALAR *restrict left, SCALAR *restrict right,
                                             const SCALAR *restrict l, const SCALAR *restrict q, int64_t hidden) {
    for (int64_t j = 0; j < hidden; j++) left[j] += l[j], right[j] += q[j];
}

/* exp(sigmoid(z_k + zg_k)) at dimension j: the unnormalised weight of gate k (1). */
#define SCORE(k) CAT(exp_unit, SFX)(CAT(sigmoid, SFX)(z[(k) * hidden + j] + zg[(k) * hidden + j]))

/* (1)-(3) of one paper word (gates i, l, r, f, s, o, u). Restrict parameters, so that GCC vectorises over j. */
static ALWAYS_INLINE void CAT(paper_word, SFX)(SCALAR *restrict h, SCALAR *restrict c, const SCALAR *restrict z,
                                               const SCALAR *restrict zg, const SCALAR *restrict left,
                                               const SCALAR *restrict right, const SCALAR *restrict own,
                                               const SCALAR *restrict c_g, int64_t hidden) {
    for (int64_t j = 0; j < hidden; j++) {
        const SCALAR e0 = SCORE(0), e1 = SCORE(1), e2 = SCORE(2), e3 = SCORE(3), e4 = SCORE(4);
        const SCALAR u = CAT(tanh, SFX)(z[6 * hidden + j] + zg[6 * hidden + j]);
        const SCALAR total = e0 + e1 + e2 + e3 + e4;
        const SCALAR cell = (e1 * left[j] + e3 * own[j] + e2 * right[j] + e4 * c_g[j] + e0 * u) / total;
        c[j] = cell;
        h[j] = CAT(sigmoid, SFX)(z[5 * hidden + j] + zg[5 * hidden + j]) * CAT(tanh, SFX)(cell);
    }
}

/* (1)-(3) of one official word (gates f1, f2, f3, f4, i, o; x its input gated into the cell). */
static ALWAYS_INLINE void CAT(official_word, SFX)(SCALAR *restrict h, SCALAR *restrict c,
                                                  const SCALAR *restrict z, const SCALAR *restrict zg,
                                                  const SCALAR *restrict left, const SCALAR *restrict right,
                                                  const SCALAR *restrict own, const SCALAR *restrict c_g,
                                                  const SCALAR *restrict x, int64_t hidden) {
    for (int64_t j = 0; j < hidden; j++) {
        const SCALAR e0 = SCORE(0), e1 = SCORE(1), e2 = SCORE(2), e3 = SCORE(3), e4 = SCORE(4);
        const SCALAR total = e0 + e1 + e2 + e3 + e4;
        const SCALAR cell = (e0 * left[j] + e1 * right[j] + e2 * x[j] + e3 * c_g[j] + e4 * own[j]) / total;
        c[j] = cell;
        h[j] = CAT(sigmoid, SFX)(z[5 * hidden + j] + zg[5 * hidden + j]) * CAT(tanh, SFX)(cell);
    }
}

#undef SCORE

/* Words [begin, end); scratch holds c_left and c_right (H each). */
CLONES static void CAT(word_cells, SFX)(const Args *a, int64_t begin, int64_t end, void *scratch) {
    const int64_t hidden = a->hidden, width = a->groups * hidden, side = a->per_side;
    const SCALAR *cells = (const SCALAR *)a->cells;
    SCALAR *left = scratch, *right = left + hidden;
    for (int64_t r = begin; r < end; r++) {
        const int64_t b = a->sentence[r], *near = a->near + r * 2 * side;
        for (int64_t j = 0; j < hidden; j++) left[j] = right[j] = 0;
        for (int64_t k = 0; k < side; k++)
            CAT(add_rows, SFX)(left, right, cells + near[k] * hidden, cells + near[side + k] * hidden, hidden);
        const SCALAR *z = (const SCALAR *)a->pre + r * width, *zg = (const SCALAR *)a->global_pre + b * width;
        const SCALAR *own = cells + r * hidden, *c_g = (const SCALAR *)a->c_global + b * hidden;
        SCALAR *h = (SCALAR *)a->h + r * hidden, *c = (SCALAR *)a->c + r * hidden;
        if (a->groups == 7)
            CAT(paper_word, SFX)(h, c, z, zg, left, right, own, c_g, hidden);
        else
            CAT(official_word, SFX)(h, c, z, zg, left, right, own, c_g, (const SCALAR *)a->x_cell + r * hidden, hidden);
    }
}

#undef CAT
#undef CAT_

/* The S-LSTM global node's sums over words for SCALAR (float or double), named with SFX; included twice
 * by slstm_global.c. Equations: see slstm_global.c. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

/* One word's H dimensions, added to its sentence's sums. */
static inline void CAT(add_word, SFX)(SCALAR *restrict weighted, SCALAR *restrict weights, SCALAR *restrict h_sum,
                                      const SCALAR *restrict forget_g, const SCALAR *restrict forget_pre,
                                      const SCALAR *restrict cell, const SCALAR *restrict h, int64_t hidden) {
    for (int64_t j = 0; j < hidden; j++) {
        const SCALAR e = CAT(exp, SFX)(CAT(sigmoid, SFX)(forget_g[j] + forget_pre[j])); /* (1) */
        weighted[j] += e * cell[j];                                                      /* (2) */
        weights[j] += e;
        h_sum[j] += h[j];
    }
}

/* Sentences [begin, end). */
CLONES static void CAT(sentence_sums, SFX)(const Args *a, int64_t begin, int64_t end) {
    const int64_t hidden = a->hidden;
    const SCALAR *forget_pre = (const SCALAR *)a->forget_pre, *cell = (const SCALAR *)a->cell;
    const SCALAR *h = (const SCALAR *)a->h;
    for (int64_t b = begin; b < end; b++) {
        const int64_t at = b * hidden;
        SCALAR *weighted = (SCALAR *)a->weighted + at, *weights = (SCALAR *)a->weights + at;
        SCALAR *h_sum = (SCALAR *)a->h_sum + at;
        for (int64_t j = 0; j < hidden; j++) weighted[j] = weights[j] = h_sum[j] = 0;
        for (int64_t k = a->first[b]; k < a->first[b + 1]; k++) {
            const int64_t word = a->rows[k] * hidden;
            CAT(add_word, SFX)(weighted, weights, h_sum, (const SCALAR *)a->forget_g + at, forget_pre + word,
                               cell + word, h + word, hidden);
        }
    }
}

#undef CAT
#undef CAT_

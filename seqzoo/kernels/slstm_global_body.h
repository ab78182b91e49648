/* The S-LSTM global node's step for SCALAR (float or double), named with SFX; included twice by
 * slstm_global.c. Equations: see slstm_global.c. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

/* One word's H dimensions, added to its sentence's sums. */
static ALWAYS_INLINE void CAT(add_word, SFX)(SCALAR *restrict weighted, SCALAR *restrict weights,
                                             SCALAR *restrict h_sum, const SCALAR *restrict forget_g,
                                             const SCALAR *restrict forget_pre, const SCALAR *restrict cell,
                                             const SCALAR *restrict h, int64_t hidden) {
    for (int64_t j = 0; j < hidden; j++) {
        const SCALAR e = CAT(exp_unit, SFX)(CAT(sigmoid, SFX)(forget_g[j] + forget_pre[j])); /* (1) */
        weighted[j] += e * cell[j];                                                      /* (2) */
        weights[j] += e;
        h_sum[j] += h[j];
    }
}

/* The columns [first, first + width) of [U_g h̄ + b_g; U_o h̄ + b_o] of one sentence (4): a width of BLOCK is
 * one vector register, each row of Uᵀ read with its BLOCK lanes at a time. */
static ALWAYS_INLINE void CAT(mean_gates, SFX)(SCALAR *restrict out, const SCALAR *restrict mean,
                                               const SCALAR *restrict wt, const SCALAR *restrict bias,
                                               int64_t hidden, int64_t first, int64_t width) {
    SCALAR acc[BLOCK];
    for (int64_t l = 0; l < width; l++) acc[l] = bias[first + l];
    for (int64_t j = 0; j < hidden; j++) {
        const SCALAR m = mean[j], *row = wt + j * 2 * hidden + first;
        for (int64_t l = 0; l < width; l++) acc[l] += row[l] * m;
    }
    for (int64_t l = 0; l < width; l++) out[first + l] = acc[l];
}

/* (5) for one sentence: its new g and c_g from its gates, [U_g h̄ + b_g; U_o h̄ + b_o] (from_mean) and sums. */
static ALWAYS_INLINE void CAT(combine, SFX)(SCALAR *restrict out_g, SCALAR *restrict out_c_g,
                                            const SCALAR *restrict gates_g, const SCALAR *restrict from_mean,
                                            const SCALAR *restrict weighted, const SCALAR *restrict weights,
                                            const SCALAR *restrict c_g, int64_t hidden) {
    for (int64_t j = 0; j < hidden; j++) {
        const SCALAR gate_g = CAT(sigmoid, SFX)(gates_g[j] + from_mean[j]);
        const SCALAR gate_o = CAT(sigmoid, SFX)(gates_g[hidden + j] + from_mean[hidden + j]);
        const SCALAR e_g = CAT(exp_unit, SFX)(gate_g);
        const SCALAR c = (weighted[j] + e_g * c_g[j]) / (weights[j] + e_g);
        out_c_g[j] = c;
        out_g[j] = gate_o * CAT(tanh, SFX)(c);
    }
}

/* Sentences [begin, end); scratch holds 5H scalars a sentence: its sums (2), h̄ (3), then (4). */
CLONES static void CAT(sentence_steps, SFX)(const Args *a, int64_t begin, int64_t end, void *scratch) {
    const int64_t hidden = a->hidden, count = end - begin;
    const SCALAR *forget_pre = (const SCALAR *)a->forget_pre, *cell = (const SCALAR *)a->cell;
    const SCALAR *h = (const SCALAR *)a->h, *mean_wt = (const SCALAR *)a->mean_wt, *mean_b = (const SCALAR *)a->mean_b;
    SCALAR *weighted = scratch, *weights = weighted + count * hidden, *mean = weights + count * hidden;
    SCALAR *from_mean = mean + count * hidden; /* 2H a sentence */
    for (int64_t s = 0; s < count; s++) {                            /* (1)-(3) */
        const int64_t b = begin + s, at = s * hidden, first = a->first[b], words = a->first[b + 1] - first;
        const SCALAR *forget_g = (const SCALAR *)a->gates_g + (3 * b + 2) * hidden;
        for (int64_t j = 0; j < hidden; j++) weighted[at + j] = weights[at + j] = mean[at + j] = 0;
        for (int64_t k = first; k < first + words; k++) {
            const int64_t word = a->rows[k] * hidden;
            CAT(add_word, SFX)(weighted + at, weights + at, mean + at, forget_g, forget_pre + word, cell + word,
                               h + word, hidden);
        }
        const SCALAR n = words > 0 ? (SCALAR)words : 1;
        for (int64_t j = 0; j < hidden; j++) mean[at + j] /= n;
    }
    for (int64_t first = 0; first < 2 * hidden; first += BLOCK) /* (4): a block of Uᵀ's columns for every sentence */
        for (int64_t s = 0; s < count; s++) {
            SCALAR *out = from_mean + 2 * s * hidden;
            if (first + BLOCK <= 2 * hidden)
                CAT(mean_gates, SFX)(out, mean + s * hidden, mean_wt, mean_b, hidden, first, BLOCK);
            else
                CAT(mean_gates, SFX)(out, mean + s * hidden, mean_wt, mean_b, hidden, first, 2 * hidden - first);
        }
    for (int64_t s = 0; s < count; s++) { /* (5) */
        const int64_t b = begin + s, at = s * hidden;
        const SCALAR *gates_g = (const SCALAR *)a->gates_g + 3 * b * hidden, *c_g = (const SCALAR *)a->c_g + b * hidden;
        SCALAR *out_g = (SCALAR *)a->out_g + b * hidden, *out_c_g = (SCALAR *)a->out_c_g + b * hidden;
        CAT(combine, SFX)(out_g, out_c_g, gates_g, from_mean + 2 * s * hidden, weighted + at, weights + at, c_g,
                          hidden);
    }
}

#undef CAT
#undef CAT_

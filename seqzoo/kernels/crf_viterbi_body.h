/* One row's Viterbi decode for SCALAR (float or double; VEC/IVEC their 64-byte vector and index vector
 * types, WIDTH lanes), named with SFX; included twice by crf_viterbi.c. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

/* next[j] = max_i (prev[i] + A[i, j]) over the previous tags i in cand (count of them, ascending) and
 * arg[j] its lowest maximising i, for the tags j in [from, to): WIDTH tags at a time in vector registers
 * (a strict > over ascending i keeps the lowest on ties), the rest one by one. */
CLONES static void CAT(max_plus, SFX)(const SCALAR *restrict prev, const SCALAR *restrict trans,
                                      const int32_t *restrict cand, int count, int64_t tags, int64_t from,
                                      int64_t to, SCALAR *restrict next, int32_t *restrict arg) {
    int64_t j = from;
    for (; j + WIDTH <= to; j += WIDTH) {
        VEC best, v;
        IVEC at = (IVEC){0} + cand[0];
        memcpy(&best, trans + cand[0] * tags + j, sizeof best);
        best += prev[cand[0]];
        for (int c = 1; c < count; c++) {
            memcpy(&v, trans + cand[c] * tags + j, sizeof v);
            v += prev[cand[c]];
            const IVEC better = v > best;
            best = (VEC)((better & (IVEC)v) | (~better & (IVEC)best));
            at = (better & cand[c]) | (~better & at);
        }
        memcpy(next + j, &best, sizeof best);
        for (int l = 0; l < WIDTH; l++) arg[j + l] = (int32_t)at[l];
    }
    for (; j < to; j++) {
        SCALAR b = prev[cand[0]] + trans[cand[0] * tags + j];
        int32_t a = cand[0];
        for (int c = 1; c < count; c++) {
            const SCALAR v = prev[cand[c]] + trans[cand[c] * tags + j];
            if (v > b) {
                b = v;
                a = cand[c];
            }
        }
        next[j] = b;
        arg[j] = a;
    }
}

/* One step of the recursion into next and arg (K each); all is every previous tag 0..K-1. With many
 * tags (K >= 4 PRUNE) only the PRUNE best previous tags are tried first: every other i has
 * prev[i] <= floor (the PRUNE-th best), so a tag j whose best exceeds floor + max_i A[i, j] is exact;
 * a block of WIDTH tags holding one that is not (or a NaN) is redone over every previous tag. */
static void CAT(viterbi_step, SFX)(const Args *a, const SCALAR *restrict prev, const SCALAR *restrict emit,
                                   SCALAR *restrict next, int32_t *restrict arg, int32_t *restrict cand) {
    const int64_t tags = a->tags;
    const SCALAR *trans = a->trans;
    const int32_t *all = a->all;
    if (tags < 4 * PRUNE) {
        CAT(max_plus, SFX)(prev, trans, all, (int)tags, tags, 0, tags, next, arg);
    } else {
        SCALAR top[PRUNE];
        int count = 0; /* insertion into the PRUNE best by score, then sorted by index */
        for (int64_t i = 0; i < tags; i++) {
            const SCALAR v = prev[i];
            if (count == PRUNE && !(v > top[PRUNE - 1])) continue;
            int k = count < PRUNE ? count++ : PRUNE - 1;
            for (; k > 0 && v > top[k - 1]; k--) {
                top[k] = top[k - 1];
                cand[k] = cand[k - 1];
            }
            top[k] = v;
            cand[k] = (int32_t)i;
        }
        const SCALAR floor = top[PRUNE - 1], *col_max = a->col_max;
        for (int k = 1; k < PRUNE; k++) { /* ascending indices: the lowest wins ties in max_plus */
            const int32_t c = cand[k];
            int m = k;
            for (; m > 0 && cand[m - 1] > c; m--) cand[m] = cand[m - 1];
            cand[m] = c;
        }
        CAT(max_plus, SFX)(prev, trans, cand, PRUNE, tags, 0, tags, next, arg);
        for (int64_t from = 0; from < tags; from += WIDTH) {
            const int64_t to = from + WIDTH < tags ? from + WIDTH : tags;
            int exact = 1;
            for (int64_t j = from; j < to; j++) exact &= next[j] > floor + col_max[j];
            if (!exact) CAT(max_plus, SFX)(prev, trans, all, (int)tags, tags, from, to, next, arg);
        }
    }
    for (int64_t j = 0; j < tags; j++) next[j] += emit[j];
}

static void CAT(viterbi_row, SFX)(const Args *a, int64_t b, int32_t *back, void *scratch) {
    const int64_t tags = a->tags, time = a->time, length = a->lengths[b];
    const SCALAR *emissions = (const SCALAR *)a->emissions + b * time * tags;
    const SCALAR *start = a->start, *end = a->end;
    int64_t *path = a->paths + b * time;
    SCALAR *delta = scratch, *next = delta + tags;
    int32_t *cand = (int32_t *)(next + tags);
    for (int64_t t = length; t < time; t++) path[t] = -1;
    if (length == 0) {
        ((SCALAR *)a->scores)[b] = 0;
        return;
    }
    for (int64_t j = 0; j < tags; j++) delta[j] = start[j] + emissions[j];
    for (int64_t t = 1; t < length; t++) {
        CAT(viterbi_step, SFX)(a, delta, emissions + t * tags, next, back + t * tags, cand);
        SCALAR *swap = delta;
        delta = next;
        next = swap;
    }
    int64_t last = 0;
    SCALAR best = delta[0] + end[0];
    for (int64_t j = 1; j < tags; j++) {
        const SCALAR v = delta[j] + end[j];
        if (v > best) {
            best = v;
            last = j;
        }
    }
    ((SCALAR *)a->scores)[b] = best;
    path[length - 1] = last;
    for (int64_t t = length - 1; t > 0; t--) path[t - 1] = back[t * tags + path[t]];
}

/* max_i A[i, j] into a->col_max: the bound of the pruned steps. */
static void CAT(prepare, SFX)(Args *a) {
    const int64_t tags = a->tags;
    const SCALAR *trans = a->trans;
    SCALAR *col_max = a->col_max;
    for (int64_t j = 0; j < tags; j++) col_max[j] = trans[j];
    for (int64_t i = 1; i < tags; i++) {
        for (int64_t j = 0; j < tags; j++) col_max[j] = trans[i * tags + j] > col_max[j] ? trans[i * tags + j] : col_max[j];
    }
}

#undef CAT
#undef CAT_

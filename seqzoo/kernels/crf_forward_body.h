/* The forward and backward algorithms of one CRF row for SCALAR (float or double), in scaled exp space,
 * named with SFX (EXP its exp); included twice by crf_forward.c. Equations: see crf_forward.c. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

/* out[j] = sum_i x[i] M[i, j] for M (n, n) row-major: one row of M times x[i] added per i, so the inner
 * loop runs over contiguous j and vectorises without reordering a sum. */
static inline void CAT(vec_mat, SFX)(const SCALAR *restrict x, const SCALAR *restrict m, int64_t n,
                                     SCALAR *restrict out) {
    for (int64_t j = 0; j < n; j++) out[j] = 0;
    for (int64_t i = 0; i < n; i++) {
        const SCALAR xi = x[i], *restrict row = m + i * n;
        for (int64_t j = 0; j < n; j++) out[j] += xi * row[j];
    }
}

static inline SCALAR CAT(max_of, SFX)(const SCALAR *x, int64_t n) {
    SCALAR m = x[0];
    for (int64_t j = 1; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

/* acc[i, j] += sum_c before[c][i] q[c K + j] over count pairs (eq. 6): four at a time, so that a pass over
 * acc, which is K x K and may not fit in L1, adds four steps' terms. */
static inline void CAT(add_pairs, SFX)(const SCALAR *const *before, const SCALAR *q, int count, int64_t tags,
                                       SCALAR *restrict acc) {
    int c = 0;
    for (; c + 4 <= count; c += 4) {
        const SCALAR *q0 = q + c * tags, *q1 = q0 + tags, *q2 = q1 + tags, *q3 = q2 + tags;
        for (int64_t i = 0; i < tags; i++) {
            const SCALAR w0 = before[c][i], w1 = before[c + 1][i], w2 = before[c + 2][i], w3 = before[c + 3][i];
            SCALAR *restrict row = acc + i * tags;
            for (int64_t j = 0; j < tags; j++) row[j] += w0 * q0[j] + w1 * q1[j] + w2 * q2[j] + w3 * q3[j];
        }
    }
    for (; c < count; c++) {
        for (int64_t i = 0; i < tags; i++) {
            const SCALAR w = before[c][i], *qc = q + c * tags;
            SCALAR *restrict row = acc + i * tags;
            for (int64_t j = 0; j < tags; j++) row[j] += w * qc[j];
        }
    }
}

/* exp(trans - max) (K, K), its transpose, exp(start - max), exp(end - max) and the three maxima. */
static void CAT(prepare, SFX)(const Args *a, Shared *s) {
    const int64_t tags = a->tags;
    const SCALAR *trans = a->trans, *start = a->start, *end = a->end;
    SCALAR *e = s->exp_trans, *et = s->exp_trans_t, *es = s->exp_start, *ee = s->exp_end;
    const SCALAR tmax = CAT(max_of, SFX)(trans, tags * tags), smax = CAT(max_of, SFX)(start, tags);
    const SCALAR emax = CAT(max_of, SFX)(end, tags);
    for (int64_t i = 0; i < tags; i++) {
        for (int64_t j = 0; j < tags; j++) et[j * tags + i] = e[i * tags + j] = EXP(trans[i * tags + j] - tmax);
        es[i] = EXP(start[i] - smax);
        ee[i] = EXP(end[i] - emax);
    }
    s->shift_trans = tmax;
    s->shift_ends = (double)smax + (double)emax;
}

/* Row b's log Z into a->log_z[b] (0 without tokens), a_t (K) per real step into a->alpha and n_t into
 * a->norm. Returns 1 where a normaliser fell under sqrt(tiny) (exp space would lose precision), else 0. */
CLONES static int CAT(forward_row, SFX)(const Args *a, const Shared *s, int64_t b) {
    const int64_t tags = a->tags, time = a->time, length = a->lengths[b];
    const SCALAR *emissions = (const SCALAR *)a->emissions + b * time * tags;
    SCALAR *alpha = (SCALAR *)a->alpha + b * time * tags, *norm = (SCALAR *)a->norm + b * time;
    const SCALAR *exp_trans = s->exp_trans, *exp_start = s->exp_start, *exp_end = s->exp_end;
    const SCALAR tiny = TINY;
    if (length == 0) {
        ((SCALAR *)a->log_z)[b] = 0;
        return 0;
    }
    double log_z = s->shift_ends + (double)(length - 1) * (double)s->shift_trans;
    for (int64_t t = 0; t < length; t++) {
        const SCALAR *e = emissions + t * tags;
        SCALAR *cur = alpha + t * tags;
        const SCALAR m = CAT(max_of, SFX)(e, tags);
        if (t == 0) {
            for (int64_t j = 0; j < tags; j++) cur[j] = exp_start[j];
        } else {
            CAT(vec_mat, SFX)(cur - tags, exp_trans, tags, cur); /* (eq. 2) a_{t-1} @ E */
        }
        SCALAR n = 0;
        for (int64_t j = 0; j < tags; j++) {
            cur[j] *= EXP(e[j] - m); /* (eq. 2) times w_t */
            n += cur[j];
        }
        if (!(n >= tiny)) return 1;
        for (int64_t j = 0; j < tags; j++) cur[j] /= n;
        norm[t] = n;
        log_z += log((double)n) + (double)m; /* (eq. 3) */
    }
    const SCALAR *last = alpha + (length - 1) * tags;
    SCALAR final = 0;
    for (int64_t j = 0; j < tags; j++) final += last[j] * exp_end[j];
    if (!(final >= tiny)) return 1;
    ((SCALAR *)a->log_z)[b] = (SCALAR)(log_z + log((double)final));
    return 0;
}

/* Row b's share of the gradients times g = grad[b]: p_t g into a->grad_emissions (0 at pads), and into the
 * thread's accumulators p_0 g (start), p_{L-1} g (end) and sum_t a_{t-1}[i] r_t[j] g / (n_t S_t) (transitions,
 * still to be multiplied by E[i, j]). scratch holds (3 + PAIRS) K. Returns 1 where precision would be lost, else 0. */
CLONES static int CAT(backward_row, SFX)(const Args *a, const Shared *s, int64_t b, SCALAR *scratch,
                                         SCALAR *acc_start, SCALAR *acc_trans, SCALAR *acc_end) {
    const int64_t tags = a->tags, time = a->time, length = a->lengths[b];
    const SCALAR *emissions = (const SCALAR *)a->emissions + b * time * tags;
    const SCALAR *alpha = (const SCALAR *)a->alpha + b * time * tags, *norm = (const SCALAR *)a->norm + b * time;
    SCALAR *grad_e = (SCALAR *)a->grad_emissions + b * time * tags;
    const SCALAR g = ((const SCALAR *)a->grad)[b], tiny = TINY;
    SCALAR *beta = scratch, *prev = beta + tags, *r = prev + tags, *q = r + tags; /* q: PAIRS x K */
    const SCALAR *before[PAIRS]; /* the a_{t-1} of the pending pair terms */
    int pending = 0;
    for (int64_t i = length * tags; i < time * tags; i++) grad_e[i] = 0;
    if (length == 0) return 0;
    const SCALAR *exp_end = s->exp_end, *exp_trans_t = s->exp_trans_t;
    for (int64_t j = 0; j < tags; j++) beta[j] = exp_end[j]; /* b_{L-1} */
    for (int64_t t = length - 1;; t--) {
        const SCALAR *at = alpha + t * tags, *e = emissions + t * tags;
        SCALAR *p = grad_e + t * tags, total = 0;
        for (int64_t j = 0; j < tags; j++) {
            p[j] = at[j] * beta[j];
            total += p[j];
        }
        if (!(total >= tiny)) return 1;
        for (int64_t j = 0; j < tags; j++) p[j] = p[j] / total * g; /* (eq. 5) p_t g */
        if (t == length - 1) {
            for (int64_t j = 0; j < tags; j++) acc_end[j] += p[j];
        }
        if (t == 0) {
            for (int64_t j = 0; j < tags; j++) acc_start[j] += p[j];
            CAT(add_pairs, SFX)(before, q, pending, tags, acc_trans);
            return 0;
        }
        const SCALAR m = CAT(max_of, SFX)(e, tags);
        for (int64_t j = 0; j < tags; j++) r[j] = EXP(e[j] - m) * beta[j]; /* r_t = w_t b_t */
        const SCALAR c = g / (norm[t] * total);
        SCALAR *qt = q + pending * tags;
        for (int64_t j = 0; j < tags; j++) qt[j] = r[j] * c; /* (eq. 6) p_t(i, j) g = a_{t-1}[i] E[i, j] q_t[j] */
        before[pending++] = at - tags;
        if (pending == PAIRS) {
            CAT(add_pairs, SFX)(before, q, pending, tags, acc_trans);
            pending = 0;
        }
        CAT(vec_mat, SFX)(r, exp_trans_t, tags, prev); /* (eq. 4) b_{t-1}[i] = sum_j E[i, j] r_t[j] */
        SCALAR sum = 0;
        for (int64_t i = 0; i < tags; i++) sum += prev[i];
        if (!(sum >= tiny)) return 1;
        for (int64_t i = 0; i < tags; i++) beta[i] = prev[i] / sum;
    }
}

/* The thread ranges' accumulators summed in order into grad_start, grad_trans (times E, eq. 6) and grad_end. */
static void CAT(finish_backward, SFX)(const Args *a, const Shared *s, const Range *ranges, int64_t count,
                                      SCALAR *grad_start, SCALAR *grad_trans, SCALAR *grad_end) {
    const int64_t tags = a->tags, pairs = tags * tags;
    const SCALAR *exp_trans = s->exp_trans;
    memset(grad_start, 0, (size_t)tags * sizeof(SCALAR));
    memset(grad_end, 0, (size_t)tags * sizeof(SCALAR));
    memset(grad_trans, 0, (size_t)pairs * sizeof(SCALAR));
    for (int64_t r = 0; r < count; r++) {
        const SCALAR *acc = ranges[r].acc;
        for (int64_t j = 0; j < tags; j++) {
            grad_start[j] += acc[j];
            grad_end[j] += acc[tags + j];
        }
        for (int64_t k = 0; k < pairs; k++) grad_trans[k] += acc[2 * tags + k];
    }
    for (int64_t k = 0; k < pairs; k++) grad_trans[k] *= exp_trans[k];
}

#undef CAT
#undef CAT_

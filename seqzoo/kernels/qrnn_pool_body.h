/* Kernel bodies for one scalar type; included by qrnn_pool.c with SCALAR and SFX defined (sigmoid and tanh:
 * vector_math.h).
 * The per-step loops over channels are specialised (inlined with constant pooling / keep flags)
 * so that they compile to branch-free vector code. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

/* Zoneout scale of 1 - f (eq. 6), and of i with ifo-pooling (a zoned-out channel keeps its state): the keep
 * mask in training, keep_prob (1 - p) at evaluation. */
#define SCALE(j) (has_keep ? kp * keep[j] : kp)

/* One time step of the forward recurrence for n channels; c is the running state, b the bias. With
 * store, the step's gates g are replaced by their activations z, f, o, i (what the backward reads). */
static ALWAYS_INLINE void FN(forward_step)(int pooling, int has_keep, int store, int64_t n, int64_t H,
                                           SCALAR *restrict g, const SCALAR *restrict b,
                                           const uint8_t *restrict keep, SCALAR kp, SCALAR *restrict c,
                                           SCALAR *restrict h) {
    SCALAR *gz = g, *gf = g + H, *go = g + 2 * H, *gi = g + 3 * H;
    const SCALAR *bf = b + BLOCK, *bo = b + 2 * BLOCK, *bi = b + 3 * BLOCK;
    for (int64_t j = 0; j < n; j++) {
        const SCALAR z = FN(tanh)(gz[j] + b[j]), f = FN(sigmoid)(gf[j] + bf[j]); /* eq. 1 */
        const SCALAR scale = SCALE(j), leak = (1 - f) * scale;                    /* 1 - f after zoneout, eq. 6 */
        const SCALAR o = pooling == POOL_F ? 1 : FN(sigmoid)(go[j] + bo[j]);
        const SCALAR i = pooling == POOL_IFO ? FN(sigmoid)(gi[j] + bi[j]) : 0;
        if (pooling == POOL_IFO) {
            c[j] = (1 - leak) * c[j] + i * scale * z;                             /* eq. 5 */
        } else {
            c[j] += leak * (z - c[j]);                                            /* eqs. 3-4: f c + (1 - f) z */
        }
        h[j] = pooling == POOL_F ? c[j] : o * c[j];
        if (store) {
            gz[j] = z;
            gf[j] = f;
            if (pooling != POOL_F) go[j] = o;
            if (pooling == POOL_IFO) gi[j] = i;
        }
    }
}

/* The cell states again, from the activations a training forward stored: c = the state after the
 * step, cp the one before (the same arithmetic as forward_step). */
static ALWAYS_INLINE void FN(cell_step)(int pooling, int has_keep, int64_t n, int64_t H, const SCALAR *restrict g,
                                        const uint8_t *restrict keep, SCALAR kp, const SCALAR *restrict cp,
                                        SCALAR *restrict c) {
    const SCALAR *gz = g, *gf = g + H, *gi = g + 3 * H;
    for (int64_t j = 0; j < n; j++) {
        const SCALAR scale = SCALE(j), leak = (1 - gf[j]) * scale;
        c[j] = pooling == POOL_IFO ? (1 - leak) * cp[j] + gi[j] * scale * gz[j] : cp[j] + leak * (gz[j] - cp[j]);
    }
}

/* One time step of the backward recurrence: overwrites the step's activations g (stored by the
 * forward) with the gradients of the gate pre-activations, adds those to db, and turns
 * dc = dL/dc_t into dL/dc_{t-1}. */
static ALWAYS_INLINE void FN(backward_step)(int pooling, int has_keep, int64_t n, int64_t H, SCALAR *restrict g,
                                            const uint8_t *restrict keep, SCALAR kp, const SCALAR *restrict c,
                                            const SCALAR *restrict cp, const SCALAR *restrict dh,
                                            SCALAR *restrict dc, SCALAR *restrict db) {
    SCALAR *gz = g, *gf = g + H, *go = g + 2 * H, *gi = g + 3 * H;
    SCALAR *dbf = db + BLOCK, *dbo = db + 2 * BLOCK, *dbi = db + 3 * BLOCK;
    for (int64_t j = 0; j < n; j++) {
        const SCALAR z = gz[j], f = gf[j];
        const SCALAR scale = SCALE(j), leak = (1 - f) * scale;
        SCALAR dct = dc[j];
        if (pooling == POOL_F) {
            dct += dh[j];
        } else {
            const SCALAR o = go[j];
            const SCALAR dot = dh[j] * c[j] * o * (1 - o);
            go[j] = dot;
            dbo[j] += dot;
            dct += dh[j] * o;
        }
        SCALAR dzt, dft;
        if (pooling == POOL_IFO) {
            const SCALAR i = gi[j];
            const SCALAR dit = dct * scale * z * i * (1 - i);
            gi[j] = dit;
            dbi[j] += dit;
            dzt = dct * scale * i;
            dft = dct * cp[j] * scale * f * (1 - f);
        } else {
            dzt = dct * leak;
            dft = -dct * (z - cp[j]) * scale * f * (1 - f);
        }
        dzt *= 1 - z * z;
        gz[j] = dzt;
        gf[j] = dft;
        db[j] += dzt;
        dbf[j] += dft;
        dc[j] = dct * (1 - leak);
    }
}

#define DISPATCH(step, ...)                                                          \
    do {                                                                            \
        if (a->pooling == POOL_F) {                                                 \
            if (keep) step(POOL_F, 1, __VA_ARGS__); else step(POOL_F, 0, __VA_ARGS__);       \
        } else if (a->pooling == POOL_FO) {                                         \
            if (keep) step(POOL_FO, 1, __VA_ARGS__); else step(POOL_FO, 0, __VA_ARGS__);     \
        } else {                                                                    \
            if (keep) step(POOL_IFO, 1, __VA_ARGS__); else step(POOL_IFO, 0, __VA_ARGS__);   \
        }                                                                           \
    } while (0)

/* Work item = batch row b, channels [j0, j0 + n); steps s = 0..len-1 visit time len-1-s if reverse.
 * Gate rows are b * gate_time + t (gate_time >= T: a QRNN layer's matmul output has k - 1 spare
 * rows per batch row); every other (B, T, ...) tensor has rows b * T + t. */
#define ITEM_SETUP                                                                  \
    const int64_t H = a->hidden, T = a->time, nblk = (H + BLOCK - 1) / BLOCK;       \
    const int64_t b = item / nblk, j0 = (item % nblk) * BLOCK;                      \
    const int64_t n = H - j0 < BLOCK ? H - j0 : BLOCK, len = a->lengths[b];          \
    const int G = a->pooling == POOL_F ? 2 : a->pooling == POOL_FO ? 3 : 4;         \
    const SCALAR kp = (SCALAR)a->keep_prob;                                         \
    SCALAR zeros[BLOCK] = {0};                                                      \
    const SCALAR *c0 = a->c0 ? (const SCALAR *)a->c0 + b * H + j0 : zeros;

#define ROW(s) (b * T + (a->reverse ? len - 1 - (s) : (s)))
#define GATES(gates, s) ((SCALAR *)(gates) + (ROW(s) + b * (a->gate_time - T)) * G * H + j0)
#define KEEP(row) (a->keep ? a->keep + (row) * H + j0 : NULL)

/* With a->store (training), also replaces the gates by their activations (what the backward reads). */
CLONES static void FN(forward)(const Args *a, int64_t item, void *scratch) {
    ITEM_SETUP
    (void)scratch;
    SCALAR c[BLOCK], bias[4 * BLOCK] = {0};
    memcpy(c, c0, n * sizeof(SCALAR));
    for (int g = 0; a->bias && g < G; g++) memcpy(bias + g * BLOCK, (const SCALAR *)a->bias + g * H + j0, n * sizeof(SCALAR));
    for (int64_t t = len; t < T; t++) memset((SCALAR *)a->h + (b * T + t) * H + j0, 0, n * sizeof(SCALAR));
    for (int64_t s = 0; s < len; s++) {
        const int64_t row = ROW(s);
        const uint8_t *keep = KEEP(row);
        SCALAR *g = GATES(a->gates, s), *h = (SCALAR *)a->h + row * H + j0;
        if (a->store) {
            DISPATCH(FN(forward_step), 1, n, H, g, bias, keep, kp, c, h);
        } else {
            DISPATCH(FN(forward_step), 0, n, H, g, bias, keep, kp, c, h);
        }
    }
    memcpy((SCALAR *)a->c_last + b * H + j0, c, n * sizeof(SCALAR));
}

/* Overwrites the activations with d(gates); rows that no real step writes are zeroed: pads, and the
 * spare rows between batch rows. The cell states are recomputed into scratch (T x BLOCK, stays in
 * cache) rather than stored by the forward: cheaper than writing and reading them back. */
CLONES static void FN(backward)(const Args *a, int64_t item, void *scratch) {
    ITEM_SETUP
    SCALAR *cells = (SCALAR *)scratch; /* cells + s * BLOCK: the state after step s */
    SCALAR dc[BLOCK], db[4 * BLOCK] = {0};
    for (int64_t s = 0; s < len; s++) {
        const uint8_t *keep = KEEP(ROW(s));
        DISPATCH(FN(cell_step), n, H, GATES(a->gates, s), keep, kp, s > 0 ? cells + (s - 1) * BLOCK : c0,
                 cells + s * BLOCK);
    }
    memcpy(dc, a->dc_last ? (const SCALAR *)a->dc_last + b * H + j0 : zeros, n * sizeof(SCALAR));
    const int64_t rows = b == a->batch - 1 ? T : a->gate_time;
    for (int64_t t = len; t < rows; t++) {
        SCALAR *dg = (SCALAR *)a->gates + (b * a->gate_time + t) * G * H + j0;
        for (int g = 0; g < G; g++) memset(dg + g * H, 0, n * sizeof(SCALAR));
    }
    for (int64_t s = len - 1; s >= 0; s--) {
        const int64_t row = ROW(s);
        const uint8_t *keep = KEEP(row);
        DISPATCH(FN(backward_step), n, H, GATES(a->gates, s), keep, kp, cells + s * BLOCK,
                 s > 0 ? cells + (s - 1) * BLOCK : c0, (const SCALAR *)a->dh + row * H + j0, dc, db);
    }
    memcpy((SCALAR *)a->dc0 + b * H + j0, dc, n * sizeof(SCALAR));
    for (int g = 0; g < G; g++) {
        memcpy((SCALAR *)a->dbias + (b * G + g) * H + j0, db + g * BLOCK, n * sizeof(SCALAR));
    }
}

#undef KEEP
#undef GATES
#undef ROW
#undef ITEM_SETUP
#undef DISPATCH
#undef SCALE
#undef FN
#undef CAT
#undef CAT_

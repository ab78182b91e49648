/* Kernel bodies for one scalar type; included by qrnn_pool.c with SCALAR, SFX and EXP defined.
 * The per-step loops over channels are specialised (inlined with constant pooling / keep flags)
 * so that they compile to branch-free vector code. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

static inline SCALAR FN(sigmoid)(SCALAR x) { return 1 / (1 + EXP(-x)); }
static inline SCALAR FN(tanh)(SCALAR x) { return 1 - 2 / (EXP(2 * x) + 1); }

/* Zoneout scale of 1 - f (eq. 6): the keep mask in training, keep_prob (1 - p) at evaluation. */
#define SCALE(j) (has_keep ? kp * keep[j] : kp)

/* One time step of the forward recurrence for n channels; c is the running state. */
static ALWAYS_INLINE void FN(forward_step)(int pooling, int has_keep, int64_t n, int64_t H, const SCALAR *restrict gz,
                                           const uint8_t *restrict keep, SCALAR kp, SCALAR *restrict c,
                                           SCALAR *restrict h) {
    const SCALAR *gf = gz + H, *go = gz + 2 * H, *gi = gz + 3 * H;
    for (int64_t j = 0; j < n; j++) {
        const SCALAR z = FN(tanh)(gz[j]);                          /* eq. 1 */
        const SCALAR leak = (1 - FN(sigmoid)(gf[j])) * SCALE(j);   /* 1 - f after zoneout, eq. 6 */
        if (pooling == POOL_IFO) {
            c[j] = (1 - leak) * c[j] + FN(sigmoid)(gi[j]) * z;     /* eq. 5 */
        } else {
            c[j] += leak * (z - c[j]);                             /* eqs. 3-4: f c + (1 - f) z */
        }
        h[j] = pooling == POOL_F ? c[j] : FN(sigmoid)(go[j]) * c[j];
    }
}

/* One time step of the backward recurrence: writes d(gates) and turns dc = dL/dc_t into dL/dc_{t-1}. */
static ALWAYS_INLINE void FN(backward_step)(int pooling, int has_keep, int64_t n, int64_t H, const SCALAR *restrict gz,
                                            const uint8_t *restrict keep, SCALAR kp, const SCALAR *restrict c,
                                            const SCALAR *restrict cp, const SCALAR *restrict dh,
                                            SCALAR *restrict dc, SCALAR *restrict dz) {
    const SCALAR *gf = gz + H, *go = gz + 2 * H, *gi = gz + 3 * H;
    SCALAR *df = dz + H, *d_o = dz + 2 * H, *di = dz + 3 * H;
    for (int64_t j = 0; j < n; j++) {
        const SCALAR z = FN(tanh)(gz[j]), f = FN(sigmoid)(gf[j]);
        const SCALAR scale = SCALE(j), leak = (1 - f) * scale;
        SCALAR dct = dc[j];
        if (pooling == POOL_F) {
            dct += dh[j];
        } else {
            const SCALAR o = FN(sigmoid)(go[j]);
            d_o[j] = dh[j] * c[j] * o * (1 - o);
            dct += dh[j] * o;
        }
        SCALAR dzt;
        if (pooling == POOL_IFO) {
            const SCALAR i = FN(sigmoid)(gi[j]);
            di[j] = dct * z * i * (1 - i);
            dzt = dct * i;
            df[j] = dct * cp[j] * scale * f * (1 - f);
        } else {
            dzt = dct * leak;
            df[j] = -dct * (z - cp[j]) * scale * f * (1 - f);
        }
        dz[j] = dzt * (1 - z * z);
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

/* Work item = batch row b, channels [j0, j0 + n); steps s = 0..len-1 visit time len-1-s if reverse. */
#define ITEM_SETUP                                                                  \
    const int64_t H = a->hidden, T = a->time, nblk = (H + BLOCK - 1) / BLOCK;       \
    const int64_t b = item / nblk, j0 = (item % nblk) * BLOCK;                      \
    const int64_t n = H - j0 < BLOCK ? H - j0 : BLOCK, len = a->lengths[b];          \
    const int G = a->pooling == POOL_F ? 2 : a->pooling == POOL_FO ? 3 : 4;         \
    const SCALAR kp = (SCALAR)a->keep_prob;                                         \
    SCALAR zeros[BLOCK] = {0};                                                      \
    const SCALAR *c0 = a->c0 ? (const SCALAR *)a->c0 + b * H + j0 : zeros;

#define ROW(s) (b * T + (a->reverse ? len - 1 - (s) : (s)))
#define KEEP(row) (a->keep ? a->keep + (row) * H + j0 : NULL)

CLONES static void FN(forward)(const Args *a, int64_t item) {
    ITEM_SETUP
    SCALAR c[BLOCK];
    memcpy(c, c0, n * sizeof(SCALAR));
    for (int64_t t = len; t < T; t++) memset((SCALAR *)a->h + (b * T + t) * H + j0, 0, n * sizeof(SCALAR));
    for (int64_t s = 0; s < len; s++) {
        const int64_t row = ROW(s);
        const SCALAR *gz = (const SCALAR *)a->gates + row * G * H + j0;
        const uint8_t *keep = KEEP(row);
        DISPATCH(FN(forward_step), n, H, gz, keep, kp, c, (SCALAR *)a->h + row * H + j0);
        if (a->c_all_out) memcpy((SCALAR *)a->c_all_out + row * H + j0, c, n * sizeof(SCALAR));
    }
    memcpy((SCALAR *)a->c_last + b * H + j0, c, n * sizeof(SCALAR));
}

CLONES static void FN(backward)(const Args *a, int64_t item) {
    ITEM_SETUP
    const SCALAR *c_all = (const SCALAR *)a->c_all;
    SCALAR dc[BLOCK];
    memcpy(dc, a->dc_last ? (const SCALAR *)a->dc_last + b * H + j0 : zeros, n * sizeof(SCALAR));
    for (int64_t t = len; t < T; t++) {
        for (int g = 0; g < G; g++) memset((SCALAR *)a->dgates + ((b * T + t) * G + g) * H + j0, 0, n * sizeof(SCALAR));
    }
    for (int64_t s = len - 1; s >= 0; s--) {
        const int64_t row = ROW(s);
        const SCALAR *gz = (const SCALAR *)a->gates + row * G * H + j0;
        const SCALAR *cp = s > 0 ? c_all + ROW(s - 1) * H + j0 : c0;
        const uint8_t *keep = KEEP(row);
        DISPATCH(FN(backward_step), n, H, gz, keep, kp, c_all + row * H + j0, cp, (const SCALAR *)a->dh + row * H + j0,
                 dc, (SCALAR *)a->dgates + row * G * H + j0);
    }
    memcpy((SCALAR *)a->dc0 + b * H + j0, dc, n * sizeof(SCALAR));
}

#undef KEEP
#undef ROW
#undef ITEM_SETUP
#undef DISPATCH
#undef SCALE
#undef FN
#undef CAT
#undef CAT_

/* exp, sigmoid and tanh for the kernels' element-wise loops: branch-free in float32, so that GCC vectorises
 * the loops that call them (libm's expf is a scalar call); float64 takes libm's exp. tanh is written through
 * exp in both, 1 - 2 / (exp(2x) + 1): off by a few ulps of 1 in absolute terms (more in relative terms near 0).
 *
 * exp_f32 is Cephes' expf: x = n ln 2 + r with |r| <= ln 2 / 2 (n rounded by adding and subtracting 1.5 * 2^23,
 * ln 2 split in two for an exact product), exp(r) by a polynomial, 2^n put into the exponent bits; relative
 * error about 2e-7 over [-87, 88], to which x is clamped (the result stays normal, and sigmoid and tanh
 * saturate correctly beyond). exp_unit_f32 serves arguments in [0, 1] at half the operations.
 */
#ifndef SEQZOO_KERNELS_VECTOR_MATH_H
#define SEQZOO_KERNELS_VECTOR_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float exp_f32(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* exp(y) for y in [0, 1] only (a gate value: the S-LSTM's softmaxes over sigmoids): e^0.5 e^t, t = y - 0.5,
 * by its Taylor polynomial of degree 8 in t (|t| <= 1/2: truncation 6e-9 relative), no range reduction;
 * relative error about 1.5e-7 in float32. */
static inline float exp_unit_f32(float y) {
    const float t = y - 0.5f;
    float p = 4.0890904531e-5f;
    p = p * t + 3.2712723625e-4f;
    p = p * t + 2.2898906538e-3f;
    p = p * t + 1.3739343923e-2f;
    p = p * t + 6.8696719613e-2f;
    p = p * t + 2.7478687845e-1f;
    p = p * t + 8.2436063535e-1f;
    p = p * t + 1.6487212707e+0f;
    return p * t + 1.6487212707e+0f;
}

static inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

static inline float tanh_f32(float x) { return 1.0f - 2.0f / (exp_f32(2.0f * x) + 1.0f); }

static inline double exp_f64(double x) { return exp(x); }

static inline double exp_unit_f64(double y) { return exp(y); }

static inline double sigmoid_f64(double x) { return 1.0 / (1.0 + exp(-x)); }

static inline double tanh_f64(double x) { return 1.0 - 2.0 / (exp(2.0 * x) + 1.0); }

#endif

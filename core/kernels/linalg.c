/* core/kernels/linalg.c — Householder QR and Jacobi eigendecomposition (doubles).
 *
 * Accuracy matters more than speed here: both run once per (layer, KV head)
 * on Hd×Hd matrices when feature maps are built, and their outputs decide the
 * random features every later token sees.
 */
#include "core/kernels/linalg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

int core_linalg_qr(int n, double *a, double *q)
{
    if (n < 1)
        return CORE_EINVAL;
    double *v = malloc((size_t)n * sizeof *v); /* [n] Householder vector */
    if (!v)
        return CORE_ENOMEM;
    size_t nn = (size_t)n;
    for (size_t i = 0; i < nn; i++)
        for (size_t j = 0; j < nn; j++)
            q[i * nn + j] = i == j ? 1.0 : 0.0;

    for (size_t k = 0; k < nn; k++) {
        double norm2 = 0.0;
        for (size_t i = k; i < nn; i++)
            norm2 += a[i * nn + k] * a[i * nn + k];
        if (norm2 == 0.0)
            continue;
        /* Reflect x onto -sign(x0)|x| e1 so v = x - alpha e1 never cancels. */
        double alpha = a[k * nn + k] > 0.0 ? -sqrt(norm2) : sqrt(norm2);
        double vnorm2 = 0.0;
        for (size_t i = k; i < nn; i++) {
            v[i] = a[i * nn + k] - (i == k ? alpha : 0.0);
            vnorm2 += v[i] * v[i];
        }
        if (vnorm2 == 0.0)
            continue;
        double inv = 2.0 / vnorm2;
        /* A <- H A on rows k.., columns k.. */
        for (size_t j = k; j < nn; j++) {
            double s = 0.0;
            for (size_t i = k; i < nn; i++)
                s += v[i] * a[i * nn + j];
            s *= inv;
            for (size_t i = k; i < nn; i++)
                a[i * nn + j] -= s * v[i];
        }
        for (size_t i = k + 1; i < nn; i++)
            a[i * nn + k] = 0.0;
        /* Q <- Q H, so that at the end Q = H_0 H_1 ... and a = Q R. */
        for (size_t r = 0; r < nn; r++) {
            double s = 0.0;
            for (size_t i = k; i < nn; i++)
                s += q[r * nn + i] * v[i];
            s *= inv;
            for (size_t i = k; i < nn; i++)
                q[r * nn + i] -= s * v[i];
        }
    }
    free(v);
    return 0;
}

int core_linalg_eigh(int n, double *a, double *w, double *v)
{
    if (n < 1)
        return CORE_EINVAL;
    size_t nn = (size_t)n;
    double total = 0.0;
    for (size_t i = 0; i < nn; i++) {
        for (size_t j = i; j < nn; j++) {
            double s = 0.5 * (a[i * nn + j] + a[j * nn + i]);
            a[i * nn + j] = a[j * nn + i] = s;
            total += (i == j ? 1.0 : 2.0) * s * s;
        }
        for (size_t j = 0; j < nn; j++)
            v[i * nn + j] = i == j ? 1.0 : 0.0;
    }
    if (!isfinite(total))
        return CORE_ERANGE;

    int converged = 0;
    for (int sweep = 0; sweep < 100 && !converged; sweep++) {
        double off = 0.0;
        for (size_t p = 0; p < nn; p++)
            for (size_t r = p + 1; r < nn; r++)
                off += 2.0 * a[p * nn + r] * a[p * nn + r];
        /* Off-diagonal mass below double rounding of the whole matrix: the
         * remaining rotations would only shuffle rounding noise. */
        if (off <= 1e-30 * total) {
            converged = 1;
            break;
        }
        for (size_t p = 0; p < nn; p++) {
            for (size_t r = p + 1; r < nn; r++) {
                double apr = a[p * nn + r];
                /* Already negligible next to both diagonal entries. */
                if (fabs(apr) <= 1e-300 ||
                    fabs(apr) <= 1e-18 * (fabs(a[p * nn + p]) + fabs(a[r * nn + r]))) {
                    a[p * nn + r] = a[r * nn + p] = 0.0;
                    continue;
                }
                /* Rotation J = [[c, s], [-s, c]] on (p, r) with JᵀAJ diagonal
                 * in that 2×2 block (the smaller of the two angles). */
                double tau = (a[r * nn + r] - a[p * nn + p]) / (2.0 * apr);
                double t = (tau >= 0.0 ? 1.0 : -1.0) / (fabs(tau) + sqrt(1.0 + tau * tau));
                double c = 1.0 / sqrt(1.0 + t * t);
                double s = t * c;
                for (size_t k = 0; k < nn; k++) {
                    double akp = a[k * nn + p], akr = a[k * nn + r];
                    a[k * nn + p] = c * akp - s * akr;
                    a[k * nn + r] = s * akp + c * akr;
                }
                for (size_t k = 0; k < nn; k++) {
                    double apk = a[p * nn + k], ark = a[r * nn + k];
                    a[p * nn + k] = c * apk - s * ark;
                    a[r * nn + k] = s * apk + c * ark;
                }
                /* Exactly zero by construction; rounding would leave noise. */
                a[p * nn + r] = a[r * nn + p] = 0.0;
                for (size_t k = 0; k < nn; k++) {
                    double vkp = v[k * nn + p], vkr = v[k * nn + r];
                    v[k * nn + p] = c * vkp - s * vkr;
                    v[k * nn + r] = s * vkp + c * vkr;
                }
            }
        }
    }
    if (!converged)
        return CORE_ERANGE;

    for (size_t i = 0; i < nn; i++)
        w[i] = a[i * nn + i];
    /* Selection sort: n is small and it keeps vectors paired with values. */
    for (size_t i = 0; i < nn; i++) {
        size_t m = i;
        for (size_t j = i + 1; j < nn; j++)
            if (w[j] < w[m])
                m = j;
        if (m == i)
            continue;
        double t = w[i];
        w[i] = w[m];
        w[m] = t;
        for (size_t k = 0; k < nn; k++) {
            t = v[k * nn + i];
            v[k * nn + i] = v[k * nn + m];
            v[k * nn + m] = t;
        }
    }
    return 0;
}

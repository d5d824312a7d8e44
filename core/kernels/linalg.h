/* core/kernels/linalg.h — small dense double-precision helpers for building feature
 * maps: Householder QR and the Jacobi symmetric eigendecomposition.
 *
 * Sizes are head dimensions (tens to a few hundred), so these are plain
 * O(n³) loops written for accuracy, not speed; they run once per (layer,
 * KV head) when attention parameters are built. All matrices are row-major
 * n×n arrays of doubles owned by the caller. Nothing here touches BLAS.
 */
#ifndef DARKSERVE_CORE_LINALG_H
#define DARKSERVE_CORE_LINALG_H

/* QR by Householder reflections: a = Q·R.
 * a (in/out): [n][n], overwritten by R (upper triangular; below the diagonal
 * is left as zeros). q (out): [n][n] orthogonal. Q and R are as produced by
 * the reflections; callers wanting the unique factorization with a positive
 * diagonal multiply column j of Q (and row j of R) by sign(R[j][j]).
 * Returns 0, CORE_EINVAL for n < 1, CORE_ENOMEM. */
int core_linalg_qr(int n, double *a, double *q);

/* Eigendecomposition of a symmetric matrix by cyclic Jacobi rotations:
 * a = V·diag(w)·Vᵀ. a (in/out): [n][n], only its symmetric part is used
 * ((a + aᵀ)/2); destroyed. w (out): [n] eigenvalues, ascending. v (out):
 * [n][n], column j is the unit eigenvector of w[j].
 * Returns 0, CORE_EINVAL for n < 1, CORE_ERANGE if it did not converge
 * (non-finite input). */
int core_linalg_eigh(int n, double *a, double *w, double *v);

#endif

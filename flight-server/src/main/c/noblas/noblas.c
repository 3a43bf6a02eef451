/*
 * libopenblas.so.0 without BLAS or LAPACK: what bytedeco's libopencv_core.so.413 is linked against, so that it
 * loads without OpenBLAS's natives (most of the sidecar jar otherwise). OpenCV calls these only from
 * matrix algebra (gemm, solve, SVD, LU, QR, Cholesky), which prep never calls; each one names itself and aborts
 * rather than returning a wrong result. The names are libopencv_core's undefined symbols that OpenBLAS defines
 * (OpenCvTest loads OpenCV with every symbol bound at load time, LD_BIND_NOW).
 */
#include <stdio.h>
#include <stdlib.h>

static void missing(const char *name) {
  fprintf(stderr, "unstall: OpenCV called %s, but the sidecar carries no BLAS/LAPACK (libopenblas.so.0 is a "
                  "stub, flight-server/src/main/c/noblas); this is a bug in unstall's prep\n", name);
  abort();
}

#define STUB(f) \
  __attribute__((visibility("default"))) void f(void) { missing(#f); }

STUB(cblas_sgemm)
STUB(cblas_dgemm)
STUB(cblas_cgemm)
STUB(cblas_zgemm)
STUB(sgels_)
STUB(dgels_)
STUB(sgeqrf_)
STUB(dgeqrf_)
STUB(sgesdd_)
STUB(dgesdd_)
STUB(sgesv_)
STUB(dgesv_)
STUB(sgetrf_)
STUB(dgetrf_)
STUB(sposv_)
STUB(dposv_)
STUB(spotrf_)
STUB(dpotrf_)

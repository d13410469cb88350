// Row-major GEMMs on the column-major BLAS of the backend.
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/LinearLaunch.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

Status gemm(const Context &ctx, bool transA, bool transB, int64_t m, int64_t n,
            int64_t k, float alpha, GemmOperand a, int64_t lda, GemmOperand b,
            int64_t ldb, float beta, float *c, int64_t ldc, const float *bias,
            GemmSums *sums, GemmGelu *gelu, uint16_t *c16) {
  if (sums)
    sums->done = false;
  if (gelu)
    gelu->done = false;
  if ((a.bf16 || b.bf16) && !ctx.bf16)
    return Status::error("gemm: a packed bf16 operand in an fp32 GEMM");
  if (gelu && gelu->out && beta != 0)
    return Status::error("gemm: GELU into its own output needs beta 0 (the "
                         "epilogue's C is that output, not C)");
  if (c16 && (!ctx.bf16 || c || beta != 0 || sums || gelu))
    return Status::error("gemm: a packed output needs a bf16 GEMM with beta "
                         "0, no fp32 C, no operand sums and no GELU");
  if (m <= 0 || n <= 0)
    return Status::ok();
  if (k <= 0 && c16) {
    // The empty sum: zeros, or the bias rounded and packed on every row
    // (row r of C is the "column" r of a column-major copy whose source
    // columns are all the bias: a source stride of 0).
    if (bias)
      return launchPackBf16Columns(ctx, c16, ldc, bias, 0, n, m);
    for (int64_t r = 0; r < m; ++r)
      PIPER_RETURN_IF_ERROR(zeroAsync(
          ctx, c16 + r * ldc, static_cast<size_t>(n) * sizeof(uint16_t)));
    return Status::ok();
  }
  if (k <= 0) {
    // alpha * (empty sum) + beta * C (+ bias).
    if (bias) {
      if (beta != 0 || ldc != n)
        return Status::error(
            "gemm: k = 0 with a bias needs beta 0 and a dense C");
      return launchBroadcastRows(ctx, bias, c, m, n);
    }
    if (beta == 1)
      return Status::ok();
    if (beta != 0)
      return Status::error("gemm: k = 0 with beta other than 0 or 1");
    for (int64_t r = 0; r < m; ++r)
      PIPER_RETURN_IF_ERROR(
          zeroAsync(ctx, c + r * ldc, static_cast<size_t>(n) * sizeof(float)));
    return Status::ok();
  }
  // A row-major matrix is its transpose in column-major order: C^T (n x m)
  // = op(B)^T op(A)^T, i.e. the column-major GEMM with the operands swapped.
  ColMajorGemm g;
  g.transA = transB;
  g.transB = transA;
  g.m = n;
  g.n = m;
  g.k = k;
  g.alpha = alpha;
  g.a = b;
  g.lda = ldb;
  g.b = a;
  g.ldb = lda;
  g.beta = beta;
  g.c = c;
  g.ldc = ldc;
  g.c16 = c16;
  g.bias = bias; // one per row-major column: the column-major rows
  if (sums) {
    // Row-major A is column-major B and the reverse.
    g.sumsA = sums->b;
    g.sumsB = sums->a;
    g.summed = &sums->done;
  }
  if (gelu) {
    // C's storage is the same either way: so are its companions'.
    g.geluOut = gelu->out;
    g.geluGradOf = gelu->gradOf;
    g.activated = &gelu->done;
  }
  return gemmColMajor(ctx, g);
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

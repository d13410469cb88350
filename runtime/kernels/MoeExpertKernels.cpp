// The per-expert linear of mixture-of-experts layers (expert_linear and its
// gradients): one GEMM per expert over its block of capacity slots.
#include <optional>
#include <vector>

#include "runtime/kernels/MoeChecks.h"

namespace piper::runtime::detail {

namespace {

// Checks that `w` is an f32 [E, K, M] tensor (in mixed precision the
// weight may be its packed bf16 copy: `packable`) and returns its
// dimensions.
Status expectExpertWeight(const KernelArgs &a, const TensorRef &w,
                          const char *name, bool packable, int64_t &experts,
                          int64_t &in, int64_t &out) {
  PIPER_RETURN_IF_ERROR(
      expectDType(a, w, name, packable ? packableDType(a, w) : plan::F32));
  if (w.shape.size() != 3)
    return a.error(std::string(name) + " has shape " + shapeString(w.shape) +
                   ", expected rank 3 [experts,in,out]");
  experts = w.shape[0];
  in = w.shape[1];
  out = w.shape[2];
  return Status::ok();
}

// Reads `experts` (required when `required`, else defaulting to the
// weight's), checks it against the weight's first dimension and `rows`
// (E*C) against it, and returns C.
Status expertCapacity(const KernelArgs &a, bool required, int64_t wExperts,
                      const char *wName, const TensorRef &rowsOf,
                      const char *rowsName, int64_t rows, int64_t &capacity) {
  int64_t experts = 0;
  PIPER_RETURN_IF_ERROR(readPositiveInt(
      a, KernelAttr::kExperts,
      required ? std::nullopt : std::optional<int64_t>(wExperts), experts));
  if (experts != wExperts)
    return a.error("attribute 'experts' is " + std::to_string(experts) +
                   " but " + wName + " has " + std::to_string(wExperts) +
                   " experts");
  if (rows % experts != 0)
    return a.error(std::string(rowsName) + " has shape " +
                   shapeString(rowsOf.shape) + ", rows not a multiple of " +
                   "experts " + std::to_string(experts));
  capacity = rows / experts;
  return Status::ok();
}

/// The GEMMs of the expert_linear family, one per expert e:
/// C_e = op(A_e) op(B_e), m x n x k, where A_e, B_e and C_e are the e-th of
/// `experts` equal blocks of the call's inputs 0 and 1 and its output 0,
/// with rows of lda, ldb and ldc floats (packed inputs unpacked first, a
/// packed output packed last). Nothing when the output is empty.
Status expertGemms(const KernelArgs &a, int64_t experts, bool transA,
                   bool transB, int64_t m, int64_t n, int64_t k, int64_t lda,
                   int64_t ldb, int64_t ldc) {
  const TensorRef &out = a.outputs[0];
  if (out.numel() == 0)
    return Status::ok();
  std::vector<float> unpackedL, unpackedR, packed;
  const float *lhs = fp32Data(a.inputs[0], unpackedL),
              *rhs = fp32Data(a.inputs[1], unpackedR);
  float *c = outputRow(out, 0, out.numel(), packed);
  const int64_t lhsBlock = a.inputs[0].numel() / experts,
                rhsBlock = a.inputs[1].numel() / experts,
                outBlock = out.numel() / experts;
  for (int64_t e = 0; e < experts; ++e)
    gemm(transA, transB, m, n, k, 1.0f, lhs + e * lhsBlock, lda,
         rhs + e * rhsBlock, ldb, 0.0f, c + e * outBlock, ldc);
  storeRow(out, 0, out.numel(), out.numel(), c);
  return Status::ok();
}

} // namespace

Status checkExpertLinear(const KernelArgs &a, ExpertLinearShape &s) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &buf = a.inputs[0], &w = a.inputs[1], &y = a.outputs[0];
  int64_t rows = 0, wIn = 0;
  PIPER_RETURN_IF_ERROR(expectGemmMatrix(a, buf, "buf", rows, s.in));
  PIPER_RETURN_IF_ERROR(
      expectExpertWeight(a, w, "w", true, s.experts, wIn, s.out));
  PIPER_RETURN_IF_ERROR(
      expertCapacity(a, true, s.experts, "w", buf, "buf", rows, s.capacity));
  if (wIn != s.in)
    return a.error("w has shape " + shapeString(w.shape) + ", expected [" +
                   std::to_string(s.experts) + "," + std::to_string(s.in) +
                   ",*]");
  PIPER_RETURN_IF_ERROR(expectPackableOutput(a, y, "y", {rows, s.out}));
  return expectBlasDims(a, {s.capacity, s.in, s.out});
}

Status expertLinearKernel(const KernelArgs &a) {
  ExpertLinearShape s;
  PIPER_RETURN_IF_ERROR(checkExpertLinear(a, s));
  // y_e = buf_e * w_e.
  return expertGemms(a, s.experts, false, false, s.capacity, s.out, s.in, s.in,
                     s.out, s.out);
}

Status checkExpertLinearGradInput(const KernelArgs &a, ExpertLinearShape &s) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &dy = a.inputs[0], &w = a.inputs[1], &dbuf = a.outputs[0];
  int64_t rows = 0, wOut = 0;
  PIPER_RETURN_IF_ERROR(expectGemmMatrix(a, dy, "dy", rows, s.out));
  PIPER_RETURN_IF_ERROR(
      expectExpertWeight(a, w, "w", true, s.experts, s.in, wOut));
  PIPER_RETURN_IF_ERROR(
      expertCapacity(a, false, s.experts, "w", dy, "dy", rows, s.capacity));
  if (wOut != s.out)
    return a.error("w has shape " + shapeString(w.shape) + ", expected [" +
                   std::to_string(s.experts) + ",*," + std::to_string(s.out) +
                   "]");
  PIPER_RETURN_IF_ERROR(expectPackableOutput(a, dbuf, "dbuf", {rows, s.in}));
  return expectBlasDims(a, {s.capacity, s.in, s.out});
}

Status expertLinearGradInputKernel(const KernelArgs &a) {
  ExpertLinearShape s;
  PIPER_RETURN_IF_ERROR(checkExpertLinearGradInput(a, s));
  // dbuf_e = dy_e * w_e^T.
  return expertGemms(a, s.experts, false, true, s.capacity, s.in, s.out, s.out,
                     s.out, s.in);
}

Status checkExpertLinearGradWeight(const KernelArgs &a, ExpertLinearShape &s) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &buf = a.inputs[0], &dy = a.inputs[1], &dw = a.outputs[0];
  int64_t rows = 0, dyRows = 0, wIn = 0, wOut = 0;
  PIPER_RETURN_IF_ERROR(expectGemmMatrix(a, buf, "buf", rows, s.in));
  PIPER_RETURN_IF_ERROR(expectGemmMatrix(a, dy, "dy", dyRows, s.out));
  if (dyRows != rows)
    return a.error("dy has shape " + shapeString(dy.shape) + ", expected [" +
                   std::to_string(rows) + ",*]");
  PIPER_RETURN_IF_ERROR(
      expectExpertWeight(a, dw, "dw", false, s.experts, wIn, wOut));
  PIPER_RETURN_IF_ERROR(
      expertCapacity(a, false, s.experts, "dw", buf, "buf", rows, s.capacity));
  if (wIn != s.in || wOut != s.out)
    return a.error("dw has shape " + shapeString(dw.shape) + ", expected [" +
                   std::to_string(s.experts) + "," + std::to_string(s.in) +
                   "," + std::to_string(s.out) + "]");
  return expectBlasDims(a, {s.capacity, s.in, s.out});
}

Status expertLinearGradWeightKernel(const KernelArgs &a) {
  ExpertLinearShape s;
  PIPER_RETURN_IF_ERROR(checkExpertLinearGradWeight(a, s));
  // dw_e = buf_e^T * dy_e; zero when C = 0 (gemm fills it).
  return expertGemms(a, s.experts, true, false, s.in, s.out, s.capacity, s.in,
                     s.out, s.out);
}
} // namespace piper::runtime::detail

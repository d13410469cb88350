// The host emulation's backend primitives (GpuApi.h): host memory, work done
// at once on the calling thread (or recorded while it captures a step,
// HostCapture.h), GEMMs through OpenBLAS in BLAS's own
// column-major convention (so Gemm.cpp's row-major mapping, which the CUDA
// backend shares, is exercised by every emulated GEMM).
#include <cblas.h>

#include <cstring>
#include <string>
#include <vector>

#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"
#include "runtime/hal/gpu/host/HostCapture.h"
#include "support/Precision.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

Status launchStatus(int error, const char *kernel) {
  if (error == 0)
    return Status::ok();
  return Status::error(std::string(kernel) + ": emulated launch failed (" +
                       std::to_string(error) + ")");
}

Status zeroAsync(const Context &, void *ptr, size_t bytes) {
  if (bytes)
    runOrRecord([=] { std::memset(ptr, 0, bytes); });
  return Status::ok();
}

Status copyAsync(const Context &, void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src)
    runOrRecord([=] { std::memmove(dst, src, bytes); });
  return Status::ok();
}

Status copyToDeviceAsync(const Context &, void *dst, const void *src,
                         size_t bytes) {
  if (bytes)
    runOrRecord([=] { std::memcpy(dst, src, bytes); });
  return Status::ok();
}

Status copyToHostSync(const Context &, void *host, const void *src,
                      size_t bytes) {
  if (currentRecording)
    return Status::error("copying " + std::to_string(bytes) +
                         " bytes of device memory to the host while the "
                         "stream captures a step (the host cannot wait for "
                         "captured work)");
  countEmulatedSync();
  if (bytes)
    std::memcpy(host, src, bytes);
  return Status::ok();
}

namespace {
// An operand as fp32: its floats, or a packed one's values unpacked into
// `tmp` (the stored matrix: `rows` x `cols` column-major with ld).
const float *fp32Operand(const GemmOperand &op, int64_t rows, int64_t cols,
                         int64_t ld, std::vector<float> &tmp) {
  if (!op.bf16)
    return op.f32;
  const int64_t n = ld * (cols - 1) + rows;
  tmp.resize(static_cast<size_t>(n));
  unpackBf16(tmp.data(), op.bf16, n);
  return tmp.data();
}
} // namespace

Status gemmColMajor(const Context &ctx, const ColMajorGemm &g) {
  if (ctx.timer)
    PIPER_RETURN_IF_ERROR(ctx.timer->begin(ctx));
  // Operand sums are not computed here (the caller's kernels do them: the
  // bits of the unfused ops), nor GELU: the caller reads these at once.
  if (g.summed)
    *g.summed = false;
  if (g.activated)
    *g.activated = false;
  runOrRecord([g] {
    // The operands of a bf16 GEMM already hold bf16 values (the executor
    // rounds them), so fp32 arithmetic is the tensor cores' with fp32
    // accumulation, up to the order of the sums. A packed operand holds
    // the same values.
    std::vector<float> a16, b16;
    const float *a = fp32Operand(g.a, g.transA ? g.k : g.m,
                                 g.transA ? g.m : g.k, g.lda, a16);
    const float *b = fp32Operand(g.b, g.transB ? g.n : g.k,
                                 g.transB ? g.k : g.n, g.ldb, b16);
    // A packed D: the fp32 result (in a dense matrix), then each column
    // rounded and packed, as cuBLASLt's bf16 D.
    std::vector<float> dense;
    float *c = g.c;
    int64_t ldc = g.ldc;
    if (g.c16) {
      dense.assign(static_cast<size_t>(g.m * g.n), 0.0f);
      c = dense.data();
      ldc = g.m;
    }
    cblas_sgemm(CblasColMajor, g.transA ? CblasTrans : CblasNoTrans,
                g.transB ? CblasTrans : CblasNoTrans, static_cast<int>(g.m),
                static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, a,
                static_cast<int>(g.lda), b, static_cast<int>(g.ldb), g.beta, c,
                static_cast<int>(ldc));
    // cuBLASLt's BIAS epilogue: the bias added to the fp32 product.
    if (g.bias)
      for (int64_t j = 0; j < g.n; ++j)
        for (int64_t i = 0; i < g.m; ++i)
          c[j * ldc + i] += g.bias[i];
    if (g.c16)
      for (int64_t j = 0; j < g.n; ++j)
        packBf16(g.c16 + j * g.ldc, c + j * ldc, g.m);
  });
  return ctx.timer ? ctx.timer->end(ctx, "gemm") : Status::ok();
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

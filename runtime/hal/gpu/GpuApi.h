// The GPU kernels' view of their backend: the stream a kernel is queued on,
// scratch memory, GEMMs and a few asynchronous primitives. Two backends
// implement these functions and a binary links exactly one of them:
// runtime/hal/cuda (CUDA, cuBLASLt) and runtime/hal/gpu/host (the host
// emulation, which runs the same kernel bodies on the CPU for the tests and
// the emulated device). Includes no CUDA header.
#ifndef PIPER_RUNTIME_HAL_GPU_GPUAPI_H
#define PIPER_RUNTIME_HAL_GPU_GPUAPI_H

#include "runtime/hal/gpu/Namespace.h"

#include <cstddef>
#include <cstdint>
#include <functional>

#include "support/Status.h"

struct CUstream_st; // cudaStream_t is CUstream_st *

namespace piper::runtime::hal::PIPER_GPU_NS {

using StreamHandle = CUstream_st *;

/// Scratch device memory of one stream: bf16 copies of GEMM operands,
/// partial sums. Kept for the stream's life (it grows to the largest
/// request, synchronizing the stream before it frees the smaller block),
/// outside the plan's arena.
class Workspace {
public:
  virtual ~Workspace() = default;
  /// At least `bytes` of device memory, 256-byte aligned, valid until the
  /// next reserve() of this workspace. Work queued on the stream before may
  /// still be using the previous block; reserve waits for it when it must
  /// free that block.
  virtual Status reserve(size_t bytes, void *&ptr) = 0;
};

/// Rewrites a constant table's host block for step `step` with the
/// schedule's lr scale `lrScale`, as the call that filled it did for its
/// own step.
using ConstantRefill = std::function<void(int64_t step, double lrScale)>;

/// Memory for the per-step constants that kernels read from the device
/// instead of taking them as launch arguments (AdamW's scheduled lr and
/// bias corrections), so that a launch's arguments stay the same from
/// step to step, as a CUDA graph captured once replays them (docs/gpu.md).
/// One per stream; not thread-safe.
class ConstantTables {
public:
  virtual ~ConstantTables() = default;
  /// A table of `bytes` for call site `site` (a pointer naming the call,
  /// the same every step: its plan kernel): page-locked host memory `host`
  /// and device memory `device`, 256-byte aligned, the same blocks on every
  /// call with this site and size. The caller fills `host`, then queues
  /// copyToDeviceAsync(device <- host) before the launches that read
  /// `device`; `host` must not be written again before the stream has run
  /// that copy (the executor writes a step's after the previous step's
  /// end-of-step synchronization).
  virtual Status get(const void *site, size_t bytes, void *&host,
                     void *&device) = 0;
  /// Called after filling a table's host block for this step: while the
  /// stream captures the step (Device::beginStepCapture) the backend keeps
  /// `refill` and calls it before each replay with the replayed step's
  /// number and lr scale, so that the captured copy reads that step's
  /// constants; otherwise it is dropped.
  virtual void keepForReplay(ConstantRefill refill) = 0;
};

/// How attention runs (piper-run --attention, docs/gpu.md): `Simt` always
/// on the warp-per-row kernels (AttentionLaunch.h); `Auto` (the default) on
/// the backend's fused attention (cuDNN on CUDA) in bf16 plans where it has
/// one for the shape, else on the SIMT kernels, saying so once; `Cudnn`
/// requires the fused attention (an error where it cannot run).
enum class AttentionMode : uint8_t { Auto, Cudnn, Simt };

/// Times device launches (piper-run --profile=gpu): begin() before a launch
/// is queued, end() after, on the context's stream; the backend reads the
/// times after the stream is synchronized. Null in a Context: not timed.
class LaunchTimer {
public:
  virtual ~LaunchTimer() = default;
  virtual Status begin(const struct Context &ctx) = 0;
  /// `name` lives as long as the program (a string literal).
  virtual Status end(const struct Context &ctx, const char *name) = 0;
};

/// Everything a GPU kernel call gets besides its operands.
struct Context {
  /// The CUDA stream of the calling logical stream (null: the emulation).
  StreamHandle stream = nullptr;
  Workspace *workspace = nullptr;
  /// The backend's BLAS handle (a cublasLtHandle_t on CUDA).
  void *blas = nullptr;
  /// Mixed precision: GEMMs read their operands as bf16 (they hold bf16
  /// values already) on tensor cores, accumulating in fp32.
  bool bf16 = false;
  AttentionMode attention = AttentionMode::Simt;
  /// The backend's fused attention (CUDA: cuDNN's, per stream; the
  /// emulation: its host model); null: none.
  class FusedAttentionProvider *fused = nullptr;
  /// --profile=gpu's timer of this stream's launches; null: none.
  LaunchTimer *timer = nullptr;
  /// The stream's constant tables (AdamW's per-step constants).
  ConstantTables *constants = nullptr;
  /// Whether a weight gradient accumulates in its GEMM (beta = 1): the
  /// backend's GEMMs add beta C to the summed product in their epilogue
  /// (cuBLASLt). The emulation's BLAS adds C inside its sums, so it does not
  /// (the kernel adds a separate product instead: the CPU kernel's bits).
  bool accumulatesInGemm = false;
};

// Backend primitives.

/// Ok, or "<kernel>: <CUDA error name>: <message>" for a launch's error
/// (the launchers' int is a cudaError_t; 0 is success).
Status launchStatus(int error, const char *kernel);
/// Queues memset(ptr, 0, bytes) on the stream.
Status zeroAsync(const Context &ctx, void *ptr, size_t bytes);
/// Queues a device-to-device copy on the stream.
Status copyAsync(const Context &ctx, void *dst, const void *src, size_t bytes);
/// Queues a copy from page-locked host memory (a ConstantTables block) to
/// device memory on the stream; returns at once.
Status copyToDeviceAsync(const Context &ctx, void *dst, const void *src,
                         size_t bytes);
/// Copies device memory to host memory and returns when it is there (the
/// stream is synchronized: only for results the host needs now).
Status copyToHostSync(const Context &ctx, void *host, const void *src,
                      size_t bytes);

/// A GEMM operand in device memory: fp32, or (in a bf16 GEMM only) packed
/// bf16 values, as a mixed-precision plan stores its step buffers: the
/// GEMM then reads them as they are instead of packing an fp32 copy
/// (Device::readsPackedInput; the same values, so the same bits). Its
/// leading dimension counts elements either way.
struct GemmOperand {
  GemmOperand() = default;
  GemmOperand(std::nullptr_t) {}              // NOLINT: implicit on purpose
  GemmOperand(const float *p) : f32(p) {}     // NOLINT: implicit on purpose
  GemmOperand(const uint16_t *p) : bf16(p) {} // NOLINT: implicit on purpose
  /// The operand from element `e` on (a block of a batch of GEMMs).
  GemmOperand at(int64_t e) const {
    GemmOperand o;
    o.f32 = f32 ? f32 + e : nullptr;
    o.bf16 = bf16 ? bf16 + e : nullptr;
    return o;
  }
  const float *f32 = nullptr;
  const uint16_t *bf16 = nullptr;
};

/// A GEMM in BLAS's column-major convention: C = alpha op(A) op(B) + beta C
/// with op(A) m x k, op(B) k x n, C m x n.
struct ColMajorGemm {
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1;
  GemmOperand a;
  int64_t lda = 0;
  GemmOperand b;
  int64_t ldb = 0;
  float beta = 0;
  float *c = nullptr;
  int64_t ldc = 0;
  /// Not null (with c null, beta 0, no sums or GELU; ctx.bf16 only): D is
  /// stored packed bf16 there instead, column stride ldc, each element the
  /// fp32 result (bias included) rounded to nearest even, as packing the
  /// fp32 C gives (a mixed-precision activation that only packed readers
  /// read: Device::writesPackedOutput).
  uint16_t *c16 = nullptr;
  /// Not null: m floats, bias[i] added to row i of every column, C = alpha
  /// op(A) op(B) + beta C + bias, in the GEMM's epilogue (cuBLASLt's
  /// BIAS: one rounding of the fp32 product plus the bias, as adding it to
  /// a C that held the bias with beta = 1 gives).
  const float *bias = nullptr;
  /// Not null (at most one, and not with `bias`): the sums over k of
  /// op(A)'s rows (sumsA, m floats: cuBLASLt's BGRADA epilogue) or of
  /// op(B)'s columns (sumsB, n floats: BGRADB), in double or fp32 as the
  /// backend sums, where the backend computes them in the GEMM's epilogue;
  /// `summed` says whether it did (else the caller computes them).
  float *sumsA = nullptr, *sumsB = nullptr;
  bool *summed = nullptr;
  /// GELU (the tanh approximation) in the epilogue, where the backend has
  /// it (cuBLASLt's GELU_AUX(_BIAS) and DGELU); `activated` says whether it
  /// did (else C holds the plain product, bias included, and the caller
  /// applies it). At most one of the two, not with sums; both matrices
  /// have C's shape and ldc.
  /// geluOut: C still receives the pre-activation (product + bias) and
  /// geluOut gelu of it.
  float *geluOut = nullptr;
  /// geluGradOf: C = (the product) * gelu'(geluGradOf).
  const float *geluGradOf = nullptr;
  bool *activated = nullptr;
};
/// Runs `g` (m, n, k >= 1) on the stream: fp32 (TF32 off), or with
/// ctx.bf16 bf16 operands on tensor cores with fp32 accumulation and output
/// (packed operands only with ctx.bf16: gemm() refuses them otherwise).
Status gemmColMajor(const Context &ctx, const ColMajorGemm &g);

/// A row-major GEMM's operand sums over k, computed in its epilogue where
/// the backend can (gemm()): `a`, m floats, the rows of op(A) summed; `b`,
/// n floats, the columns of op(B); at most one. `done` says whether the
/// backend computed them (CUDA, where cuBLASLt has an algorithm with the
/// epilogue for the shape); otherwise the caller must.
struct GemmSums {
  float *a = nullptr, *b = nullptr;
  bool done = false;
};

/// GELU in a row-major GEMM's epilogue where the backend can (gemm(),
/// ColMajorGemm::geluOut/geluGradOf): `out` (C's shape) receives gelu of
/// C, which holds the pre-activation; or, with `gradOf`, C is multiplied
/// by gelu'(gradOf). `done` says whether the backend did; otherwise C
/// holds the plain product and the caller must.
struct GemmGelu {
  float *out = nullptr;
  const float *gradOf = nullptr;
  bool done = false;
};

/// Row-major C[m,n] = alpha op(A) op(B) + beta C (+ bias[j] on column j
/// of every row, in the epilogue, where `bias` is not null), as the CPU
/// kernels' gemm (runtime/kernels/KernelUtil.h): mapped onto gemmColMajor
/// (Gemm.cpp). Empty products are handled here; a packed operand in an
/// fp32 GEMM (without ctx.bf16) is an error. `sums` and `gelu` ask for
/// epilogues the backend may decline (GemmSums, GemmGelu). With `c16`
/// instead of `c` (beta 0, no sums or GELU) C is stored packed bf16
/// (ColMajorGemm::c16).
Status gemm(const Context &ctx, bool transA, bool transB, int64_t m, int64_t n,
            int64_t k, float alpha, GemmOperand a, int64_t lda, GemmOperand b,
            int64_t ldb, float beta, float *c, int64_t ldc,
            const float *bias = nullptr, GemmSums *sums = nullptr,
            GemmGelu *gelu = nullptr, uint16_t *c16 = nullptr);

/// The sizes of a fused attention call, in the layout of the attention
/// kernels (AttentionLaunch.h): qkv16 [batch * seq, (heads + 2 kvHeads) *
/// headDim] bf16, q | k | v, q and k rotated; y16 and dy16 [batch * seq,
/// heads * headDim] bf16; stats [batch, heads, seq] fp32, each query row's
/// log-sum-exp of its scaled, causally masked scores; dqkv16 as qkv16.
struct FusedAttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, kvHeads = 0, headDim = 0;
  float scale = 0;
};

/// Causal grouped-query attention by the backend's fused kernels (cuDNN's
/// flash attention on CUDA), prepared once for one shape.
class FusedAttention {
public:
  virtual ~FusedAttention() = default;
  /// Device workspace its calls need (from the stream's Workspace).
  virtual size_t workspaceBytes() const = 0;
  virtual Status forward(const Context &ctx, const uint16_t *qkv16,
                         uint16_t *y16, float *stats,
                         void *workspace) const = 0;
  virtual Status backward(const Context &ctx, const uint16_t *qkv16,
                          const uint16_t *y16, const uint16_t *dy16,
                          const float *stats, uint16_t *dqkv16,
                          void *workspace) const = 0;
};

/// Where a context's fused attention comes from.
class FusedAttentionProvider {
public:
  virtual ~FusedAttentionProvider() = default;
  /// The fused attention for `shape` (forward and backward), prepared on
  /// the first call with the shape (the attention kernels' preparation
  /// when a plan loads, GpuKernels.h prepareKernel) and kept; null (and ok)
  /// where attention runs on the SIMT kernels: under AttentionMode::Auto the
  /// backend refuses the shape (said once on stderr). Under
  /// AttentionMode::Cudnn a refusal is the error.
  virtual Status get(const Context &ctx, const FusedAttentionShape &shape,
                     const FusedAttention *&out) = 0;
};

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_GPUAPI_H

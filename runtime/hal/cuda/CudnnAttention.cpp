// Fused attention on CUDA: see CudnnAttention.h.
#include "runtime/hal/cuda/CudnnAttention.h"

#include <cudnn_graph.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>

#include "fmt/core.h"
#include "runtime/hal/cuda/CudnnLibrary.h"
#include "runtime/hal/cuda/CudnnSdpa.h"

namespace piper::runtime::hal {

namespace {

/// "fused attention of 8 x 1024 tokens, 12 query / 12 kv heads of 64".
std::string describe(const gpu::FusedAttentionShape &s) {
  return fmt::format("causal attention of {} x {} tokens, {} query / {} "
                     "key-value heads of {}",
                     s.batch, s.seq, s.heads, s.kvHeads, s.headDim);
}

/// One shape's forward and backward plans on one stream's handle.
class CudnnFused final : public gpu::FusedAttention {
public:
  CudnnFused(const CudnnLibrary &lib, cudnnHandle_t handle,
             std::unique_ptr<SdpaPlan> fwd, std::unique_ptr<SdpaPlan> bwd)
      : lib(lib), handle(handle), fwd(std::move(fwd)), bwd(std::move(bwd)) {}
  size_t workspaceBytes() const override {
    return std::max(fwd->workspaceBytes(), bwd->workspaceBytes());
  }
  Status forward(const gpu::Context &ctx, const uint16_t *qkv16, uint16_t *y16,
                 float *stats, void *workspace) const override {
    PIPER_RETURN_IF_ERROR(bind(ctx));
    if (ctx.timer)
      PIPER_RETURN_IF_ERROR(ctx.timer->begin(ctx));
    PIPER_RETURN_IF_ERROR(fwd->forward(handle, qkv16, y16, stats, workspace));
    return ctx.timer ? ctx.timer->end(ctx, "fused_attention_forward (cudnn)")
                     : Status::ok();
  }
  Status backward(const gpu::Context &ctx, const uint16_t *qkv16,
                  const uint16_t *y16, const uint16_t *dy16, const float *stats,
                  uint16_t *dqkv16, void *workspace) const override {
    PIPER_RETURN_IF_ERROR(bind(ctx));
    if (ctx.timer)
      PIPER_RETURN_IF_ERROR(ctx.timer->begin(ctx));
    PIPER_RETURN_IF_ERROR(
        bwd->backward(handle, qkv16, y16, dy16, stats, dqkv16, workspace));
    return ctx.timer ? ctx.timer->end(ctx, "fused_attention_backward (cudnn)")
                     : Status::ok();
  }

private:
  // cuDNN queues its kernels on the handle's stream: the caller's.
  Status bind(const gpu::Context &ctx) const {
    cudnnStatus_t st =
        lib.cudnnSetStream(handle, reinterpret_cast<cudaStream_t>(ctx.stream));
    if (st != CUDNN_STATUS_SUCCESS)
      return Status::error(lib.errorText("cudnnSetStream", st));
    return Status::ok();
  }
  const CudnnLibrary &lib;
  cudnnHandle_t handle;
  std::unique_ptr<SdpaPlan> fwd, bwd;
};

/// Says once per process that --attention auto runs the SIMT kernels, and
/// why.
void sayFallbackOnce(const std::string &why) {
  static std::once_flag once;
  std::call_once(once, [&] {
    fmt::print(stderr,
               "piper-run: attention runs on the SIMT kernels, not cuDNN's "
               "fused attention: {} (--attention simt says nothing; "
               "--attention cudnn makes this an error)\n",
               why);
  });
}

/// Says once per process which cuDNN the fused attention uses.
void sayCudnnOnce(const CudnnLibrary &lib, const SdpaPlan &fwd,
                  const SdpaPlan &bwd) {
  static std::once_flag once;
  std::call_once(once, [&] {
    fmt::print(stderr,
               "piper-run: attention: cuDNN {} ({}); forward {}, backward "
               "{}\n",
               lib.version, lib.path, fwd.description(), bwd.description());
  });
}

} // namespace

struct CudnnAttentionState::Impl {
  const CudnnLibrary *lib = nullptr;
  cudnnHandle_t handle = nullptr;
  Status unavailable = Status::ok(); // the library or handle's error, kept
  bool tried = false;
  struct Entry {
    std::unique_ptr<CudnnFused> fused;
    Status refused = Status::ok();
  };
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, float>,
           Entry>
      entries;

  ~Impl() {
    entries.clear();
    if (handle && lib)
      lib->cudnnDestroy(handle);
  }

  /// The library and this stream's handle, created once (the calling
  /// thread's current device is the stream's).
  Status open() {
    if (tried)
      return unavailable;
    tried = true;
    unavailable = [&]() -> Status {
      PIPER_RETURN_IF_ERROR(cudnnLibrary(lib));
      cudnnStatus_t st = lib->cudnnCreate(&handle);
      if (st != CUDNN_STATUS_SUCCESS) {
        handle = nullptr;
        return Status::error(lib->errorText("cudnnCreate", st));
      }
      return Status::ok();
    }();
    return unavailable;
  }

  Status prepare(const gpu::FusedAttentionShape &s, Entry &e) {
    PIPER_RETURN_IF_ERROR(open());
    SdpaShape shape;
    shape.batch = s.batch;
    shape.heads = s.heads;
    shape.kvHeads = s.kvHeads;
    shape.seq = s.seq;
    shape.headDim = s.headDim;
    shape.scale = s.scale;
    std::unique_ptr<SdpaPlan> fwd, bwd;
    // Deterministic engines only: the same bits every run (docs/gpu.md).
    PIPER_RETURN_IF_ERROR(SdpaPlan::create(*lib, handle, shape,
                                           /*backward=*/false,
                                           /*allowNondeterministic=*/false,
                                           fwd));
    PIPER_RETURN_IF_ERROR(SdpaPlan::create(*lib, handle, shape,
                                           /*backward=*/true,
                                           /*allowNondeterministic=*/false,
                                           bwd));
    sayCudnnOnce(*lib, *fwd, *bwd);
    e.fused = std::make_unique<CudnnFused>(*lib, handle, std::move(fwd),
                                           std::move(bwd));
    return Status::ok();
  }
};

CudnnAttentionState::CudnnAttentionState(gpu::AttentionMode mode)
    : attentionMode(mode), impl(std::make_unique<Impl>()) {}

CudnnAttentionState::~CudnnAttentionState() = default;

Status CudnnAttentionState::get(const gpu::Context &,
                                const gpu::FusedAttentionShape &s,
                                const gpu::FusedAttention *&out) {
  out = nullptr;
  if (attentionMode == gpu::AttentionMode::Simt)
    return Status::ok();
  auto key =
      std::make_tuple(s.batch, s.seq, s.heads, s.kvHeads, s.headDim, s.scale);
  auto it = impl->entries.find(key);
  if (it == impl->entries.end()) {
    it = impl->entries.emplace(key, Impl::Entry()).first;
    Status st = impl->prepare(s, it->second);
    if (!st)
      it->second.refused = Status::error("cuDNN cannot run the " + describe(s) +
                                         ": " + st.message());
  }
  const Impl::Entry &e = it->second;
  if (e.fused) {
    out = e.fused.get();
    return Status::ok();
  }
  if (attentionMode == gpu::AttentionMode::Cudnn)
    return Status::error("--attention cudnn: " + e.refused.message());
  sayFallbackOnce(e.refused.message());
  return Status::ok();
}

} // namespace piper::runtime::hal

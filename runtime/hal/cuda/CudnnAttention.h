// Fused attention on CUDA (gpu::fusedAttention, GpuApi.h): cuDNN's flash
// attention graphs (CudnnSdpa.h), prepared once per shape and stream. Each
// stream's gpu::Context::fused points at its CudnnAttentionState.
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDNNATTENTION_H
#define PIPER_RUNTIME_HAL_CUDA_CUDNNATTENTION_H

#include <memory>

#include "runtime/hal/gpu/GpuApi.h"
#include "support/Status.h"

namespace piper::runtime::hal {

/// One stream's fused attention: a cuDNN handle (created on first use, so a
/// run that never asks needs no cuDNN) and the plans of every shape asked
/// for, or why cuDNN refused it. Not thread-safe: one per stream.
class CudnnAttentionState final : public gpu::FusedAttentionProvider {
public:
  explicit CudnnAttentionState(gpu::AttentionMode mode);
  ~CudnnAttentionState() override;
  gpu::AttentionMode mode() const { return attentionMode; }
  Status get(const gpu::Context &ctx, const gpu::FusedAttentionShape &shape,
             const gpu::FusedAttention *&out) override;

private:
  struct Impl;
  gpu::AttentionMode attentionMode;
  std::unique_ptr<Impl> impl;
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_CUDNNATTENTION_H

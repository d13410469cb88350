// The emulation's fused attention (GpuApi.h FusedAttention): a host model of
// cuDNN's fused flash attention with its contract (bf16 q, k, v, y, dy in
// the attention kernels' packed layout, fp32 log-sum-exp statistics, bf16
// dq, dk, dv), so that the fused path of the attention kernels (packing,
// rotary embeddings, scratch, recomputing the forward, unpacking) runs and
// is checked without a GPU: `--backend cuda-emulation --attention cudnn`.
// Its math is double precision on the bf16 operands, rounded to bf16 only
// where its outputs are bf16 (cuDNN also rounds inside, e.g. the
// probabilities before P.V; the model does not), so it differs from the
// SIMT kernels only by those output roundings.
#ifndef PIPER_RUNTIME_HAL_GPU_HOST_HOSTFUSEDATTENTION_H
#define PIPER_RUNTIME_HAL_GPU_HOST_HOSTFUSEDATTENTION_H

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "runtime/hal/gpu/GpuApi.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

/// The model for every shape asked for (thread-safe: the emulated device's
/// streams share it).
class HostFusedAttentionProvider final : public FusedAttentionProvider {
public:
  Status get(const Context &ctx, const FusedAttentionShape &shape,
             const FusedAttention *&out) override;

private:
  std::mutex mu;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, float>,
           std::unique_ptr<FusedAttention>>
      models;
};

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_HOST_HOSTFUSEDATTENTION_H

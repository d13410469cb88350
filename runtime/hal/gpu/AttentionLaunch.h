// Launchers of the attention GPU kernels (AttentionLaunch.inl, compiled for
// CUDA by Attention.cu and for the host emulation by AttentionHost.cpp).
// Each queues its work on ctx.stream.
#ifndef PIPER_RUNTIME_HAL_GPU_ATTENTIONLAUNCH_H
#define PIPER_RUNTIME_HAL_GPU_ATTENTIONLAUNCH_H

#include <cstdint>
#include <initializer_list>

#include "runtime/hal/gpu/AttentionMath.h"
#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

/// y = causal softmax(scale q k^T) v per (sequence, query head), q and k
/// rotated when s.rotary(). qkv is [rows, cols], y [rows, qCols];
/// `scratch` holds attentionScratch(s, false).bytes (device memory).
Status launchAttention(const Context &ctx, const AttentionShape &s,
                       const float *qkv, float *y, char *scratch);
/// dqkv = the gradient of attention's y (dy, [rows, qCols]) with respect to
/// qkv, every element written; `scratch` holds attentionScratch(s,
/// true).bytes.
Status launchAttentionGrad(const Context &ctx, const AttentionShape &s,
                           const float *qkv, const float *dy, float *dqkv,
                           char *scratch);

/// One step of ring attention (context parallelism): o, lse of the
/// member's queries over the owner's key/value shard kv ([rows, 2 kvCols]),
/// combined with oIn, lseIn (null at step 0); `scratch` holds
/// ringScratch(s, false).bytes.
Status launchAttentionBlock(const Context &ctx, const RingShape &s,
                            const float *qkv, const float *kv, const float *oIn,
                            const float *lseIn, float *o, float *lse,
                            char *scratch);
/// The step's backward: dq [rows, qCols] and the owner's dkv
/// [rows, 2 kvCols] from the forward's final y and lse, plus dqIn, dkvIn
/// (both null at step 0); `scratch` holds ringScratch(s, true).bytes.
Status launchAttentionBlockGrad(const Context &ctx, const RingShape &s,
                                const float *qkv, const float *kv,
                                const float *y, const float *lse,
                                const float *dy, const float *dqIn,
                                const float *dkvIn, float *dq, float *dkv,
                                char *scratch);

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_ATTENTIONLAUNCH_H

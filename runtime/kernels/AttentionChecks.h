// Operand and attribute checks of the attention kernels (attention,
// attention_grad), shared by the CPU kernels and the GPU kernels
// (runtime/hal/gpu): both backends accept and reject exactly the same calls,
// with the same messages, and derive the same sizes.
#ifndef PIPER_RUNTIME_KERNELS_ATTENTIONCHECKS_H
#define PIPER_RUNTIME_KERNELS_ATTENTIONCHECKS_H

#include <cstdint>

#include "runtime/kernels/KernelUtil.h"

namespace piper::runtime::detail {

/// The sizes of a causal (grouped-query) attention over a packed
/// qkv = [q | k | v], [batch * seq, (heads + 2 kv_heads) * head dim]; each
/// row's q holds `heads` heads of `headDim` columns, its k and v `kvHeads`.
struct AttentionDims {
  int64_t rows = 0;    // N = batch * seq
  int64_t heads = 0;   // query heads
  int64_t kvHeads = 0; // key/value heads; heads % kvHeads == 0
  int64_t headDim = 0; // hd
  int64_t seq = 0;
  int64_t batch = 0;
  int64_t qCols = 0;    // heads * hd, also the width of y
  int64_t kvCols = 0;   // kvHeads * hd
  int64_t cols = 0;     // qCols + 2 * kvCols, the width of qkv
  double ropeTheta = 0; // 0: no rotary embedding

  int64_t group() const { return heads / kvHeads; }
};

/// attention: qkv -> y [N, heads * hd]. Attributes: heads, kv_heads
/// (default heads), seq, rope_theta (default 0: no rotary embedding).
Status checkAttention(const KernelArgs &a, AttentionDims &d);
/// attention_grad: (qkv, dy) -> dqkv, with attention's attributes.
Status checkAttentionGrad(const KernelArgs &a, AttentionDims &d);

} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_ATTENTIONCHECKS_H

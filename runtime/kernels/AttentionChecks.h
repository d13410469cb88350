// Operand and attribute checks of the attention kernels (attention,
// attention_grad, and ring attention's attention_block(_grad)), shared by the CPU kernels and the GPU kernels
// (runtime/hal/gpu): both backends accept and reject exactly the same calls,
// with the same messages, and derive the same sizes.
#ifndef PIPER_RUNTIME_KERNELS_ATTENTIONCHECKS_H
#define PIPER_RUNTIME_KERNELS_ATTENTIONCHECKS_H

#include <cstdint>

#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/Rope.h"

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
  RopeScaling rope;     // Llama 3.1's frequencies (factor 0: none)

  int64_t group() const { return heads / kvHeads; }
};

/// One step of ring attention under context parallelism
/// (docs/context-parallel.md): `seq` is the whole sequence S, each of the
/// `cp` members holds seq / cp rows of every sequence (chunks m and
/// 2cp-1-m), and the step attends the member's queries to the key/value
/// shard of member `owner`.
struct AttentionBlockDims : AttentionDims {
  int64_t cp = 1;     // context members N
  int64_t step = 0;   // ring step, 0..N-1
  int64_t member = 0; // this rank's member (KernelContext.contextMember)
  int64_t owner = 0;  // whose key/value shard the step reads
  int64_t local = 0;  // rows per sequence: seq / cp; batch = rows / local
};

/// attention_block: (qkv, kv[, o, lse]) -> (o, lse). kv [N, 2 kv_heads * hd]
/// is owner (member - step) mod cp's k|v columns; o [N, heads * hd] the
/// attention output over the key/value shards seen so far (normalized) and
/// lse [N, 2 heads] its log-sum-exp of scores as a pair per head: column h
/// a bf16 value, column heads + h the rest (their sum is the log-sum-exp;
/// stored in bf16 between steps, as mixed precision stores every value,
/// the pair keeps it to |lse| 2^-16: docs/context-parallel.md); step 0
/// takes no o, lse.
/// Attributes: attention's (seq = the whole sequence) and cp, step.
Status checkAttentionBlock(const KernelArgs &a, AttentionBlockDims &d);
/// A log-sum-exp pair of row `row`, head h of an lse [N, 2 heads]: stores
/// v as its bf16 rounding and the exact rest (0 for an infinite v); loads
/// their sum.
void storeRingLse(float *lse, int64_t heads, int64_t row, int64_t h, float v);
float loadRingLse(const float *lse, int64_t heads, int64_t row, int64_t h);
/// attention_block_grad: (qkv, kv, y, lse, dy[, dq, dkv]) -> (dq, dkv): kv
/// is owner (member + step) mod cp's shard, y and lse the forward's final
/// output and log-sum-exp; dq [N, heads * hd] adds this step's query
/// gradient to the one given, dkv [N, 2 kv_heads * hd] this member's part
/// of the owner's key/value gradient to the one given (the ring's partial
/// sum). Both in the unrotated columns of qkv.
Status checkAttentionBlockGrad(const KernelArgs &a, AttentionBlockDims &d);

/// attention: qkv -> y [N, heads * hd]. Attributes: heads, kv_heads
/// (default heads), seq, rope_theta (default 0: no rotary embedding).
Status checkAttention(const KernelArgs &a, AttentionDims &d);
/// attention_grad: (qkv, dy) -> dqkv, with attention's attributes.
Status checkAttentionGrad(const KernelArgs &a, AttentionDims &d);

} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_ATTENTIONCHECKS_H

// The `shard_tensor` rewrite's state, shared by its parts (internal to
// compiler/transforms): tensor parallelism of the selected blocks and
// replicated key/value heads (TensorParallel.cpp), vocabulary parallelism
// (VocabParallel.cpp) and sequence parallelism (SequenceParallel.cpp).
// docs/tensor-parallel.md describes all of them.
#ifndef PIPER_COMPILER_TRANSFORMS_SHARDTENSOR_H
#define PIPER_COMPILER_TRANSFORMS_SHARDTENSOR_H

#include "compiler/transforms/Transforms.h"

#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace mlir::piper::tensor_parallel {

/// One tensor-parallel layer of a block: the column-parallel linear, the
/// core between (attention, swiglu or gelu) and the row-parallel linear.
struct TpLayer {
  LinearOp column;
  Operation *core;
  LinearOp row;
  /// The fused parts of the column linear's output features (q, k, v;
  /// gate, up), or empty for one.
  SmallVector<int64_t> parts;
  /// Attention with fewer key/value heads K than members T: the T / K
  /// members sharing each key/value head (1: heads split).
  int64_t kvShare = 1;
  /// Qwen3's per-head q/k norm between the column linear and the
  /// attention, or null: its heads become local, and its weight, read by
  /// every member for its own heads, gets partial gradients.
  QkNormOp qkNorm;
};

/// How one parameter is sliced.
struct Slice {
  int64_t dim;
  SmallVector<int64_t> parts;
};

inline RankedTensorType withDim(Type t, int64_t dim, int64_t size) {
  auto r = cast<RankedTensorType>(t);
  SmallVector<int64_t> shape(r.getShape());
  shape[dim] = size;
  return RankedTensorType::get(shape, r.getElementType());
}

inline int64_t dimOf(Value v, int64_t dim) {
  return cast<RankedTensorType>(v.getType()).getDimSize(dim);
}

/// One `shard_tensor` directive applied to a module.
class ShardTensor {
public:
  ShardTensor(ModuleOp module, const Directive &d)
      : module(module), d(d), tp(d.get<ShardTensorOptions>().tp),
        symbols(module) {}

  /// Why `core` (reading `in`, the column linear's output, and giving
  /// `out`) cannot be split, or its layer.
  FailureOr<TpLayer> match(Operation *core, Value in, Value out, int64_t block);

  /// The layers of `seg`, in op order.
  FailureOr<SmallVector<TpLayer>> layersOf(SegmentOp seg, int64_t block);

  LogicalResult addSlice(Value weight, Slice s, Operation *at);

  /// Splits one layer: local types, local heads, f before and g after.
  LogicalResult rewrite(TpLayer &layer);

  /// Replicated key/value heads (docs/tensor-parallel.md §2b): the weight
  /// stays sliced T ways (member m holds 1/r of head m / r's k and v
  /// columns), and before the GEMM each member gathers the pieces and
  /// assembles its head whole, so the column linear computes q for its
  /// heads and k, v for the one head they read.
  void replicateKvHead(TpLayer &layer);

  /// Makes every split parameter local, with its slice, and its reads.
  LogicalResult sliceParams();

  LogicalResult run(ProgramOp program);

  /// Why the vocabulary of `vocab` tokens cannot be split, or success.
  LogicalResult checkVocab(Operation *at, StringRef what, int64_t vocab);

  /// Vocabulary parallelism (Megatron's vocab-parallel embedding and cross
  /// entropy), over every segment whatever the filter: each token embedding
  /// table and each LM head (the linear layer whose logits a cross entropy
  /// reads) split by vocabulary rows. An embedding gives zero rows for
  /// other members' ids and a g (`piper.tp_reduce`) sums them; the head
  /// reads its input through f (`piper.tp_copy`), and its member's logits
  /// go to `piper.vocab_ce_stats`, whose per-row statistics g sums before
  /// `piper.vocab_cross_entropy`: the logits are never gathered. A head
  /// tied to the embedding (`transpose_w` on the table) takes the same
  /// rows.
  LogicalResult vocabParallel(ProgramOp program);

  /// Sequence parallelism over the selected blocks (Megatron's): f and g
  /// become an all-gather and a reduce-scatter of rows, and what lies
  /// outside them (norms, residual adds, row biases) runs on each member's
  /// N / T rows. A block result every reader of which is a selected block
  /// stays sharded; others are gathered (`sp_gather`), and whole values
  /// entering a block are split (`sp_split`). Parameters read on rows
  /// (norm weights, row biases) get partial gradients: replicate sums them
  /// over the tensor-parallel group too (`piper.sequence_partial`). Any
  /// other op reading rows (an MoE layer's router, dispatch and experts)
  /// runs whole on every member on the gathered rows (`sp_gather`), and a
  /// whole value meeting rows again is split (`sp_split`).
  LogicalResult
  sequenceParallel(ProgramOp program,
                   const llvm::MapVector<SegmentOp, int64_t> &segments);

private:
  ModuleOp module;
  const Directive &d;
  int64_t tp;
  SymbolTable symbols;
  llvm::MapVector<StringAttr, Slice> slices;
  llvm::SmallPtrSet<Operation *, 16> rewritten;
};

} // namespace mlir::piper::tensor_parallel

#endif // PIPER_COMPILER_TRANSFORMS_SHARDTENSOR_H

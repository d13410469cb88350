// Vocabulary parallelism (docs/tensor-parallel.md §5c), part of the
// `shard_tensor` rewrite (ShardTensor.h): the token embedding and the LM
// head split by vocabulary rows, the loss from per-member statistics.
#include "compiler/transforms/ShardTensor.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace mlir::piper;

namespace mlir::piper::tensor_parallel {

/// Why the vocabulary of `vocab` tokens cannot be split, or success.
LogicalResult ShardTensor::checkVocab(Operation *at, StringRef what,
                                      int64_t vocab) {
  if (vocab % tp == 0)
    return success();
  return at->emitOpError(d.describe())
         << ": vocabulary parallelism: " << what << " has a vocabulary of "
         << vocab << " tokens, which tensor parallelism of " << tp
         << " does not divide (pad the vocabulary to a multiple of " << tp
         << ", or keep the embedding and LM head whole with "
            "\"vocab_parallel\": false, --no-vocab-parallel)";
}

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
LogicalResult ShardTensor::vocabParallel(ProgramOp program) {
  MLIRContext *ctx = module.getContext();
  IntegerAttr members = IntegerAttr::get(IntegerType::get(ctx, 64), tp);
  llvm::SmallPtrSet<Operation *, 8> seen;
  auto fail = [&](Operation *at) {
    return at->emitOpError(d.describe()) << ": vocabulary parallelism: ";
  };
  for (TaskOp t : program.getBody().front().getOps<TaskOp>()) {
    auto seg = symbols.lookup<SegmentOp>(t.getSegment());
    if (!seg || !seen.insert(seg).second)
      continue;
    for (Operation &op : llvm::make_early_inc_range(
             seg.getBody().front().without_terminator())) {
      if (auto emb = dyn_cast<EmbeddingOp>(op)) {
        if (!emb.getTable().getDefiningOp<ParamRefOp>())
          return fail(emb) << "the embedding's table is not a parameter";
        if (failed(checkVocab(emb, "the token embedding",
                              dimOf(emb.getTable(), 0))) ||
            failed(addSlice(emb.getTable(), Slice{0, {}}, emb)))
          return failure();
        emb.setMembersAttr(members);
        OpBuilder b(ctx);
        b.setInsertionPointAfter(emb);
        auto sum = TpReduceOp::create(b, emb.getLoc(), emb.getResult());
        emb.getResult().replaceAllUsesExcept(sum, sum);
        rewritten.insert(emb);
        continue;
      }
      auto ce = dyn_cast<CrossEntropyOp>(op);
      if (!ce)
        continue;
      Value logits = ce.getLogits();
      auto head = logits.getDefiningOp<LinearOp>();
      if (!head || !head.getWeight().getDefiningOp<ParamRefOp>() ||
          !logits.hasOneUse())
        return fail(ce) << "the loss's logits are not computed by a "
                           "linear layer of their own (the LM head)";
      int64_t vocab = dimOf(logits, 1);
      if (failed(checkVocab(ce, "the LM head", vocab)) ||
          failed(addSlice(head.getWeight(),
                          Slice{head.getTransposeW() ? 0 : 1, {}}, head)))
        return failure();
      if (Value bias = head.getBias()) {
        if (!bias.getDefiningOp<ParamRefOp>())
          return fail(head) << "the LM head's bias is not a parameter";
        if (failed(addSlice(bias, Slice{0, {}}, head)))
          return failure();
      }
      OpBuilder b(head);
      Value copy = TpCopyOp::create(b, head.getLoc(), head.getInput());
      head.getInputMutable().assign(copy);
      logits.setType(withDim(logits.getType(), 1, vocab / tp));
      b.setInsertionPoint(ce);
      int64_t rows = dimOf(logits, 0);
      auto stats = VocabCeStatsOp::create(
          b, ce.getLoc(),
          RankedTensorType::get({rows, 4 * tp + 1}, b.getF32Type()), logits,
          ce.getTargets(), members);
      auto sum = TpReduceOp::create(b, ce.getLoc(), stats.getResult());
      auto loss = VocabCrossEntropyOp::create(b, ce.getLoc(), ce.getType(), sum,
                                              logits, ce.getTargets(), members);
      ce.getLoss().replaceAllUsesWith(loss.getLoss());
      ce.erase();
      rewritten.insert(head);
    }
  }
  return success();
}

} // namespace mlir::piper::tensor_parallel

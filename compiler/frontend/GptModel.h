// The GPT model front end: builds a GPT-2 style forward model as piper IR.
#ifndef PIPER_COMPILER_FRONTEND_GPTMODEL_H
#define PIPER_COMPILER_FRONTEND_GPTMODEL_H

#include <cstdint>
#include <string>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

namespace mlir::piper {

/// Sizes and initialization of a GPT-2 style decoder-only transformer.
struct GptConfig {
  /// Number of transformer blocks.
  int64_t layers = 4;
  /// Model width H.
  int64_t hidden = 64;
  /// Attention heads; must divide `hidden`.
  int64_t heads = 4;
  /// Vocabulary size V.
  int64_t vocab = 256;
  /// Sequence length S (also the size of the position table).
  int64_t seq = 32;
  /// Sequences per (micro)batch B; activations are [B*S, H].
  int64_t batch = 4;
  /// Ties the output head to the token embedding `wte` (no `lm_head.weight`).
  bool tiedHead = false;
  /// Standard deviation of the normal initializers.
  double initStd = 0.02;
};

/// Checks the config (positive sizes, hidden % heads == 0, a positive finite
/// initStd, sizes small enough for int64 shape products). Returns "" when the
/// config is valid, otherwise an error message (lowercase, no period).
std::string validateGptConfig(const GptConfig &cfg);

/// Builds the forward model as a module: every `piper.param` (GPT-2 naming),
/// then the segments @embed, @block0 ... @block{L-1}, @head, then
/// `piper.program @model` with one batch and one task per segment. Loads the
/// piper dialect into `ctx`. Precondition: validateGptConfig(cfg) is "".
OwningOpRef<ModuleOp> buildGptModel(MLIRContext *ctx, const GptConfig &cfg);

} // namespace mlir::piper

#endif // PIPER_COMPILER_FRONTEND_GPTMODEL_H

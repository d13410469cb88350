// The GPT model front end: builds a GPT-2 style forward model as piper IR.
#ifndef PIPER_COMPILER_FRONTEND_GPTMODEL_H
#define PIPER_COMPILER_FRONTEND_GPTMODEL_H

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

namespace mlir::piper {

/// The decoder families the front end builds.
enum class ModelFamily {
  /// GPT-2: learned positions, LayerNorm with bias, GELU MLP, biases.
  Gpt,
  /// Llama: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU,
  /// no biases, untied head (tied with `tiedHead`).
  Llama,
  /// Qwen3-MoE: Llama-style attention, mixture-of-experts SwiGLU MLPs with
  /// top-k softmax routing and an optional load-balancing loss.
  Qwen3Moe,
};

/// Sizes and initialization of a decoder-only transformer.
struct GptConfig {
  ModelFamily family = ModelFamily::Gpt;
  /// Number of transformer blocks.
  int64_t layers = 4;
  /// Model width H.
  int64_t hidden = 64;
  /// Attention heads; must divide `hidden` unless headDim is set.
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
  /// Key/value heads (grouped-query attention); 0 means `heads`. Llama only.
  int64_t kvHeads = 0;
  /// MLP hidden size; 0 means 4 * hidden (GPT) or the Llama rule
  /// (8/3 * hidden rounded up to a multiple of 32).
  int64_t ffn = 0;
  /// Width of each head of q, k and v; 0 means hidden / heads. Llama-like
  /// only (Qwen3's head_dim, where heads * head_dim may differ from hidden).
  int64_t headDim = 0;
  /// Qwen3's RMSNorm of each query and key head before the rotary
  /// embedding (`piper.qk_norm`, weight `attention.qk_norm.weight`, the q
  /// norm's head_dim then the k norm's). Llama-like only.
  bool qkNorm = false;
  /// Rotary embedding base. Llama only.
  double ropeTheta = 10000.0;
  /// Llama 3.1's frequency scaling (#piper.rope_llama3); ropeFactor 0 means
  /// none. Llama only.
  double ropeFactor = 0, ropeLowFreqFactor = 0, ropeHighFreqFactor = 0;
  int64_t ropeOriginalMaxPosition = 0;
  /// RMSNorm's epsilon (Llama and Qwen3Moe).
  double rmsEps = 1e-6;
  /// LayerNorm's epsilon (GPT).
  double layerNormEps = 1e-5;
  /// Rows of GPT's learned position table (Hugging Face's n_positions); 0
  /// means seq. At least seq: a sequence reads the first seq rows.
  int64_t positions = 0;

  /// Experts per MoE layer and experts per token (Qwen3Moe only).
  int64_t experts = 4;
  int64_t topK = 2;
  /// Slots per expert = ceil(capacityFactor * tokens * topK / experts);
  /// 0 means dropless (capacity = tokens, nothing is ever dropped).
  double capacityFactor = 0.0;
  /// Weight of the load-balancing loss in the training loss (0: none).
  double auxLossCoeff = 0.01;
  /// Qwen3Moe: whether the router renormalizes the top-k probabilities to
  /// sum to 1 (transformers' norm_topk_prob).
  bool normTopK = true;
  /// Qwen3Moe: the layers whose MLP is a dense SwiGLU of denseFfn instead of
  /// experts (transformers' mlp_only_layers, and the layers
  /// decoder_sparse_step skips), ascending.
  std::vector<int64_t> denseLayers;
  /// Qwen3Moe: the dense layers' MLP size (transformers' intermediate_size);
  /// 0 means ffn (the experts' size).
  int64_t denseFfn = 0;

  int64_t numKvHeads() const { return kvHeads ? kvHeads : heads; }
  int64_t headSize() const { return headDim ? headDim : hidden / heads; }
  bool llamaLike() const { return family != ModelFamily::Gpt; }
  /// Slots per expert for a microbatch.
  int64_t capacity() const;
  int64_t ffnSize() const;
  /// The MLP size of a dense layer: denseFfn, else ffnSize().
  int64_t denseFfnSize() const { return denseFfn ? denseFfn : ffnSize(); }
  /// Whether layer `layer`'s MLP is a mixture of experts.
  bool moeLayer(int64_t layer) const {
    return family == ModelFamily::Qwen3Moe &&
           !std::binary_search(denseLayers.begin(), denseLayers.end(), layer);
  }
};

/// Number of trainable parameters (elements) of the model `cfg` describes.
int64_t countParameters(const GptConfig &cfg);

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

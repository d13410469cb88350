// GptConfig's checks and sizes (GptModel.h), apart from the model builder
// so that readers of configurations (the Hugging Face reader and its fuzz
// target) need no dialect.
#include "compiler/frontend/GptModel.h"

#include <cmath>
#include <limits>

using namespace mlir;
using namespace mlir::piper;

/// Largest accepted size; keeps every product of two sizes within int64.
static constexpr int64_t kMaxSize = std::numeric_limits<int32_t>::max();
/// At most this many blocks: the IR grows with each one (docs/user-guide.md,
/// "Limits").
static constexpr int64_t kMaxLayers = 10000;
/// The largest tensor the model may have, in elements (2^46 floats, 256 TiB),
/// so that byte counts never overflow int64.
static constexpr double kMaxTensorElements = 70368744177664.0;

std::string mlir::piper::validateGptConfig(const GptConfig &cfg) {
  struct Size {
    const char *name;
    int64_t value;
  };
  for (Size size : {Size{"layers", cfg.layers}, Size{"hidden", cfg.hidden},
                    Size{"heads", cfg.heads}, Size{"vocab", cfg.vocab},
                    Size{"seq", cfg.seq}, Size{"batch", cfg.batch}}) {
    if (size.value <= 0)
      return std::string(size.name) + " must be positive, got " +
             std::to_string(size.value);
    if (size.value > kMaxSize)
      return std::string(size.name) + " must be at most " +
             std::to_string(kMaxSize) + ", got " + std::to_string(size.value);
  }
  if (cfg.headDim < 0 || cfg.headDim > kMaxSize)
    return "head_dim must be between 0 (hidden / heads) and " +
           std::to_string(kMaxSize) + ", got " + std::to_string(cfg.headDim);
  if (cfg.headDim == 0 && cfg.hidden % cfg.heads != 0)
    return "hidden (" + std::to_string(cfg.hidden) +
           ") must be divisible by heads (" + std::to_string(cfg.heads) + ")";
  if (cfg.family == ModelFamily::Gpt && (cfg.headDim || cfg.qkNorm))
    return "gpt models have neither a separate head_dim nor a q/k norm";
  if (cfg.layers > kMaxLayers)
    return "layers must be at most " + std::to_string(kMaxLayers) + ", got " +
           std::to_string(cfg.layers);
  if (cfg.batch * cfg.seq > kMaxSize)
    return "batch * seq (" + std::to_string(cfg.batch * cfg.seq) +
           ") must be at most " + std::to_string(kMaxSize);
  if (!std::isfinite(cfg.initStd) || cfg.initStd <= 0)
    return "init std must be positive and finite, got " +
           std::to_string(cfg.initStd);
  if (cfg.kvHeads < 0 || cfg.ffn < 0 || cfg.ffn > kMaxSize)
    return "kv_heads and ffn must be non-negative";
  if (cfg.positions != 0 &&
      (cfg.positions < cfg.seq || cfg.positions > kMaxSize))
    return "the position table's " + std::to_string(cfg.positions) +
           " rows must cover seq " + std::to_string(cfg.seq);
  if (!(cfg.layerNormEps > 0) || !std::isfinite(cfg.layerNormEps))
    return "layer norm epsilon must be positive";
  if (cfg.family == ModelFamily::Gpt && cfg.kvHeads && cfg.kvHeads != cfg.heads)
    return "gpt models have no grouped-query attention (kv_heads must equal "
           "heads)";
  if (cfg.heads % cfg.numKvHeads() != 0)
    return "heads (" + std::to_string(cfg.heads) +
           ") must be a multiple of kv_heads (" +
           std::to_string(cfg.numKvHeads()) + ")";
  if (cfg.family == ModelFamily::Qwen3Moe) {
    if (cfg.experts < 1 || cfg.experts > kMaxSize)
      return "experts must be positive, got " + std::to_string(cfg.experts);
    if (cfg.topK < 1 || cfg.topK > cfg.experts)
      return "top_k must be between 1 and experts (" +
             std::to_string(cfg.experts) + "), got " + std::to_string(cfg.topK);
    if (cfg.capacityFactor < 0 || !std::isfinite(cfg.capacityFactor))
      return "capacity factor must be non-negative";
    // From experts / top_k on, every token has a slot; far beyond, the slot
    // count overflowed int64 and came out as 1.
    if (cfg.capacityFactor > double(cfg.experts))
      return "capacity factor must be at most experts (" +
             std::to_string(cfg.experts) +
             "): from experts / top_k on every token has a slot; 0 is "
             "dropless";
    if (cfg.auxLossCoeff < 0 || !std::isfinite(cfg.auxLossCoeff))
      return "aux loss coefficient must be non-negative";
    for (size_t i = 0; i < cfg.denseLayers.size(); ++i)
      if (cfg.denseLayers[i] < 0 || cfg.denseLayers[i] >= cfg.layers ||
          (i && cfg.denseLayers[i] <= cfg.denseLayers[i - 1]))
        return "dense layers must be distinct layer indices in [0, " +
               std::to_string(cfg.layers) + "), ascending";
  } else if (!cfg.denseLayers.empty()) {
    return "only qwen3-moe models have dense layers among expert layers";
  }
  if (cfg.denseFfn < 0 || cfg.denseFfn > kMaxSize)
    return "the dense MLP size must be between 0 and " +
           std::to_string(kMaxSize);
  {
    // The largest tensors, in floating point so that the products cannot
    // overflow: embeddings and head, the MLP (all experts), the logits and
    // the attention scores of one microbatch.
    const double h = double(cfg.hidden), tokens = double(cfg.batch * cfg.seq);
    const double f = cfg.ffn ? double(cfg.ffn) : 4.0 * h;
    const double e = cfg.family == ModelFamily::Qwen3Moe ? double(cfg.experts)
                                                          : 1.0;
    for (double elements :
         {double(cfg.vocab) * h, 2.0 * e * h * f, tokens * double(cfg.vocab),
          2.0 * h * double(cfg.denseFfn), tokens * 3.0 * h,
          tokens * double(cfg.heads + 2 * cfg.numKvHeads()) *
              double(cfg.headDim),
          double(cfg.heads) * double(cfg.headDim) * h,
          tokens * f * 2.0 * double(cfg.topK > 0 ? cfg.topK : 1),
          tokens * double(cfg.heads) * double(cfg.seq)})
      if (elements > kMaxTensorElements)
        return "the model's tensors would be too large (more than 2^46 "
               "elements in one tensor)";
  }
  if (cfg.llamaLike()) {
    if (cfg.headSize() % 2 != 0)
      return "rotary embeddings need an even head dimension, got " +
             std::to_string(cfg.headSize());
    if (!(cfg.ropeTheta > 0) || !std::isfinite(cfg.ropeTheta))
      return "rope theta must be positive";
    if (!(cfg.rmsEps > 0) || !std::isfinite(cfg.rmsEps))
      return "rms norm epsilon must be positive";
    if (cfg.ropeFactor != 0 &&
        (!(cfg.ropeFactor > 0) || !std::isfinite(cfg.ropeFactor) ||
         !(cfg.ropeLowFreqFactor > 0) ||
         !(cfg.ropeHighFreqFactor > cfg.ropeLowFreqFactor) ||
         !std::isfinite(cfg.ropeHighFreqFactor) ||
         cfg.ropeOriginalMaxPosition <= 0))
      return "llama3 rope scaling needs a positive factor, 0 < low_freq_factor "
             "< high_freq_factor and a positive original_max_position";
  }
  return "";
}

int64_t GptConfig::capacity() const {
  int64_t tokens = batch * seq;
  if (capacityFactor <= 0)
    return tokens;
  double c = std::ceil(capacityFactor * double(tokens * topK) / double(experts));
  // Clamp before converting: a double past int64 does not convert.
  if (!(c < double(tokens)))
    return tokens;
  return std::max<int64_t>(1, int64_t(c));
}

int64_t GptConfig::ffnSize() const {
  if (ffn)
    return ffn;
  if (family == ModelFamily::Gpt)
    return 4 * hidden;
  // Llama: 2/3 of 4h, rounded up to a multiple of 32.
  int64_t f = (8 * hidden + 2) / 3;
  return (f + 31) / 32 * 32;
}

int64_t mlir::piper::countParameters(const GptConfig &cfg) {
  const int64_t h = cfg.hidden, v = cfg.vocab, f = cfg.ffnSize();
  if (cfg.llamaLike()) {
    const int64_t hd = cfg.headSize();
    const int64_t qkv = (cfg.heads + 2 * cfg.numKvHeads()) * hd;
    const int64_t df = cfg.denseFfnSize();
    const int64_t moe = h * cfg.experts + cfg.experts * (h * 2 * f + f * h);
    const int64_t dense = h * 2 * df + df * h;
    const int64_t attention =
        h + h * qkv + cfg.heads * hd * h + h + (cfg.qkNorm ? 2 * hd : 0);
    int64_t total = v * h + h + (cfg.tiedHead ? 0 : h * v);
    for (int64_t i = 0; i < cfg.layers; ++i)
      total += attention + (cfg.moeLayer(i) ? moe : dense);
    return total;
  }
  int64_t perLayer = 2 * h + h * 3 * h + 3 * h + h * h + h + 2 * h +
                     h * f + f + f * h + h;
  return v * h + cfg.seq * h + cfg.layers * perLayer + 2 * h +
         (cfg.tiedHead ? 0 : h * v);
}

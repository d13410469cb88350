// The built-in model presets.
#include "compiler/frontend/Presets.h"

#include <cstdio>

using namespace mlir::piper;

namespace {
GptConfig gpt(int64_t layers, int64_t hidden, int64_t heads, int64_t vocab,
              int64_t seq, bool tied) {
  GptConfig c;
  c.family = ModelFamily::Gpt;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.vocab = vocab;
  c.seq = seq;
  c.tiedHead = tied;
  return c;
}

GptConfig llama(int64_t layers, int64_t hidden, int64_t heads, int64_t kv,
                int64_t ffn, int64_t vocab, int64_t seq) {
  GptConfig c;
  c.family = ModelFamily::Llama;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.kvHeads = kv;
  c.ffn = ffn;
  c.vocab = vocab;
  c.seq = seq;
  c.ropeTheta = 10000.0;
  return c;
}
/// Qwen3 (dense): Llama with a q/k norm and its own head size.
GptConfig qwen3(int64_t layers, int64_t hidden, int64_t heads, int64_t kv,
                int64_t headDim, int64_t ffn, int64_t vocab, int64_t seq,
                bool tied) {
  GptConfig c = llama(layers, hidden, heads, kv, ffn, vocab, seq);
  c.qkNorm = true;
  c.headDim = headDim;
  c.tiedHead = tied;
  c.ropeTheta = 1000000.0;
  return c;
}
GptConfig qwen3Moe(int64_t layers, int64_t hidden, int64_t heads, int64_t kv,
                   int64_t ffn, int64_t experts, int64_t topK, int64_t vocab,
                   int64_t seq) {
  GptConfig c = llama(layers, hidden, heads, kv, ffn, vocab, seq);
  c.family = ModelFamily::Qwen3Moe;
  c.experts = experts;
  c.topK = topK;
  c.ropeTheta = 1000000.0;
  return c;
}
} // namespace

const std::vector<ModelPreset> &mlir::piper::modelPresets() {
  static const std::vector<ModelPreset> presets = {
      {"gpt", "GPT-2 style decoder; every size from flags",
       gpt(4, 64, 4, 256, 32, false)},
      {"llama",
       "Llama style decoder (RMSNorm, RoPE, GQA, SwiGLU); sizes from "
       "flags",
       llama(4, 64, 4, 2, 0, 256, 32)},
      {"gpt-tiny", "tiny GPT for tests (untied head, so it pipelines)",
       gpt(2, 64, 4, 256, 32, false)},
      {"gpt2-small", "GPT-2 small, 124M (tied head)",
       gpt(12, 768, 12, 50257, 1024, true)},
      {"gpt2-medium", "GPT-2 medium, 350M (tied head)",
       gpt(24, 1024, 16, 50257, 1024, true)},
      {"llama-tiny", "tiny Llama for tests", llama(2, 64, 4, 2, 0, 256, 32)},
      {"llama-1b", "a Llama-3.2-1B-like model (vocab 32000, untied)",
       llama(16, 2048, 32, 8, 8192, 32000, 2048)},
      {"llama-70b",
       "a Llama-3-70B-like model (80 layers, hidden 8192, GQA 64/8, vocab "
       "128256; for piperc search)",
       [] {
         GptConfig c = llama(80, 8192, 64, 8, 28672, 128256, 4096);
         c.batch = 1;
         c.ropeTheta = 500000.0;
         return c;
       }()},
      {"qwen3",
       "Qwen3 style decoder (llama with a q/k norm per head and its "
       "own head size); sizes from flags",
       qwen3(4, 64, 4, 2, 24, 0, 256, 32, false)},
      {"qwen3-tiny", "tiny Qwen3 for tests: 4 heads of 24 for hidden 64",
       qwen3(2, 64, 4, 2, 24, 0, 256, 32, false)},
      {"qwen3-0.6b", "Qwen3-0.6B's sizes (16 heads of 128, tied head)",
       qwen3(28, 1024, 16, 8, 128, 3072, 151936, 4096, true)},
      {"qwen3-moe", "Qwen3-MoE style decoder (top-k experts); sizes from flags",
       qwen3Moe(4, 64, 4, 2, 64, 4, 2, 256, 32)},
      {"qwen3-moe-tiny", "tiny MoE for tests: 4 experts, top-2",
       qwen3Moe(2, 64, 4, 2, 64, 4, 2, 256, 32)},
      {"qwen3-moe-1b",
       "the original Piper's 1B MoE: 16 layers, 4 experts top-2",
       qwen3Moe(16, 1024, 16, 8, 3584, 4, 2, 151936, 4096)},
      {"qwen3-moe-9b",
       "the original Piper's 9B MoE: 24 layers, 8 experts top-2",
       qwen3Moe(24, 2048, 32, 8, 7168, 8, 2, 151936, 4096)},
      {"qwen3-moe-30b",
       "Qwen3-30B-A3B's sizes: 48 layers, 128 experts of 768, top-8 "
       "(capacity factor 1.25), 32 heads of 128 (for piperc search)",
       [] {
         GptConfig c = qwen3Moe(48, 2048, 32, 4, 768, 128, 8, 151936, 4096);
         c.headDim = 128;
         c.qkNorm = true;
         c.batch = 1;
         // Megatron's --moe-expert-capacity-factor 1.25: dropless static
         // shapes would give each of the 128 experts every token's slot.
         c.capacityFactor = 1.25;
         return c;
       }()},
  };
  return presets;
}

std::optional<ModelPreset> mlir::piper::findPreset(const std::string &name) {
  for (const ModelPreset &p : modelPresets())
    if (p.name == name)
      return p;
  return std::nullopt;
}

std::string mlir::piper::formatPresetTable() {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line),
                "%-15s %-6s %6s %6s %9s %6s %7s %6s %10s  %s\n", "name",
                "family", "layers", "hidden", "heads/kv", "ffn", "vocab", "seq",
                "params", "description");
  out += line;
  for (const ModelPreset &p : modelPresets()) {
    const GptConfig &c = p.config;
    std::string heads =
        std::to_string(c.heads) + "/" + std::to_string(c.numKvHeads());
    double params = double(countParameters(c));
    std::string count =
        params >= 1e9   ? std::to_string(params / 1e9).substr(0, 4) + "B"
        : params >= 1e6 ? std::to_string(params / 1e6).substr(0, 5) + "M"
                        : std::to_string(int64_t(params));
    std::snprintf(line, sizeof(line),
                  "%-15s %-6s %6lld %6lld %9s %6lld %7lld %6lld %10s  %s\n",
                  p.name.c_str(),
                  c.family == ModelFamily::Llama
                      ? (c.qkNorm ? "qwen3" : "llama")
                  : c.family == ModelFamily::Qwen3Moe ? "moe"
                                                      : "gpt",
                  (long long)c.layers, (long long)c.hidden, heads.c_str(),
                  (long long)c.ffnSize(), (long long)c.vocab, (long long)c.seq,
                  count.c_str(), p.description.c_str());
    out += line;
  }
  return out;
}

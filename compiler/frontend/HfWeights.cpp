// The Hugging Face names and layouts of a model's parameters (see
// HfConfig.h and docs/hugging-face.md): each Piper parameter of a model
// built from a config.json records the checkpoint tensors it is made of.
#include "compiler/frontend/HfConfig.h"

#include "dialects/piper/PiperDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::piper;

namespace {

/// The sources of a Llama parameter (Piper's Meta-style name), or none
/// when the name is not one of LlamaForCausalLM's.
SmallVector<HfSourceAttr> llamaSources(MLIRContext *ctx, StringRef name,
                                       const GptConfig &cfg) {
  Builder b(ctx);
  const int64_t h = cfg.hidden, hd = cfg.headSize();
  const int64_t q = cfg.heads * hd, kv = cfg.numKvHeads() * hd;
  const int64_t f = cfg.denseFfnSize(), v = cfg.vocab;
  const int64_t ef = cfg.ffnSize(), e = cfg.experts;
  // An nn.Linear weight [out, in] (transposed into Piper's [in, out]) at
  // column `offset`, or a tensor as it is.
  auto linear = [&](const std::string &hf, int64_t out, int64_t in,
                    int64_t offset = 0) {
    return HfSourceAttr::get(ctx, hf, {out, in}, b.getBoolAttr(true), 0,
                             offset);
  };
  auto same = [&](const std::string &hf, ArrayRef<int64_t> shape) {
    return HfSourceAttr::get(ctx, hf, shape, b.getBoolAttr(false), 0, 0);
  };
  if (name == "tok_embeddings.weight")
    return {same("model.embed_tokens.weight", {v, h})};
  if (name == "norm.weight")
    return {same("model.norm.weight", {h})};
  if (name == "output.weight")
    return {linear("lm_head.weight", v, h)};
  // layers.<i>.<rest>
  if (!name.consume_front("layers."))
    return {};
  auto [index, rest] = name.split('.');
  unsigned layer;
  if (index.getAsInteger(10, layer) || layer >= cfg.layers)
    return {};
  const std::string p = "model.layers." + index.str() + ".";
  if (rest == "attention_norm.weight")
    return {same(p + "input_layernorm.weight", {h})};
  if (rest == "ffn_norm.weight")
    return {same(p + "post_attention_layernorm.weight", {h})};
  if (rest == "attention.wqkv.weight")
    return {linear(p + "self_attn.q_proj.weight", q, h),
            linear(p + "self_attn.k_proj.weight", kv, h, q),
            linear(p + "self_attn.v_proj.weight", kv, h, q + kv)};
  if (rest == "attention.qk_norm.weight" && cfg.qkNorm)
    return {same(p + "self_attn.q_norm.weight", {hd}),
            HfSourceAttr::get(ctx, p + "self_attn.k_norm.weight", {hd},
                              b.getBoolAttr(false), 0, hd)};
  if (rest == "attention.wo.weight")
    return {linear(p + "self_attn.o_proj.weight", h, q)};
  // Qwen3-MoE: the router (an nn.Linear, [E, H]) and each expert's
  // gate/up/down projections into block `x` of Piper's [E, ...] weights.
  if (rest == "moe.router.weight")
    return {linear(p + "mlp.gate.weight", e, h)};
  if (rest == "moe.experts.w13" || rest == "moe.experts.w2") {
    SmallVector<HfSourceAttr> out;
    for (int64_t x = 0; x < e; ++x) {
      const std::string q = p + "mlp.experts." + std::to_string(x) + ".";
      auto expert = [&](const char *proj, int64_t rows, int64_t cols,
                        int64_t offset) {
        return HfSourceAttr::get(ctx, q + proj, {rows, cols},
                                 b.getBoolAttr(true), x, offset);
      };
      if (rest == "moe.experts.w2") {
        out.push_back(expert("down_proj.weight", h, ef, 0));
        continue;
      }
      out.push_back(expert("gate_proj.weight", ef, h, 0));
      out.push_back(expert("up_proj.weight", ef, h, ef));
    }
    return out;
  }
  if (rest == "feed_forward.w13.weight")
    return {linear(p + "mlp.gate_proj.weight", f, h),
            linear(p + "mlp.up_proj.weight", f, h, f)};
  if (rest == "feed_forward.w2.weight")
    return {linear(p + "mlp.down_proj.weight", h, f)};
  return {};
}

/// The sources of a GPT-2 parameter: Piper's GPT names are GPT-2's
/// (GPT2Model's, under "transformer."), its Conv1D weights are [in, out]
/// as Piper's; only the untied head is an nn.Linear.
SmallVector<HfSourceAttr> gpt2Sources(MLIRContext *ctx, ParamOp param,
                                      const GptConfig &cfg) {
  Builder b(ctx);
  StringRef name = param.getSymName();
  ArrayRef<int64_t> shape = param.getTensorType().getShape();
  if (name == "lm_head.weight")
    return {HfSourceAttr::get(ctx, "lm_head.weight", {cfg.vocab, cfg.hidden},
                              b.getBoolAttr(true), 0, 0)};
  if (name == "wte" || name == "wpe")
    return {HfSourceAttr::get(ctx, ("transformer." + name + ".weight").str(),
                              shape, b.getBoolAttr(false), 0, 0)};
  if (!name.starts_with("h.") && !name.starts_with("ln_f."))
    return {};
  return {HfSourceAttr::get(ctx, ("transformer." + name).str(), shape,
                            b.getBoolAttr(false), 0, 0)};
}

} // namespace

std::string mlir::piper::annotateHuggingFace(ModuleOp module,
                                             const GptConfig &cfg,
                                             llvm::StringRef configText) {
  for (ParamOp param : module.getOps<ParamOp>()) {
    SmallVector<HfSourceAttr> sources =
        cfg.family == ModelFamily::Gpt
            ? gpt2Sources(module.getContext(), param, cfg)
            : llamaSources(module.getContext(), param.getSymName(), cfg);
    if (sources.empty())
      return ("internal: parameter '" + param.getSymName() +
              "' has no Hugging Face name")
          .str();
    setHfSources(param, sources);
  }
  setHfConfig(module, configText);
  if (failed(verify(module)))
    return "internal: the Hugging Face names do not fit the model";
  return "";
}

// The GPT model front end: emits parameters, segments and the forward program.
#include "compiler/frontend/GptModel.h"

#include <cmath>

#include "dialects/piper/PiperDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Location.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/Twine.h"

using namespace mlir;
using namespace mlir::piper;

namespace {

/// Emits the GPT module: parameters, segments and the program, in that order.
class GptModelBuilder {
public:
  GptModelBuilder(MLIRContext *ctx, const GptConfig &cfg)
      : ctx(ctx), cfg(cfg), b(ctx), rows(cfg.batch * cfg.seq) {}

  /// Builds the whole module.
  OwningOpRef<ModuleOp> build();

private:
  /// Returns a NameLoc naming `name` (a parameter, layer or op of the model).
  Location loc(const Twine &name) {
    return NameLoc::get(b.getStringAttr(name));
  }
  /// Returns tensor<shape x f32>.
  RankedTensorType f32(ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, b.getF32Type());
  }
  /// Returns the [B, S] i32 token-id type.
  RankedTensorType idsType() {
    return RankedTensorType::get({cfg.batch, cfg.seq}, b.getI32Type());
  }
  /// Returns the [N, width] activation type.
  RankedTensorType act(int64_t width) { return f32({rows, width}); }

  /// Declares parameter `name` at the current insertion point.
  void param(const Twine &name, ArrayRef<int64_t> shape, InitKind init,
             double scale = 0.0);
  /// Declares all parameters of the model.
  void buildParams();

  /// Creates segment `name` for block `block` and moves into its body.
  SegmentOp beginSegment(StringRef name, int64_t block, TypeRange inputs,
                         TypeRange results, Location where);
  /// Reads parameter `name` inside the current segment.
  Value ref(const Twine &name);
  /// Emits `linear x, <prefix>.weight[, <prefix>.bias]` named `prefix`.
  Value linear(Value x, const Twine &prefix, int64_t width, bool bias = true);
  /// Emits the layer norm with parameters `<prefix>.weight/bias`.
  Value layerNorm(Value x, const Twine &prefix);

  SegmentOp buildEmbed();
  SegmentOp buildBlock(int64_t layer);
  SegmentOp buildLlamaBlock(int64_t layer);
  void buildLlamaParams();
  /// Emits the mixture-of-experts MLP with parameters under `prefix`.
  Value moe(Value x, const std::string &prefix);
  /// Emits the RMS norm with gain `<prefix>.weight`.
  Value rmsNorm(Value x, const Twine &prefix);
  SegmentOp buildHead();
  void buildProgram(ArrayRef<SegmentOp> segments);

  MLIRContext *ctx;
  const GptConfig &cfg;
  OpBuilder b;
  /// Rows of an activation: N = B * S.
  int64_t rows;
  /// Declared parameter types, for param_ref.
  llvm::StringMap<RankedTensorType> paramTypes;
};

} // namespace

void GptModelBuilder::param(const Twine &name, ArrayRef<int64_t> shape,
                            InitKind init, double scale) {
  std::string key = name.str();
  RankedTensorType type = f32(shape);
  paramTypes[key] = type;
  ParamOp::create(b, loc(key), key, type, init, llvm::APFloat(scale),
                  /*expert_members=*/nullptr, /*tensor_slice=*/nullptr);
}

void GptModelBuilder::buildParams() {
  if (cfg.llamaLike())
    return buildLlamaParams();
  const int64_t h = cfg.hidden, v = cfg.vocab, s = cfg.seq;
  const double initStd = cfg.initStd;
  // GPT-2 scales the projections that feed the residual stream by
  // 1/sqrt(2 * layers): each block adds two of them.
  const double projStd =
      initStd / std::sqrt(2.0 * static_cast<double>(cfg.layers));

  param("wte", {v, h}, InitKind::normal, initStd);
  param("wpe", {cfg.positions ? cfg.positions : s, h}, InitKind::normal,
        initStd);
  for (int64_t i = 0; i < cfg.layers; ++i) {
    std::string p = "h." + std::to_string(i) + ".";
    param(p + "ln_1.weight", {h}, InitKind::ones);
    param(p + "ln_1.bias", {h}, InitKind::zeros);
    param(p + "attn.c_attn.weight", {h, 3 * h}, InitKind::normal, initStd);
    param(p + "attn.c_attn.bias", {3 * h}, InitKind::zeros);
    param(p + "attn.c_proj.weight", {h, h}, InitKind::normal, projStd);
    param(p + "attn.c_proj.bias", {h}, InitKind::zeros);
    param(p + "ln_2.weight", {h}, InitKind::ones);
    param(p + "ln_2.bias", {h}, InitKind::zeros);
    param(p + "mlp.c_fc.weight", {h, cfg.ffnSize()}, InitKind::normal, initStd);
    param(p + "mlp.c_fc.bias", {cfg.ffnSize()}, InitKind::zeros);
    param(p + "mlp.c_proj.weight", {cfg.ffnSize(), h}, InitKind::normal,
          projStd);
    param(p + "mlp.c_proj.bias", {h}, InitKind::zeros);
  }
  param("ln_f.weight", {h}, InitKind::ones);
  param("ln_f.bias", {h}, InitKind::zeros);
  if (!cfg.tiedHead)
    param("lm_head.weight", {h, v}, InitKind::normal, initStd);
}

void GptModelBuilder::buildLlamaParams() {
  const int64_t h = cfg.hidden, v = cfg.vocab, f = cfg.ffnSize();
  const int64_t hd = cfg.headSize();
  const int64_t qkv = (cfg.heads + 2 * cfg.numKvHeads()) * hd;
  const double projStd =
      cfg.initStd / std::sqrt(2.0 * static_cast<double>(cfg.layers));
  param("tok_embeddings.weight", {v, h}, InitKind::normal, cfg.initStd);
  for (int64_t i = 0; i < cfg.layers; ++i) {
    std::string p = "layers." + std::to_string(i) + ".";
    param(p + "attention_norm.weight", {h}, InitKind::ones);
    param(p + "attention.wqkv.weight", {h, qkv}, InitKind::normal, cfg.initStd);
    if (cfg.qkNorm)
      param(p + "attention.qk_norm.weight", {2 * hd}, InitKind::ones);
    param(p + "attention.wo.weight", {cfg.heads * hd, h}, InitKind::normal,
          projStd);
    param(p + "ffn_norm.weight", {h}, InitKind::ones);
    if (cfg.moeLayer(i)) {
      const int64_t e = cfg.experts;
      param(p + "moe.router.weight", {h, e}, InitKind::normal, cfg.initStd);
      param(p + "moe.experts.w13", {e, h, 2 * f}, InitKind::normal,
            cfg.initStd);
      param(p + "moe.experts.w2", {e, f, h}, InitKind::normal, projStd);
      continue;
    }
    // Gate and up projections packed as [gate | up] for piper.swiglu.
    param(p + "feed_forward.w13.weight", {h, 2 * cfg.denseFfnSize()},
          InitKind::normal, cfg.initStd);
    param(p + "feed_forward.w2.weight", {cfg.denseFfnSize(), h},
          InitKind::normal, projStd);
  }
  param("norm.weight", {h}, InitKind::ones);
  if (!cfg.tiedHead)
    param("output.weight", {h, v}, InitKind::normal, cfg.initStd);
}

Value GptModelBuilder::rmsNorm(Value x, const Twine &prefix) {
  std::string p = prefix.str();
  return RmsNormOp::create(b, loc(p), act(cfg.hidden), x, ref(p + ".weight"),
                           llvm::APFloat(cfg.rmsEps));
}

SegmentOp GptModelBuilder::buildLlamaBlock(int64_t layer) {
  OpBuilder::InsertionGuard guard(b);
  const int64_t h = cfg.hidden, hd = cfg.headSize();
  const int64_t qkv = (cfg.heads + 2 * cfg.numKvHeads()) * hd;
  std::string p = "layers." + std::to_string(layer);
  SegmentOp segment = beginSegment("block" + std::to_string(layer), layer + 1,
                                   {act(h)}, {act(h)}, loc(p));
  Value x = segment.getBody().getArgument(0);
  // x + wo(attention(rope(wqkv(attention_norm(x)))))
  Value y = rmsNorm(x, p + ".attention_norm");
  y = linear(y, p + ".attention.wqkv", qkv, /*bias=*/false);
  if (cfg.qkNorm)
    y = QkNormOp::create(
        b, loc(p + ".attention.qk_norm"), act(qkv), y,
        ref(p + ".attention.qk_norm.weight"), static_cast<uint64_t>(cfg.heads),
        b.getI64IntegerAttr(cfg.numKvHeads()), llvm::APFloat(cfg.rmsEps));
  RopeScalingAttr scaling;
  if (cfg.ropeFactor != 0)
    scaling = RopeScalingAttr::get(
        b.getContext(), llvm::APFloat(cfg.ropeFactor),
        llvm::APFloat(cfg.ropeLowFreqFactor),
        llvm::APFloat(cfg.ropeHighFreqFactor), cfg.ropeOriginalMaxPosition);
  auto att = AttentionOp::create(
      b, loc(p + ".attention"), act(cfg.heads * hd), act(2 * cfg.heads), y,
      static_cast<uint64_t>(cfg.heads), static_cast<uint64_t>(cfg.seq),
      b.getI64IntegerAttr(cfg.numKvHeads()), b.getF64FloatAttr(cfg.ropeTheta),
      scaling);
  y = linear(att.getResult(), p + ".attention.wo", h, /*bias=*/false);
  x = AddOp::create(b, loc(p + ".attention.residual"), x, y);
  y = rmsNorm(x, p + ".ffn_norm");
  if (cfg.moeLayer(layer)) {
    x = AddOp::create(b, loc(p + ".moe.residual"), x, moe(y, p + ".moe"));
    YieldOp::create(b, loc(p), ValueRange{x});
    return segment;
  }
  // x + w2(silu(w1(ffn_norm(x))) * w3(ffn_norm(x)))
  y = linear(y, p + ".feed_forward.w13", 2 * cfg.denseFfnSize(),
             /*bias=*/false);
  y = SwigluOp::create(b, loc(p + ".feed_forward.swiglu"),
                       act(cfg.denseFfnSize()), y);
  y = linear(y, p + ".feed_forward.w2", h, /*bias=*/false);
  x = AddOp::create(b, loc(p + ".feed_forward.residual"), x, y);
  YieldOp::create(b, loc(p), ValueRange{x});
  return segment;
}

Value GptModelBuilder::moe(Value x, const std::string &p) {
  const int64_t e = cfg.experts, k = cfg.topK, f = cfg.ffnSize();
  const int64_t slots = e * cfg.capacity();
  auto i32 = [&](ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, b.getI32Type());
  };
  Value logits = linear(x, p + ".router", e, /*bias=*/false);
  auto route =
      MoeRouterOp::create(b, loc(p + ".router"), i32({rows, k}), f32({rows, k}),
                          logits, static_cast<uint64_t>(k),
                          /*norm_topk=*/cfg.normTopK);
  if (cfg.auxLossCoeff > 0)
    MoeAuxLossOp::create(b, loc(p + ".aux_loss"), f32({}), logits,
                         route.getIndices(), static_cast<uint64_t>(e),
                         static_cast<uint64_t>(k),
                         llvm::APFloat(cfg.auxLossCoeff));
  Value buf = MoeDispatchOp::create(
      b, loc(p + ".dispatch"), f32({slots, cfg.hidden}), x, route.getIndices(),
      static_cast<uint64_t>(e), static_cast<uint64_t>(cfg.capacity()));
  Value hcur = ExpertLinearOp::create(
      b, loc(p + ".experts.w13"), f32({slots, 2 * f}), buf,
      ref(p + ".experts.w13"), static_cast<uint64_t>(e));
  hcur = SwigluOp::create(b, loc(p + ".experts.swiglu"), f32({slots, f}), hcur);
  hcur = ExpertLinearOp::create(
      b, loc(p + ".experts.w2"), f32({slots, cfg.hidden}), hcur,
      ref(p + ".experts.w2"), static_cast<uint64_t>(e));
  return MoeCombineOp::create(b, loc(p + ".combine"), act(cfg.hidden), hcur,
                              route.getIndices(), route.getWeights(),
                              static_cast<uint64_t>(e),
                              static_cast<uint64_t>(cfg.capacity()));
}

SegmentOp GptModelBuilder::beginSegment(StringRef name, int64_t block,
                                        TypeRange inputs, TypeRange results,
                                        Location where) {
  auto segment =
      SegmentOp::create(b, where, name, b.getFunctionType(inputs, results));
  setModelBlock(segment, block);
  b.setInsertionPointToStart(&segment.getBody().front());
  return segment;
}

Value GptModelBuilder::ref(const Twine &name) {
  std::string key = name.str();
  assert(paramTypes.count(key) && "parameter not declared");
  return ParamRefOp::create(b, loc(key), paramTypes[key], key);
}

Value GptModelBuilder::linear(Value x, const Twine &prefix, int64_t width,
                              bool bias) {
  std::string p = prefix.str();
  Value w = ref(p + ".weight");
  Value bv = bias ? ref(p + ".bias") : Value();
  return LinearOp::create(b, loc(p), act(width), x, w, bv);
}

Value GptModelBuilder::layerNorm(Value x, const Twine &prefix) {
  std::string p = prefix.str();
  Value gamma = ref(p + ".weight");
  Value beta = ref(p + ".bias");
  return LayerNormOp::create(b, loc(p), act(cfg.hidden), x, gamma, beta,
                             llvm::APFloat(cfg.layerNormEps));
}

SegmentOp GptModelBuilder::buildEmbed() {
  OpBuilder::InsertionGuard guard(b);
  SegmentOp segment =
      beginSegment("embed", 0, {idsType()}, {act(cfg.hidden)}, loc("embed"));
  Value tokens = segment.getBody().getArgument(0);
  if (cfg.llamaLike()) {
    Value x =
        EmbeddingOp::create(b, loc("tok_embeddings"), act(cfg.hidden), tokens,
                            ref("tok_embeddings.weight"), IntegerAttr());
    YieldOp::create(b, loc("embed"), ValueRange{x});
    return segment;
  }
  Value wte = ref("wte");
  Value wpe = ref("wpe");
  Value x = EmbeddingOp::create(b, loc("wte"), act(cfg.hidden), tokens, wte,
                                IntegerAttr());
  x = PositionAddOp::create(b, loc("wpe"), act(cfg.hidden), x, wpe,
                            b.getI64IntegerAttr(cfg.seq), IntegerAttr());
  YieldOp::create(b, loc("embed"), ValueRange{x});
  return segment;
}

SegmentOp GptModelBuilder::buildBlock(int64_t layer) {
  OpBuilder::InsertionGuard guard(b);
  const int64_t h = cfg.hidden;
  std::string p = "h." + std::to_string(layer);
  SegmentOp segment = beginSegment("block" + std::to_string(layer), layer + 1,
                                   {act(h)}, {act(h)}, loc(p));
  Value x = segment.getBody().getArgument(0);

  // Attention sub-block: x + c_proj(attention(c_attn(ln_1(x)))).
  Value y = layerNorm(x, p + ".ln_1");
  y = linear(y, p + ".attn.c_attn", 3 * h);
  y = AttentionOp::create(b, loc(p + ".attn"), act(h), act(2 * cfg.heads), y,
                          static_cast<uint64_t>(cfg.heads),
                          static_cast<uint64_t>(cfg.seq), IntegerAttr(),
                          FloatAttr(), RopeScalingAttr())
          .getResult();
  y = linear(y, p + ".attn.c_proj", h);
  x = AddOp::create(b, loc(p + ".attn.residual"), x, y);

  // MLP sub-block: x + c_proj(gelu(c_fc(ln_2(x)))).
  y = layerNorm(x, p + ".ln_2");
  y = linear(y, p + ".mlp.c_fc", cfg.ffnSize());
  y = GeluOp::create(b, loc(p + ".mlp.gelu"), y);
  y = linear(y, p + ".mlp.c_proj", h);
  x = AddOp::create(b, loc(p + ".mlp.residual"), x, y);

  YieldOp::create(b, loc(p), ValueRange{x});
  return segment;
}

SegmentOp GptModelBuilder::buildHead() {
  OpBuilder::InsertionGuard guard(b);
  SegmentOp segment =
      beginSegment("head", cfg.layers + 1, {act(cfg.hidden), idsType()},
                   {f32({})}, loc("head"));
  Value x = segment.getBody().getArgument(0);
  Value targets = segment.getBody().getArgument(1);
  Value logits;
  if (cfg.llamaLike()) {
    x = rmsNorm(x, "norm");
    // Tied (Llama 3.2's tie_word_embeddings): the head is the token
    // embedding's transpose.
    logits = cfg.tiedHead
                 ? LinearOp::create(b, loc("output"), act(cfg.vocab), x,
                                    ref("tok_embeddings.weight"), Value(),
                                    /*transpose_w=*/true)
                       .getResult()
                 : linear(x, "output", cfg.vocab, /*bias=*/false);
  } else {
    x = layerNorm(x, "ln_f");
  }
  if (logits) {
  } else if (cfg.tiedHead)
    logits = LinearOp::create(b, loc("lm_head"), act(cfg.vocab), x, ref("wte"),
                              Value(), /*transpose_w=*/true);
  else
    logits = linear(x, "lm_head", cfg.vocab, /*bias=*/false);
  Value loss = CrossEntropyOp::create(b, loc("loss"), f32({}), logits, targets);
  YieldOp::create(b, loc("head"), ValueRange{loss});
  return segment;
}

void GptModelBuilder::buildProgram(ArrayRef<SegmentOp> segments) {
  OpBuilder::InsertionGuard guard(b);
  auto program = ProgramOp::create(b, loc("model"), "model");
  b.setInsertionPointToStart(&program.getBody().front());
  Type token = TokenType::get(ctx);
  auto batch = BatchOp::create(b, loc("batch"), idsType(), idsType(), token,
                               TagAttr::get(b.getContext()));
  Value x = batch.getTokens();
  for (SegmentOp segment : segments) {
    SmallVector<Value, 2> args{x};
    if (segment == segments.back())
      args.push_back(batch.getTargets());
    int64_t block = *getModelBlock(segment);
    auto tag = TagAttr::get(b.getContext(), std::nullopt, std::nullopt,
                            std::nullopt, std::nullopt, block);
    auto task =
        TaskOp::create(b, loc(segment.getSymName()), segment.getResultTypes(),
                       token, segment.getSymName(), args, ValueRange{}, tag,
                       /*devices=*/DeviceGroupAttr(), /*stream=*/StreamAttr(),
                       /*send_stream=*/StreamAttr());
    x = task.getOuts().front();
  }
}

OwningOpRef<ModuleOp> GptModelBuilder::build() {
  ctx->getOrLoadDialect<PiperDialect>();
  OwningOpRef<ModuleOp> module =
      ModuleOp::create(loc(cfg.family == ModelFamily::Llama      ? "llama"
                           : cfg.family == ModelFamily::Qwen3Moe ? "qwen3-moe"
                                                                 : "gpt"));
  b.setInsertionPointToEnd(module->getBody());
  buildParams();
  SmallVector<SegmentOp> segments;
  segments.push_back(buildEmbed());
  for (int64_t i = 0; i < cfg.layers; ++i)
    segments.push_back(cfg.llamaLike() ? buildLlamaBlock(i) : buildBlock(i));
  segments.push_back(buildHead());
  buildProgram(segments);
  return module;
}

OwningOpRef<ModuleOp> mlir::piper::buildGptModel(MLIRContext *ctx,
                                                 const GptConfig &cfg) {
  assert(validateGptConfig(cfg).empty() && "invalid GPT config");
  return GptModelBuilder(ctx, cfg).build();
}

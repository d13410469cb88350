// Unit tests of the GPT model front end: structure, verification, round trip.
#include <catch2/catch.hpp>

#include <cctype>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "compiler/frontend/GptModel.h"
#include "dialects/piper/PiperDialect.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"

using namespace mlir;
using namespace mlir::piper;

namespace {

/// Prints `op` to a string, optionally with locations.
std::string print(Operation *op, bool debugInfo = false) {
  std::string text;
  llvm::raw_string_ostream os(text);
  OpPrintingFlags flags;
  if (debugInfo)
    flags.enableDebugInfo(/*enable=*/true, /*prettyForm=*/false);
  op->print(os, flags);
  return text;
}

/// Returns the ops of type `OpT` directly in the module body, in order.
template <typename OpT>
std::vector<OpT> topLevel(ModuleOp module) {
  std::vector<OpT> ops;
  for (Operation &op : module.getBody()->getOperations())
    if (auto typed = dyn_cast<OpT>(op))
      ops.push_back(typed);
  return ops;
}

/// GPT-2 parameter count, computed from the formula rather than the IR.
int64_t expectedParamCount(const GptConfig &c) {
  int64_t h = c.hidden;
  int64_t perLayer = 2 * h                 // ln_1
                     + h * 3 * h + 3 * h   // attn.c_attn
                     + h * h + h           // attn.c_proj
                     + 2 * h               // ln_2
                     + h * 4 * h + 4 * h   // mlp.c_fc
                     + 4 * h * h + h;      // mlp.c_proj
  int64_t total = c.vocab * h + c.seq * h + c.layers * perLayer + 2 * h;
  if (!c.tiedHead)
    total += h * c.vocab;
  return total;
}

/// Builds `cfg`, requiring a valid config and a module that verifies.
OwningOpRef<ModuleOp> buildVerified(MLIRContext &ctx, const GptConfig &cfg) {
  REQUIRE(validateGptConfig(cfg) == "");
  OwningOpRef<ModuleOp> module = buildGptModel(&ctx, cfg);
  REQUIRE(module);
  REQUIRE(succeeded(verify(*module)));
  return module;
}

/// The small config whose IR is documented for the pass authors.
GptConfig tinyConfig() {
  GptConfig cfg;
  cfg.layers = 1;
  cfg.hidden = 8;
  cfg.heads = 2;
  cfg.vocab = 16;
  cfg.seq = 4;
  cfg.batch = 2;
  return cfg;
}

} // namespace

TEST_CASE("default GPT builds and verifies", "[frontend]") {
  MLIRContext ctx;
  GptConfig cfg;
  OwningOpRef<ModuleOp> module = buildVerified(ctx, cfg);
  CHECK(ctx.getLoadedDialect<PiperDialect>() != nullptr);
}

TEST_CASE("parameters follow GPT-2 naming, shapes and init", "[frontend]") {
  MLIRContext ctx;
  GptConfig cfg; // 4 layers, hidden 64, vocab 256, seq 32, untied
  OwningOpRef<ModuleOp> module = buildVerified(ctx, cfg);
  std::vector<ParamOp> params = topLevel<ParamOp>(*module);

  // 2 embeddings + 12 per layer + ln_f (2) + lm_head.
  CHECK(params.size() == static_cast<size_t>(2 + 12 * cfg.layers + 2 + 1));
  int64_t total = 0;
  for (ParamOp p : params)
    total += p.getTensorType().getNumElements();
  CHECK(total == expectedParamCount(cfg));
  CHECK(total == 4 * (12 * 64 * 64 + 13 * 64) + 256 * 64 + 32 * 64 + 2 * 64 +
                     64 * 256);

  // Parameters come first in the module, then segments, then the program.
  Operation *first = &module->getBody()->front();
  CHECK(isa<ParamOp>(first));
  CHECK(isa<ProgramOp>(module->getBody()->back()));
  bool seenNonParam = false;
  for (Operation &op : module->getBody()->getOperations()) {
    if (!isa<ParamOp>(op))
      seenNonParam = true;
    else
      CHECK_FALSE(seenNonParam);
  }

  auto find = [&](llvm::StringRef name) {
    auto p = module->lookupSymbol<ParamOp>(name);
    REQUIRE(p);
    return p;
  };
  CHECK(params.front().getSymName() == "wte");
  CHECK(params[1].getSymName() == "wpe");
  CHECK(params[2].getSymName() == "h.0.ln_1.weight");
  CHECK(params.back().getSymName() == "lm_head.weight");

  auto shape = [&](llvm::StringRef name) {
    return std::vector<int64_t>(find(name).getTensorType().getShape().begin(),
                                find(name).getTensorType().getShape().end());
  };
  CHECK(shape("wte") == std::vector<int64_t>{256, 64});
  CHECK(shape("wpe") == std::vector<int64_t>{32, 64});
  CHECK(shape("h.3.attn.c_attn.weight") == std::vector<int64_t>{64, 192});
  CHECK(shape("h.3.attn.c_attn.bias") == std::vector<int64_t>{192});
  CHECK(shape("h.3.mlp.c_fc.weight") == std::vector<int64_t>{64, 256});
  CHECK(shape("h.3.mlp.c_proj.weight") == std::vector<int64_t>{256, 64});
  CHECK(shape("lm_head.weight") == std::vector<int64_t>{64, 256});

  CHECK(find("h.1.ln_2.weight").getInit() == InitKind::ones);
  CHECK(find("h.1.ln_2.bias").getInit() == InitKind::zeros);
  CHECK(find("h.1.mlp.c_fc.bias").getInit() == InitKind::zeros);
  ParamOp attnW = find("h.1.attn.c_attn.weight");
  CHECK(attnW.getInit() == InitKind::normal);
  CHECK(attnW.getScale().convertToDouble() == Approx(0.02));
  // Residual projections: std / sqrt(2 * layers).
  for (llvm::StringRef name : {"h.2.attn.c_proj.weight", "h.2.mlp.c_proj.weight"}) {
    ParamOp p = find(name);
    CHECK(p.getInit() == InitKind::normal);
    CHECK(p.getScale().convertToDouble() == Approx(0.02 / std::sqrt(8.0)));
  }
  CHECK(find("lm_head.weight").getScale().convertToDouble() == Approx(0.02));
}

TEST_CASE("segments and tasks form the forward chain", "[frontend]") {
  MLIRContext ctx;
  GptConfig cfg;
  OwningOpRef<ModuleOp> module = buildVerified(ctx, cfg);

  std::vector<SegmentOp> segments = topLevel<SegmentOp>(*module);
  REQUIRE(segments.size() == static_cast<size_t>(cfg.layers + 2));
  std::vector<std::string> names;
  for (auto [k, seg] : llvm::enumerate(segments)) {
    names.push_back(seg.getSymName().str());
    std::optional<int64_t> block = getModelBlock(seg);
    REQUIRE(block);
    CHECK(*block == static_cast<int64_t>(k));
  }
  CHECK(names == std::vector<std::string>{"embed", "block0", "block1",
                                          "block2", "block3", "head"});

  auto i32 = IntegerType::get(&ctx, 32);
  auto f32 = Float32Type::get(&ctx);
  auto ids = RankedTensorType::get({4, 32}, i32);
  auto act = RankedTensorType::get({128, 64}, f32);
  CHECK(segments.front().getFunctionType() ==
        FunctionType::get(&ctx, {ids}, {act}));
  CHECK(segments[1].getFunctionType() == FunctionType::get(&ctx, {act}, {act}));
  CHECK(segments.back().getFunctionType() ==
        FunctionType::get(&ctx, {act, ids}, {RankedTensorType::get({}, f32)}));

  // A block: 2 layer norms, 4 linears, attention, gelu, 2 residual adds.
  int lns = 0, linears = 0, attns = 0, gelus = 0, adds = 0;
  segments[2].walk([&](Operation *op) {
    lns += isa<LayerNormOp>(op);
    linears += isa<LinearOp>(op);
    attns += isa<AttentionOp>(op);
    gelus += isa<GeluOp>(op);
    adds += isa<AddOp>(op);
  });
  CHECK(lns == 2);
  CHECK(linears == 4);
  CHECK(attns == 1);
  CHECK(gelus == 1);
  CHECK(adds == 2);
  segments[2].walk([&](AttentionOp op) {
    CHECK(op.getHeads() == 4);
    CHECK(op.getSeq() == 32);
  });

  std::vector<ProgramOp> programs = topLevel<ProgramOp>(*module);
  REQUIRE(programs.size() == 1);
  ProgramOp program = programs.front();
  CHECK(program.getSymName() == "model");
  std::vector<BatchOp> batches;
  std::vector<TaskOp> tasks;
  for (Operation &op : program.getBody().front()) {
    if (auto batch = dyn_cast<BatchOp>(op))
      batches.push_back(batch);
    else if (auto task = dyn_cast<TaskOp>(op))
      tasks.push_back(task);
    else
      FAIL("unexpected program node " << op.getName().getStringRef().str());
  }
  REQUIRE(batches.size() == 1);
  CHECK(batches.front().getTag() == TagAttr::get(batches.front().getContext()));
  CHECK(isa<BatchOp>(program.getBody().front().front()));
  REQUIRE(tasks.size() == segments.size());
  Value prev = batches.front().getTokens();
  for (auto [k, task] : llvm::enumerate(tasks)) {
    CHECK(task.getSegment() == segments[k].getSymName());
    CHECK(task.getTag() ==
          TagAttr::get(task.getContext(), std::nullopt, std::nullopt,
                       std::nullopt, std::nullopt, static_cast<int64_t>(k)));
    CHECK_FALSE(task.getDevices().has_value());
    CHECK_FALSE(task.getStream().has_value());
    CHECK(task.getDeps().empty());
    REQUIRE(!task.getArgs().empty());
    CHECK(task.getArgs()[0] == prev);
    prev = task.getOuts()[0];
  }
  TaskOp head = tasks.back();
  REQUIRE(head.getArgs().size() == 2);
  CHECK(head.getArgs()[1] == batches.front().getTargets());
  CHECK(head.getOuts()[0].use_empty());
}

TEST_CASE("tied head reuses wte transposed", "[frontend]") {
  MLIRContext ctx;
  GptConfig cfg;
  cfg.tiedHead = true;
  OwningOpRef<ModuleOp> module = buildVerified(ctx, cfg);

  CHECK_FALSE(module->lookupSymbol("lm_head.weight"));
  std::vector<ParamOp> params = topLevel<ParamOp>(*module);
  CHECK(params.size() == static_cast<size_t>(2 + 12 * cfg.layers + 2));
  int64_t total = 0;
  for (ParamOp p : params)
    total += p.getTensorType().getNumElements();
  CHECK(total == expectedParamCount(cfg));

  auto head = module->lookupSymbol<SegmentOp>("head");
  REQUIRE(head);
  int transposed = 0;
  head.walk([&](LinearOp op) {
    REQUIRE(op.getTransposeW());
    ++transposed;
    CHECK_FALSE(op.getBias());
    auto ref = op.getWeight().getDefiningOp<ParamRefOp>();
    REQUIRE(ref);
    CHECK(ref.getParam() == "wte");
    CHECK(op.getResult().getType() ==
          RankedTensorType::get({128, 256}, Float32Type::get(&ctx)));
  });
  CHECK(transposed == 1);
  CHECK(print(*module).find("transpose_w") != std::string::npos);

  // Untied: the head reads lm_head.weight untransposed.
  GptConfig untied;
  OwningOpRef<ModuleOp> plain = buildVerified(ctx, untied);
  CHECK(print(*plain).find("transpose_w") == std::string::npos);
  plain->lookupSymbol<SegmentOp>("head").walk([&](LinearOp op) {
    auto ref = op.getWeight().getDefiningOp<ParamRefOp>();
    REQUIRE(ref);
    CHECK(ref.getParam() == "lm_head.weight");
  });
}

TEST_CASE("printing and re-parsing round-trips", "[frontend]") {
  for (bool tied : {false, true}) {
    for (bool debugInfo : {false, true}) {
      MLIRContext ctx;
      GptConfig cfg;
      cfg.tiedHead = tied;
      OwningOpRef<ModuleOp> module = buildVerified(ctx, cfg);
      std::string text = print(*module, debugInfo);
      // Dotted names are valid bare identifiers: MLIR prints them unquoted.
      CHECK(text.find("piper.param @h.0.ln_1.weight : tensor<64xf32>") !=
            std::string::npos);
      CHECK(text.find("piper.param_ref @h.3.mlp.c_proj.bias") !=
            std::string::npos);

      MLIRContext ctx2;
      ctx2.loadDialect<PiperDialect>();
      OwningOpRef<ModuleOp> parsed = parseSourceString<ModuleOp>(text, &ctx2);
      REQUIRE(parsed);
      REQUIRE(succeeded(verify(*parsed)));
      CHECK(print(*parsed, debugInfo) == text);
    }
  }
}

TEST_CASE("ops carry locations naming their layer", "[frontend]") {
  MLIRContext ctx;
  OwningOpRef<ModuleOp> module = buildVerified(ctx, GptConfig());
  auto name = [](Operation *op) -> std::string {
    auto loc = dyn_cast<NameLoc>(op->getLoc());
    return loc ? loc.getName().str() : "<unnamed>";
  };
  module->walk([&](Operation *op) {
    if (op != module->getOperation())
      CHECK(name(op) != "<unnamed>");
  });
  auto block2 = module->lookupSymbol<SegmentOp>("block2");
  REQUIRE(block2);
  CHECK(name(block2) == "h.2");
  block2.walk([&](AttentionOp op) { CHECK(name(op) == "h.2.attn"); });
  block2.walk([&](GeluOp op) { CHECK(name(op) == "h.2.mlp.gelu"); });
  CHECK(name(module->lookupSymbol("h.2.ln_1.weight")) == "h.2.ln_1.weight");

  // A diagnostic on an op names its layer.
  std::string message;
  ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &diag) {
    llvm::raw_string_ostream os(message);
    os << diag.getLocation() << ": " << diag.str();
    return success();
  });
  block2.walk([&](AttentionOp op) { op.emitError("boom"); });
  CHECK(message.find("h.2.attn") != std::string::npos);
}

TEST_CASE("small configs build", "[frontend]") {
  MLIRContext ctx;
  GptConfig tiny = tinyConfig();
  OwningOpRef<ModuleOp> module = buildVerified(ctx, tiny);
  CHECK(topLevel<SegmentOp>(*module).size() == 3);
  int64_t total = 0;
  for (ParamOp p : topLevel<ParamOp>(*module))
    total += p.getTensorType().getNumElements();
  CHECK(total == expectedParamCount(tiny));

  GptConfig oneHead = tiny;
  oneHead.heads = 1;
  oneHead.tiedHead = true;
  buildVerified(ctx, oneHead);
}

TEST_CASE("validateGptConfig rejects bad configs", "[frontend]") {
  auto check = [](GptConfig cfg, const std::string &expected) {
    std::string msg = validateGptConfig(cfg);
    INFO("message: " << msg);
    REQUIRE_FALSE(msg.empty());
    CHECK(msg.find(expected) != std::string::npos);
    CHECK(std::islower(static_cast<unsigned char>(msg.front())));
    CHECK(msg.back() != '.');
  };
  CHECK(validateGptConfig(GptConfig()) == "");
  CHECK(validateGptConfig(tinyConfig()) == "");

  GptConfig c;
  c.hidden = 65;
  check(c, "hidden (65) must be divisible by heads (4)");
  c = GptConfig();
  c.layers = 0;
  check(c, "layers must be positive, got 0");
  c = GptConfig();
  c.hidden = -8;
  check(c, "hidden must be positive");
  c = GptConfig();
  c.heads = 0;
  check(c, "heads must be positive");
  c = GptConfig();
  c.vocab = 0;
  check(c, "vocab must be positive");
  c = GptConfig();
  c.seq = 0;
  check(c, "seq must be positive");
  c = GptConfig();
  c.batch = -1;
  check(c, "batch must be positive");
  c = GptConfig();
  c.initStd = 0;
  check(c, "init std must be positive");
  c = GptConfig();
  c.initStd = std::nan("");
  check(c, "init std");
  c = GptConfig();
  c.vocab = int64_t(1) << 40;
  check(c, "vocab must be at most");
  c = GptConfig();
  c.batch = int64_t(1) << 20;
  c.seq = int64_t(1) << 20;
  check(c, "batch * seq");
  c = GptConfig();
  c.layers = 100000;
  check(c, "layers must be at most 10000");
}

// Hidden (run with "[.dump]"): prints the documented 1-layer model.
TEST_CASE("dump the tiny model", "[.dump]") {
  MLIRContext ctx;
  OwningOpRef<ModuleOp> module = buildVerified(ctx, tinyConfig());
  std::cout << print(*module);
}

namespace {
/// Total elements of every piper.param in `module`.
int64_t totalParamElements(ModuleOp module) {
  int64_t n = 0;
  for (ParamOp p : module.getOps<ParamOp>())
    n += p.getTensorType().getNumElements();
  return n;
}
} // namespace

TEST_CASE("llama builds with RMSNorm, rotary GQA attention and SwiGLU",
          "[frontend]") {
  MLIRContext ctx;
  GptConfig cfg;
  cfg.family = ModelFamily::Llama;
  cfg.layers = 2;
  cfg.hidden = 64;
  cfg.heads = 4;
  cfg.kvHeads = 2;
  REQUIRE(validateGptConfig(cfg).empty());
  OwningOpRef<ModuleOp> module = buildGptModel(&ctx, cfg);
  REQUIRE(succeeded(verify(*module)));
  // Independent count: embeddings, per layer (2 norms, qkv with 2 kv heads of
  // 16, wo, w13, w2), final norm, head. FFN: 8/3*64 rounded up to 32 = 192.
  int64_t h = 64, qkv = (4 + 2 * 2) * 16, f = 192;
  int64_t perLayer = 2 * h + h * qkv + h * h + h * 2 * f + f * h;
  int64_t expected = 256 * h + 2 * perLayer + h + h * 256;
  CHECK(cfg.ffnSize() == f);
  CHECK(totalParamElements(*module) == expected);
  CHECK(countParameters(cfg) == expected);
  int attention = 0, rms = 0, swiglu = 0;
  module->walk([&](AttentionOp op) {
    ++attention;
    CHECK(op.getNumKvHeads() == 2);
    CHECK(op.getRopeTheta());
  });
  module->walk([&](RmsNormOp) { ++rms; });
  module->walk([&](SwigluOp) { ++swiglu; });
  CHECK(attention == 2);
  CHECK(rms == 2 * 2 + 1);
  CHECK(swiglu == 2);
  CHECK(module->lookupSymbol("output.weight"));
  CHECK_FALSE(module->lookupSymbol("wpe"));
}

TEST_CASE("a tied llama head is the token embedding's transpose",
          "[frontend]") {
  MLIRContext ctx;
  for (bool tied : {false, true}) {
    GptConfig cfg;
    cfg.family = ModelFamily::Llama;
    cfg.kvHeads = 2;
    cfg.tiedHead = tied;
    REQUIRE(validateGptConfig(cfg).empty());
    OwningOpRef<ModuleOp> module = buildGptModel(&ctx, cfg);
    CHECK(countParameters(cfg) == totalParamElements(*module));
    CHECK(bool(module->lookupSymbol("output.weight")) == !tied);
    int transposed = 0;
    module->walk([&](LinearOp op) { transposed += op.getTransposeW(); });
    CHECK(transposed == (tied ? 1 : 0));
  }
}

TEST_CASE("countParameters matches the GPT module", "[frontend]") {
  MLIRContext ctx;
  for (bool tied : {false, true}) {
    GptConfig cfg;
    cfg.tiedHead = tied;
    OwningOpRef<ModuleOp> module = buildGptModel(&ctx, cfg);
    CHECK(countParameters(cfg) == totalParamElements(*module));
  }
}

TEST_CASE("llama configs are validated", "[frontend]") {
  GptConfig cfg;
  cfg.family = ModelFamily::Llama;
  cfg.kvHeads = 3;
  CHECK(validateGptConfig(cfg).find("multiple of kv_heads") != std::string::npos);
  cfg.kvHeads = 2;
  cfg.rmsEps = 0;
  CHECK(validateGptConfig(cfg).find("rms norm epsilon") != std::string::npos);
  cfg.rmsEps = 1e-6;
  cfg.hidden = 12;
  cfg.heads = 4; // head dim 3: odd
  CHECK(validateGptConfig(cfg).find("even head dimension") != std::string::npos);
  GptConfig gpt;
  gpt.kvHeads = 2;
  CHECK(validateGptConfig(gpt).find("grouped-query") != std::string::npos);
}

TEST_CASE("qwen3: a q/k norm per head and a head size of its own",
          "[frontend]") {
  MLIRContext ctx;
  GptConfig cfg;
  cfg.family = ModelFamily::Llama;
  cfg.hidden = 32;
  cfg.heads = 4;
  cfg.kvHeads = 2;
  cfg.headDim = 12; // 4 x 12 = 48 != 32
  cfg.qkNorm = true;
  REQUIRE(validateGptConfig(cfg).empty());
  OwningOpRef<ModuleOp> module = buildGptModel(&ctx, cfg);
  CHECK(countParameters(cfg) == totalParamElements(*module));
  auto norm =
      module->lookupSymbol<ParamOp>("layers.0.attention.qk_norm.weight");
  REQUIRE(norm);
  CHECK(norm.getTensorType().getShape() == ArrayRef<int64_t>{24});
  auto wo = module->lookupSymbol<ParamOp>("layers.0.attention.wo.weight");
  CHECK(wo.getTensorType().getShape() == ArrayRef<int64_t>{48, 32});
  int norms = 0;
  module->walk([&](QkNormOp op) {
    ++norms;
    // q|k|v of (4 + 2 x 2) heads of 12, read by the attention.
    CHECK(op.getQkv().getType().getDimSize(1) == 96);
    CHECK(isa<AttentionOp>(*op.getResult().getUsers().begin()));
  });
  CHECK(norms == cfg.layers);
  // Odd head sizes cannot rotate; gpt has neither.
  cfg.headDim = 7;
  CHECK(validateGptConfig(cfg).find("even head dimension") !=
        std::string::npos);
  cfg.headDim = -1;
  CHECK(validateGptConfig(cfg).find("head_dim") != std::string::npos);
  GptConfig gpt;
  gpt.qkNorm = true;
  CHECK(validateGptConfig(gpt).find("q/k norm") != std::string::npos);
}

TEST_CASE("qwen3-moe: dense layers among expert layers", "[frontend]") {
  MLIRContext ctx;
  GptConfig cfg;
  cfg.family = ModelFamily::Qwen3Moe;
  cfg.layers = 3;
  cfg.ffn = 16;
  cfg.denseFfn = 40;
  cfg.denseLayers = {1};
  cfg.normTopK = false;
  REQUIRE(validateGptConfig(cfg).empty());
  OwningOpRef<ModuleOp> module = buildGptModel(&ctx, cfg);
  CHECK(countParameters(cfg) == totalParamElements(*module));
  CHECK(module->lookupSymbol("layers.0.moe.experts.w13"));
  CHECK_FALSE(module->lookupSymbol("layers.1.moe.experts.w13"));
  auto dense = module->lookupSymbol<ParamOp>("layers.1.feed_forward.w2.weight");
  REQUIRE(dense);
  CHECK(dense.getTensorType().getShape() == ArrayRef<int64_t>{40, 64});
  int routers = 0;
  module->walk([&](MoeRouterOp op) {
    ++routers;
    CHECK_FALSE(op->hasAttr("norm_topk"));
  });
  CHECK(routers == 2);
  cfg.denseLayers = {2, 1};
  CHECK(validateGptConfig(cfg).find("ascending") != std::string::npos);
  cfg.denseLayers = {3};
  CHECK(validateGptConfig(cfg).find("[0, 3)") != std::string::npos);
  GptConfig llama;
  llama.family = ModelFamily::Llama;
  llama.denseLayers = {0};
  CHECK(validateGptConfig(llama).find("only qwen3-moe") != std::string::npos);
}

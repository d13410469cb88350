// `piperc model`: a built-in model or preset, or the model of a Hugging
// Face config.json, emitted in the piper dialect.
#include "compiler/driver/DriverSupport.h"

#include <CLI/CLI.hpp>
#include <memory>

#include "compiler/frontend/GptModel.h"
#include "compiler/frontend/HfConfig.h"
#include "compiler/frontend/Presets.h"
#include "dialects/piper/PiperDialect.h"
#include "llvm/ADT/Twine.h"

using namespace mlir;
using namespace mlir::piper;
using namespace mlir::piper::driver;

namespace {
struct ModelOptions {
  std::string name;
  /// --hf DIR (its config.json) or --hf-config FILE.
  std::string hfDir, hfConfig;
  GptConfig gpt;
  std::string output;
  bool list = false;
  double ropeTheta = 0;
};

int runModel(const ModelOptions &opts, const CLI::App &cmd) {
  if (opts.list) {
    llvm::outs() << formatPresetTable();
    return 0;
  }
  auto given = [&](const char *flag) { return cmd.count(flag) > 0; };
  if (!opts.hfDir.empty() || !opts.hfConfig.empty()) {
    if (!opts.name.empty())
      return fail("give a model name or --hf/--hf-config, not both");
    if (!opts.hfDir.empty() && !opts.hfConfig.empty())
      return fail("give --hf DIR or --hf-config FILE, not both (--hf reads "
                  "DIR/config.json)");
    for (const char *flag :
         {"--layers", "--hidden", "--heads", "--kv-heads", "--head-dim",
          "--qk-norm", "--ffn", "--vocab", "--tied", "--rope-theta",
          "--experts", "--top-k", "--capacity-factor", "--aux-loss-coeff"})
      if (given(flag))
        return fail(std::string(flag) +
                    " cannot be combined with --hf/--hf-config: the sizes "
                    "come from config.json (only --seq and --batch apply)");
    if (!given("--seq"))
      return fail("--hf/--hf-config need --seq (the configuration has only "
                  "the longest sequence, max_position_embeddings)");
    std::string path = !opts.hfConfig.empty()
                           ? opts.hfConfig
                           : (llvm::Twine(opts.hfDir) + "/config.json").str();
    std::string text;
    if (std::string err = readHfConfigFile(path, text); !err.empty())
      return fail(err);
    GptConfig cfg;
    if (std::string err = gptConfigFromHuggingFace(
            text, path, opts.gpt.seq, given("--batch") ? opts.gpt.batch : 1,
            cfg);
        !err.empty())
      return fail(err);
    MLIRContext ctx;
    ctx.loadDialect<PiperDialect>();
    OwningOpRef<ModuleOp> module = buildGptModel(&ctx, cfg);
    if (std::string err = annotateHuggingFace(*module, cfg, text); !err.empty())
      return fail(err);
    return writeOutput(*module, opts.output);
  }
  if (opts.name.empty())
    return fail("name a model (see piperc model --list)");
  std::optional<ModelPreset> preset = findPreset(opts.name);
  if (!preset)
    return fail("unknown model '" + opts.name + "' (see piperc model --list)");
  // Flags given on the command line override the preset.
  GptConfig cfg = preset->config;
  struct IntFlag {
    const char *flag;
    int64_t GptConfig::*field;
  };
  for (IntFlag f : {IntFlag{"--layers", &GptConfig::layers},
                    IntFlag{"--hidden", &GptConfig::hidden},
                    IntFlag{"--heads", &GptConfig::heads},
                    IntFlag{"--kv-heads", &GptConfig::kvHeads},
                    IntFlag{"--head-dim", &GptConfig::headDim},
                    IntFlag{"--ffn", &GptConfig::ffn},
                    IntFlag{"--vocab", &GptConfig::vocab},
                    IntFlag{"--seq", &GptConfig::seq},
                    IntFlag{"--batch", &GptConfig::batch},
                    IntFlag{"--experts", &GptConfig::experts},
                    IntFlag{"--top-k", &GptConfig::topK}})
    if (given(f.flag))
      cfg.*f.field = opts.gpt.*f.field;
  struct FloatFlag {
    const char *flag;
    double GptConfig::*field;
  };
  for (FloatFlag f :
       {FloatFlag{"--capacity-factor", &GptConfig::capacityFactor},
        FloatFlag{"--aux-loss-coeff", &GptConfig::auxLossCoeff}})
    if (given(f.flag))
      cfg.*f.field = opts.gpt.*f.field;
  if (given("--tied"))
    cfg.tiedHead = opts.gpt.tiedHead;
  if (given("--qk-norm"))
    cfg.qkNorm = opts.gpt.qkNorm;
  if (given("--rope-theta"))
    cfg.ropeTheta = opts.ropeTheta;
  if (std::string err = validateGptConfig(cfg); !err.empty())
    return fail("invalid " + opts.name + " config: " + err);
  MLIRContext ctx;
  ctx.loadDialect<PiperDialect>();
  OwningOpRef<ModuleOp> module = buildGptModel(&ctx, cfg);
  return writeOutput(*module, opts.output);
}
} // namespace

Subcommand mlir::piper::driver::addModelCommand(CLI::App &app) {
  auto opts = std::make_shared<ModelOptions>();
  ModelOptions &model = *opts;
  CLI::App *modelCmd =
      app.add_subcommand("model", "emit a built-in model in the piper dialect");
  modelCmd->add_option("name", model.name, "model or preset name (see --list)");
  modelCmd->add_flag("--list", model.list,
                     "list the models and presets with parameter counts");
  modelCmd->add_option("--hf", model.hfDir,
                       "a Hugging Face model folder: the model of its "
                       "config.json (LlamaForCausalLM, Qwen3ForCausalLM, "
                       "Qwen3MoeForCausalLM, GPT2LMHeadModel; with --seq, "
                       "--batch; docs/hugging-face.md)");
  modelCmd->add_option("--hf-config", model.hfConfig,
                       "a Hugging Face config.json file (as --hf)");
  modelCmd->add_option("--layers", model.gpt.layers, "transformer blocks");
  modelCmd->add_option("--hidden", model.gpt.hidden, "hidden size");
  modelCmd->add_option("--heads", model.gpt.heads, "attention heads");
  modelCmd->add_option("--kv-heads", model.gpt.kvHeads,
                       "key/value heads (llama: grouped-query attention)");
  modelCmd->add_option("--head-dim", model.gpt.headDim,
                       "width of each attention head (llama, qwen3, "
                       "qwen3-moe); default hidden / heads");
  modelCmd
      ->add_option("--qk-norm", model.gpt.qkNorm,
                   "Qwen3's RMSNorm of each query and key head (llama, "
                   "qwen3-moe; on in the qwen3 presets)")
      ->expected(0, 1)
      ->default_str("true");
  modelCmd->add_option("--ffn", model.gpt.ffn, "MLP hidden size");
  modelCmd->add_option("--vocab", model.gpt.vocab, "vocabulary size");
  modelCmd->add_option("--seq", model.gpt.seq, "sequence length");
  modelCmd->add_option("--batch", model.gpt.batch,
                       "microbatch size (sequences)");
  modelCmd
      ->add_option("--tied", model.gpt.tiedHead,
                   "tie the LM head to the token embedding")
      ->expected(0, 1)
      ->default_str("true");
  modelCmd->add_option("--rope-theta", model.ropeTheta,
                       "rotary embedding base (llama, qwen3-moe)");
  modelCmd->add_option("--experts", model.gpt.experts,
                       "experts per MoE layer (qwen3-moe)");
  modelCmd->add_option("--top-k", model.gpt.topK,
                       "experts per token (qwen3-moe)");
  modelCmd->add_option("--capacity-factor", model.gpt.capacityFactor,
                       "expert slots = ceil(factor * tokens * top_k / "
                       "experts); 0 = dropless (qwen3-moe)");
  modelCmd->add_option("--aux-loss-coeff", model.gpt.auxLossCoeff,
                       "weight of the load-balancing loss (qwen3-moe)");
  modelCmd->add_option("-o,--output", model.output,
                       "output file (default stdout)");
  return {modelCmd, [opts, modelCmd] { return runModel(*opts, *modelCmd); }};
}

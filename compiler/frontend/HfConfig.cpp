// Hugging Face configurations to GptConfig (see HfConfig.h and
// docs/hugging-face.md). Every key of the configuration is either read,
// checked against what Piper's model computes, or known not to change the
// math (token ids, dtype, caching); any other key is an error, so that no
// setting is silently dropped.
#include "compiler/frontend/HfConfig.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <utility>

#include "compiler/strategy/JsonScan.h"
#include "proto/InputFile.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CheckedArithmetic.h"
#include "llvm/Support/JSON.h"

using namespace mlir;
using namespace mlir::piper;

namespace {

/// Keys of every `transformers` configuration that change nothing Piper
/// computes: identifiers, token ids, generation and output switches, the
/// stored dtype (a checkpoint's own dtype is read from its files).
const char *const kNeutralKeys[] = {
    "_name_or_path",     "architectures",        "bos_token_id",
    "eos_token_id",      "pad_token_id",         "torch_dtype",
    "dtype",             "transformers_version", "use_cache",
    "output_attentions", "output_hidden_states", "return_dict",
    "tokenizer_class",   "_attn_implementation", "model_type",
};

/// The largest size a key may give: plan.proto's int32 fields and
/// validateGptConfig's limit, so that a product of two sizes never wraps.
constexpr int64_t kMaxHfSize = std::numeric_limits<int32_t>::max();

/// A number as JSON would show it: 0.1, 1e-05, 2.
std::string formatNumber(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", value);
  // The shortest form that reads back the same, as JSON writers print.
  for (int digits = 1; digits < 17; ++digits) {
    char shortBuf[32];
    std::snprintf(shortBuf, sizeof(shortBuf), "%.*g", digits, value);
    if (std::strtod(shortBuf, nullptr) == value)
      return shortBuf;
  }
  return buf;
}

class Reader {
public:
  Reader(const llvm::json::Object &obj, std::string where)
      : obj(obj), where(std::move(where)) {}

  std::string error(const llvm::Twine &message) const {
    return (where + ": " + message).str();
  }

  /// Marks `key` as handled.
  void use(llvm::StringRef key) { used.insert(key); }

  /// The value at `key` (marked handled), or null when absent or null.
  const llvm::json::Value *present(llvm::StringRef key) {
    use(key);
    const llvm::json::Value *v = obj.get(key);
    return v && v->kind() != llvm::json::Value::Null ? v : nullptr;
  }

  /// An integer size at `key` (required unless `fallback` is given).
  std::optional<int64_t> size(llvm::StringRef key, std::string &err,
                              std::optional<int64_t> fallback = {}) {
    const llvm::json::Value *v = present(key);
    if (!v) {
      if (!fallback)
        err = error("\"" + key + "\" is missing (an integer)");
      return fallback;
    }
    std::optional<int64_t> n = v->getAsInteger();
    if (!n || *n <= 0)
      return fail(key, "a positive integer", err);
    if (*n > kMaxHfSize)
      return fail(key,
                  "at most " + std::to_string(kMaxHfSize) + ", got " +
                      std::to_string(*n),
                  err);
    return n;
  }

  /// The product of `factors` (each a key and its size), or the error
  /// naming the keys when it does not fit in int64; "" when it does.
  std::string product(
      std::initializer_list<std::pair<llvm::StringRef, int64_t>> factors,
      int64_t &out) const {
    out = 1;
    std::string keys;
    bool wrapped = false;
    for (const auto &[key, value] : factors) {
      keys += (keys.empty() ? "\"" : " x \"") + key.str() + "\"";
      std::optional<int64_t> p = llvm::checkedMul(out, value);
      wrapped |= !p;
      out = p.value_or(0);
    }
    return wrapped ? error(keys + " overflows 64-bit integers") : "";
  }

  /// A finite number at `key`, or `fallback` when absent.
  std::optional<double> number(llvm::StringRef key, double fallback,
                               std::string &err) {
    const llvm::json::Value *v = present(key);
    if (!v)
      return fallback;
    std::optional<double> d = v->getAsNumber();
    if (!d || !std::isfinite(*d))
      return fail(key, "a number", err);
    return d;
  }

  /// A boolean at `key`, or `fallback` when absent.
  std::optional<bool> boolean(llvm::StringRef key, bool fallback,
                              std::string &err) {
    const llvm::json::Value *v = present(key);
    if (!v)
      return fallback;
    std::optional<bool> b = v->getAsBoolean();
    if (!b)
      return fail(key, "true or false", err);
    return b;
  }

  /// A string at `key`, or `fallback` when absent.
  std::optional<std::string> string(llvm::StringRef key,
                                    llvm::StringRef fallback,
                                    std::string &err) {
    const llvm::json::Value *v = present(key);
    if (!v)
      return fallback.str();
    std::optional<llvm::StringRef> str = v->getAsString();
    if (!str)
      return fail(key, "a string", err);
    return str->str();
  }

  const llvm::json::Value *get(llvm::StringRef key) {
    use(key);
    return obj.get(key);
  }

  /// The error for the first key neither read nor neutral, naming `arch`;
  /// "" when there is none.
  std::string rejectUnknownKeys(llvm::StringRef arch) const {
    if (std::optional<std::string> key = unknownKey())
      return error("unknown key \"" + *key +
                   "\": Piper cannot tell whether it changes " + arch +
                   "'s math (docs/hugging-face.md lists the keys it reads "
                   "and ignores)");
    return "";
  }

  /// The error for a sequence of `seq` tokens longer than `positions`
  /// (the configuration's `key`); "" when it fits.
  std::string checkSeq(int64_t seq, llvm::StringRef key,
                       int64_t positions) const {
    if (seq <= positions)
      return "";
    return error("the sequence of " + std::to_string(seq) +
                 " tokens is longer than \"" + key + "\" " +
                 std::to_string(positions));
  }

  /// The first key, in sorted order (deterministic messages), neither
  /// read nor known to be neutral.
  std::optional<std::string> unknownKey() const {
    std::optional<std::string> first;
    for (const auto &kv : obj) {
      llvm::StringRef key = kv.first;
      if (used.contains(key))
        continue;
      if (llvm::is_contained(kNeutralKeys, key))
        continue;
      if (!first || key < *first)
        first = key.str();
    }
    return first;
  }

private:
  /// Sets `err` to "\"key\" must be <what>"; no value.
  std::nullopt_t fail(llvm::StringRef key, llvm::StringRef what,
                      std::string &err) const {
    err = error("\"" + key + "\" must be " + what);
    return std::nullopt;
  }

  const llvm::json::Object &obj;
  std::string where;
  llvm::StringSet<> used;
};

/// The architecture the configuration names ("architectures"[0], or from
/// "model_type"), or an error.
std::string architectureOf(const llvm::json::Object &obj,
                           llvm::StringRef source, std::string &arch) {
  if (const llvm::json::Value *a = obj.get("architectures");
      a && a->kind() != llvm::json::Value::Null) {
    const llvm::json::Array *list = a->getAsArray();
    if (!list || list->size() != 1 || !(*list)[0].getAsString())
      return (source + ": \"architectures\" must list one architecture "
                       "name")
          .str();
    arch = (*list)[0].getAsString()->str();
    return "";
  }
  std::optional<llvm::StringRef> type = obj.getString("model_type");
  if (type == "llama")
    arch = "LlamaForCausalLM";
  else if (type == "gpt2")
    arch = "GPT2LMHeadModel";
  else if (type == "qwen3")
    arch = "Qwen3ForCausalLM";
  else if (type == "qwen3_moe")
    arch = "Qwen3MoeForCausalLM";
  else
    return (source + ": names no architecture (\"architectures\" or a known "
                     "\"model_type\")")
        .str();
  return "";
}

/// Llama 3.1's "rope_scaling" of type "llama3" into `cfg`: every key
/// required (transformers requires them too), none unknown.
std::string readLlama3Scaling(Reader &r, const llvm::json::Object &s,
                              GptConfig &cfg) {
  static const llvm::StringRef kKeys[] = {"rope_type",
                                          "type",
                                          "rope_theta",
                                          "factor",
                                          "low_freq_factor",
                                          "high_freq_factor",
                                          "original_max_position_embeddings"};
  for (const auto &kv : s)
    if (!llvm::is_contained(kKeys, llvm::StringRef(kv.first)))
      return r.error("unknown key \"" + kv.first.str() +
                     "\" in \"rope_scaling\" of type \"llama3\"");
  auto number = [&](const char *key, double &out) -> std::string {
    std::optional<double> v = s.getNumber(key);
    if (!v)
      return r.error(std::string("\"rope_scaling\" of type \"llama3\" needs "
                                 "a number \"") +
                     key + "\"");
    out = *v;
    return "";
  };
  double original = 0;
  for (auto [key, field] :
       {std::pair{"factor", &cfg.ropeFactor},
        std::pair{"low_freq_factor", &cfg.ropeLowFreqFactor},
        std::pair{"high_freq_factor", &cfg.ropeHighFreqFactor},
        std::pair{"original_max_position_embeddings", &original}})
    if (std::string e = number(key, *field); !e.empty())
      return e;
  if (!(cfg.ropeFactor > 0) || !(cfg.ropeLowFreqFactor > 0) ||
      !(cfg.ropeHighFreqFactor > cfg.ropeLowFreqFactor) || !(original >= 1) ||
      original != std::floor(original) || original > 1e15)
    return r.error("\"rope_scaling\" of type \"llama3\" needs factor > 0, 0 "
                   "< low_freq_factor < high_freq_factor and a positive "
                   "integer original_max_position_embeddings");
  cfg.ropeOriginalMaxPosition = static_cast<int64_t>(original);
  return "";
}

/// Qwen3MoeForCausalLM's mixture-of-experts keys into `cfg` (whose ffn is
/// intermediate_size so far): num_experts experts of moe_intermediate_size,
/// num_experts_per_tok of them per token, dropless, norm_topk_prob; layer i
/// has experts unless it is in mlp_only_layers or (i + 1) is not a multiple
/// of decoder_sparse_step (Qwen3MoeDecoderLayer), else a dense MLP of
/// intermediate_size. transformers adds its load-balancing loss only with
/// output_router_logits, pooled over every layer's tokens, which Piper's
/// per-layer loss is not: that is refused.
std::string readQwen3MoeLayers(Reader &r, GptConfig &cfg) {
  std::string err;
  // transformers 5 writes num_experts as "num_local_experts" (its
  // attribute_map); either, or both when equal.
  auto experts = r.size("num_experts", err, int64_t(128));
  if (r.present("num_local_experts")) {
    auto local = r.size("num_local_experts", err);
    if (!err.empty())
      return err;
    if (r.present("num_experts") && *local != *experts)
      return r.error("\"num_local_experts\" " + std::to_string(*local) +
                     " contradicts \"num_experts\" " +
                     std::to_string(*experts));
    experts = local;
  }
  auto topK = r.size("num_experts_per_tok", err, int64_t(8));
  auto expertFfn = r.size("moe_intermediate_size", err, int64_t(768));
  auto step = r.size("decoder_sparse_step", err, int64_t(1));
  auto normTopK = r.boolean("norm_topk_prob", false, err);
  auto routerLogits = r.boolean("output_router_logits", false, err);
  r.number("router_aux_loss_coef", 0.001, err);
  if (!err.empty())
    return err;
  int64_t unused = 0;
  if (std::string e = r.product({{"num_experts", *experts},
                                 {"moe_intermediate_size", *expertFfn},
                                 {"hidden_size", cfg.hidden}},
                                unused);
      !e.empty())
    return e;
  if (*routerLogits)
    return r.error("\"output_router_logits\": true adds transformers' "
                   "load-balancing loss, pooled over every layer's tokens, "
                   "which Piper does not compute (its auxiliary loss is per "
                   "layer); set it to false");
  std::vector<int64_t> mlpOnly;
  if (const llvm::json::Value *v = r.get("mlp_only_layers");
      v && v->kind() != llvm::json::Value::Null) {
    const llvm::json::Array *list = v->getAsArray();
    if (!list)
      return r.error("\"mlp_only_layers\" must be a list of layer indices");
    for (const llvm::json::Value &i : *list) {
      std::optional<int64_t> n = i.getAsInteger();
      if (!n || *n < 0 || *n >= cfg.layers)
        return r.error("\"mlp_only_layers\" must list layer indices in [0, " +
                       std::to_string(cfg.layers) + ")");
      mlpOnly.push_back(*n);
    }
  }
  cfg.denseFfn = cfg.ffn;
  cfg.ffn = *expertFfn;
  cfg.experts = *experts;
  cfg.topK = *topK;
  cfg.normTopK = *normTopK;
  cfg.capacityFactor = 0; // dropless, as transformers
  cfg.auxLossCoeff = 0;
  cfg.denseLayers.clear();
  for (int64_t i = 0; i < cfg.layers; ++i)
    if (llvm::is_contained(mlpOnly, i) || (i + 1) % *step != 0)
      cfg.denseLayers.push_back(i);
  return "";
}

/// LlamaForCausalLM (Llama 2, 3, and 3.1/3.2 with rope scaling "llama3"):
/// RMSNorm, rotary embeddings on the first and second halves of each head
/// (`transformers`' rotate_half, as Piper's kernels), grouped-query attention,
/// SwiGLU, no biases, the head tied to the token embedding or not. With
/// `qwen3`, Qwen3ForCausalLM: the same, plus an RMSNorm of each query and
/// key head before the rotation (q_norm, k_norm), head_dim 128 unless
/// given, tied by default, and sliding-window keys (which must be off).
/// With `moe` too, Qwen3MoeForCausalLM (readQwen3Moe's layers).
std::string readLlama(Reader &r, GptConfig &cfg, bool qwen3, bool moe) {
  std::string err;
  cfg.family = moe ? ModelFamily::Qwen3Moe : ModelFamily::Llama;
  cfg.qkNorm = qwen3;
  auto hidden = r.size("hidden_size", err);
  auto layers = r.size("num_hidden_layers", err);
  auto heads = r.size("num_attention_heads", err);
  auto ffn = r.size("intermediate_size", err);
  auto vocab = r.size("vocab_size", err);
  if (!err.empty())
    return err;
  auto kvHeads = r.size("num_key_value_heads", err, *heads);
  auto positions = r.size("max_position_embeddings", err, int64_t(0));
  // Qwen3's default head size is 128; Qwen3-MoE's (transformers reads it
  // with getattr) hidden / heads.
  auto headDim =
      r.size("head_dim", err, qwen3 && !moe ? 128 : *hidden / *heads);
  auto theta = r.number("rope_theta", 10000.0, err);
  auto eps = r.number("rms_norm_eps", 1e-6, err);
  auto init = r.number("initializer_range", 0.02, err);
  auto attnDropout = r.number("attention_dropout", 0.0, err);
  auto act = r.string("hidden_act", "silu", err);
  auto attnBias = r.boolean("attention_bias", false, err);
  auto mlpBias = r.boolean("mlp_bias", false, err);
  auto tied = r.boolean("tie_word_embeddings", qwen3 && !moe, err);
  std::optional<int64_t> tp = 1;
  std::optional<bool> sliding = false;
  if (qwen3) {
    sliding = r.boolean("use_sliding_window", false, err);
    // Read only with use_sliding_window (checked below to be off).
    r.use("sliding_window");
    r.use("max_window_layers");
  } else {
    tp = r.size("pretraining_tp", err, int64_t(1));
  }
  if (!err.empty())
    return err;
  if (*sliding)
    return r.error("\"use_sliding_window\": true is not implemented (Piper's "
                   "attention is full causal attention)");
  // transformers 5 writes layer_types for Llama too; Piper's attention is
  // full causal attention, so every layer must say so (a sliding layer
  // would be trained as a full one).
  if (const llvm::json::Value *types = r.get("layer_types");
      types && types->kind() != llvm::json::Value::Null) {
    const llvm::json::Array *list = types->getAsArray();
    if (!list)
      return r.error("\"layer_types\" must be a list");
    if (static_cast<int64_t>(list->size()) != *layers)
      return r.error("\"layer_types\" lists " +
                     std::to_string(list->size()) +
                     " layers, \"num_hidden_layers\" is " +
                     std::to_string(*layers));
    for (size_t i = 0; i < list->size(); ++i)
      if ((*list)[i].getAsString() !=
          std::optional<llvm::StringRef>("full_attention"))
        return r.error("\"layer_types\" lists a layer that is not "
                       "\"full_attention\" (layer " +
                       std::to_string(i) +
                       "): sliding-window attention is not implemented");
  }
  if (*act != "silu")
    return r.error("\"hidden_act\" is \"" + *act +
                   "\": Piper's Llama MLP is SwiGLU (\"silu\")");
  if (*attnBias)
    return r.error("\"attention_bias\": true is not implemented (Piper's "
                   "Llama projections have no bias)");
  if (*mlpBias)
    return r.error("\"mlp_bias\": true is not implemented (Piper's Llama "
                   "MLP has no bias)");
  if (*attnDropout != 0)
    return r.error("\"attention_dropout\" is " + formatNumber(*attnDropout) +
                   ": Piper trains without dropout (set it to 0)");

  // pretraining_tp > 1 only slices `transformers`' matrix products; the
  // math is the same.
  (void)tp;
  // transformers 5 writes "rope_parameters" (rope_theta and the scaling
  // in one object) where 4 wrote "rope_theta" and "rope_scaling".
  const llvm::json::Value *scaling = r.get("rope_scaling");
  llvm::StringRef scalingKey = "rope_scaling";
  if (const llvm::json::Value *params = r.get("rope_parameters");
      params && params->kind() != llvm::json::Value::Null) {
    const llvm::json::Object *p = params->getAsObject();
    if (!p)
      return r.error("\"rope_parameters\" must be an object or null");
    if (scaling && scaling->kind() != llvm::json::Value::Null)
      return r.error("both \"rope_parameters\" and \"rope_scaling\" are "
                     "given: transformers reads one");
    std::optional<double> inner = p->getNumber("rope_theta");
    if (!inner || !std::isfinite(*inner))
      return r.error("\"rope_parameters\" needs a number \"rope_theta\"");
    if (r.present("rope_theta") && *inner != *theta)
      return r.error("\"rope_theta\" " + formatNumber(*theta) +
                     " contradicts \"rope_parameters\" \"rope_theta\" " +
                     formatNumber(*inner));
    theta = inner;
    scaling = params;
    scalingKey = "rope_parameters";
  }
  if (scaling && scaling->kind() != llvm::json::Value::Null) {
    const llvm::json::Object *s = scaling->getAsObject();
    if (!s)
      return r.error("\"rope_scaling\" must be an object or null");
    std::optional<llvm::StringRef> type = s->getString("rope_type");
    if (!type)
      type = s->getString("type");
    if (!type && scalingKey == "rope_parameters")
      type = "default";
    if (!type)
      return r.error("\"rope_scaling\" names no \"rope_type\"");
    if (*type == "default" && scalingKey == "rope_parameters")
      for (const auto &kv : *s)
        if (kv.first != "rope_type" && kv.first != "rope_theta")
          return r.error("unknown key \"" + kv.first.str() +
                         "\" in \"rope_parameters\" of type \"default\"");
    if (*type == "llama3") {
      if (std::string e = readLlama3Scaling(r, *s, cfg); !e.empty())
        return e;
    } else if (*type != "default") {
      return r.error("\"" + scalingKey + "\" of type \"" + *type +
                     "\" is not implemented (Piper implements \"default\" "
                     "and \"llama3\")");
    }
  }
  if (*positions)
    if (std::string e =
            r.checkSeq(cfg.seq, "max_position_embeddings", *positions);
        !e.empty())
      return e;
  // The size products the model is made of, checked: each size is at
  // most kMaxHfSize, but three of them can wrap (a wrapped heads x head_dim
  // once equalled hidden_size and took a head_dim of 2^62 + 8 for the
  // default).
  int64_t width = 0, unused = 0;
  for (const std::string &e :
       {r.product({{"num_attention_heads", *heads}, {"head_dim", *headDim}},
                  width),
        r.product({{"vocab_size", *vocab}, {"hidden_size", *hidden}}, unused),
        r.product({{"hidden_size", *hidden}, {"num_hidden_layers", *layers}},
                  unused),
        r.product({{"num_attention_heads", *heads},
                   {"head_dim", *headDim},
                   {"hidden_size", *hidden}},
                  unused),
        r.product({{"num_key_value_heads", *kvHeads},
                   {"head_dim", *headDim},
                   {"hidden_size", *hidden}},
                  unused),
        r.product({{"intermediate_size", *ffn},
                   {"hidden_size", *hidden},
                   {"num_hidden_layers", *layers}},
                  unused)})
    if (!e.empty())
      return e;
  cfg.hidden = *hidden;
  cfg.layers = *layers;
  cfg.heads = *heads;
  cfg.kvHeads = *kvHeads;
  // transformers' head size; hidden / heads when it is that (the default).
  cfg.headDim = width == *hidden ? 0 : *headDim;
  cfg.ffn = *ffn;
  cfg.vocab = *vocab;
  if (moe)
    if (std::string e = readQwen3MoeLayers(r, cfg); !e.empty())
      return e;
  cfg.ropeTheta = *theta;
  cfg.rmsEps = *eps;
  cfg.initStd = *init;
  cfg.tiedHead = *tied;
  return r.rejectUnknownKeys(moe     ? "Qwen3MoeForCausalLM"
                             : qwen3 ? "Qwen3ForCausalLM"
                                     : "LlamaForCausalLM");
}

/// GPT2LMHeadModel: learned positions (a table of n_positions rows),
/// LayerNorm with bias, Conv1D projections with biases, the tanh GELU, the
/// head tied to the token embedding unless tie_word_embeddings is false.
std::string readGpt2(Reader &r, GptConfig &cfg) {
  std::string err;
  cfg.family = ModelFamily::Gpt;
  auto hidden = r.size("n_embd", err);
  auto layers = r.size("n_layer", err);
  auto heads = r.size("n_head", err);
  auto vocab = r.size("vocab_size", err);
  auto positions = r.size("n_positions", err);
  if (!err.empty())
    return err;
  // n_embd is at most kMaxHfSize: 4 x n_embd fits.
  auto inner = r.size("n_inner", err, 4 * *hidden);
  auto eps = r.number("layer_norm_epsilon", 1e-5, err);
  auto init = r.number("initializer_range", 0.02, err);
  auto act = r.string("activation_function", "gelu_new", err);
  auto tied = r.boolean("tie_word_embeddings", true, err);
  auto scale = r.boolean("scale_attn_weights", true, err);
  auto byLayer = r.boolean("scale_attn_by_inverse_layer_idx", false, err);
  auto cross = r.boolean("add_cross_attention", false, err);
  // Upcasting the attention to float32 changes nothing in float32.
  r.boolean("reorder_and_upcast_attn", false, err);
  // The legacy context size: n_positions is the table's.
  r.size("n_ctx", err, int64_t(0));
  std::optional<double> dropouts[3];
  const char *dropoutKeys[3] = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};
  for (int i = 0; i < 3; ++i)
    dropouts[i] = r.number(dropoutKeys[i], 0.1, err);
  if (!err.empty())
    return err;
  // Settings of GPT2DoubleHeadsModel's classification head (absent from
  // GPT2LMHeadModel) and of other tasks.
  for (const char *key : {"summary_type", "summary_use_proj",
                          "summary_activation", "summary_proj_to_labels",
                          "summary_first_dropout", "task_specific_params"})
    r.use(key);
  if (*act != "gelu_new" && *act != "gelu_pytorch_tanh")
    return r.error("\"activation_function\" is \"" + *act +
                   "\": Piper's GPT MLP uses the tanh GELU (\"gelu_new\")");
  if (!*scale)
    return r.error("\"scale_attn_weights\": false is not implemented (Piper "
                   "scales scores by 1/sqrt(head_dim))");
  if (*byLayer)
    return r.error("\"scale_attn_by_inverse_layer_idx\": true is not "
                   "implemented");
  if (*cross)
    return r.error("\"add_cross_attention\": true is not implemented "
                   "(Piper's GPT is decoder-only)");
  for (int i = 0; i < 3; ++i)
    if (*dropouts[i] != 0)
      return r.error(std::string("\"") + dropoutKeys[i] + "\" is " +
                     formatNumber(*dropouts[i]) +
                     " (GPT-2's default is 0.1 when absent): Piper trains "
                     "without dropout; set it to 0.0 in config.json to train "
                     "this model without it");
  if (std::string e = r.checkSeq(cfg.seq, "n_positions", *positions);
      !e.empty())
    return e;
  // The size products the model is made of, checked (as Llama's).
  int64_t unused = 0;
  for (const std::string &e :
       {r.product({{"vocab_size", *vocab}, {"n_embd", *hidden}}, unused),
        r.product({{"n_positions", *positions}, {"n_embd", *hidden}}, unused),
        r.product({{"n_embd", *hidden}, {"n_layer", *layers}}, unused),
        r.product({{"n_inner", *inner}, {"n_embd", *hidden}, {"n_layer", *layers}},
                  unused)})
    if (!e.empty())
      return e;
  cfg.hidden = *hidden;
  cfg.layers = *layers;
  cfg.heads = *heads;
  cfg.vocab = *vocab;
  cfg.ffn = *inner;
  cfg.positions = *positions;
  cfg.layerNormEps = *eps;
  cfg.initStd = *init;
  cfg.tiedHead = *tied;
  return r.rejectUnknownKeys("GPT2LMHeadModel");
}

} // namespace

std::string mlir::piper::readHfConfigFile(const std::string &path,
                                          std::string &text) {
  if (std::string err = ::piper::readInputFile(path, text,
                                               ::piper::kMaxHfConfigBytes);
      !err.empty())
    return ::piper::inputError("Hugging Face configuration", path, err);
  return "";
}

std::string mlir::piper::gptConfigFromHuggingFace(llvm::StringRef text,
                                                  llvm::StringRef source,
                                                  int64_t seq, int64_t batch,
                                                  GptConfig &out) {
  // llvm::json recurses once per level: a deep input would overflow the
  // stack before the parser could say no.
  JsonScan scan = scanJson(text, "the configuration");
  if (!scan.nesting.empty())
    return (source + ": " + scan.nesting).str();
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(text);
  if (!parsed)
    return (source + ": not JSON: " + llvm::toString(parsed.takeError()))
        .str();
  // llvm::json keeps a repeated key's last value without a word.
  if (!scan.duplicate.empty())
    return (source + ": " + scan.duplicate).str();
  const llvm::json::Object *obj = parsed->getAsObject();
  if (!obj)
    return (source + ": a configuration is a JSON object").str();
  std::string arch;
  if (std::string err = architectureOf(*obj, source, arch); !err.empty())
    return err;
  if (arch != "LlamaForCausalLM" && arch != "GPT2LMHeadModel" &&
      arch != "Qwen3ForCausalLM" && arch != "Qwen3MoeForCausalLM")
    return (source + ": unknown architecture \"" + arch +
            "\" (supported: LlamaForCausalLM, Qwen3ForCausalLM, "
            "Qwen3MoeForCausalLM, GPT2LMHeadModel)")
        .str();
  GptConfig cfg;
  cfg.seq = seq;
  cfg.batch = batch;
  Reader r(*obj, (source + " (" + arch + ")").str());
  if (std::string err = arch == "GPT2LMHeadModel"
                            ? readGpt2(r, cfg)
                            : readLlama(r, cfg, arch.rfind("Qwen3", 0) == 0,
                                        arch == "Qwen3MoeForCausalLM");
      !err.empty())
    return err;
  if (std::string err = validateGptConfig(cfg); !err.empty())
    return (source + ": " + err).str();
  out = cfg;
  return "";
}

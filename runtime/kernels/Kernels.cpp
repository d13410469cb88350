// The kernel registry (op name -> function, resolved once per plan), the
// checks common to every operand, the attribute decoder (names to
// KernelAttr ids, once per kernel at plan load) and the public attribute
// readers.
#include "runtime/kernels/Kernels.h"

#include <cblas.h>

#include <cmath>
#include <cstdint>

#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/Parallel.h"
#include "runtime/kernels/VecMath.h"

#include <cstring>
#include <unordered_map>

namespace piper::runtime {

namespace {

// Order is the order kernelNames() reports: forward, backward, then state.
// Indices are filled in by registry().
KernelInfo kernelTable[] = {
    {"embedding", detail::embeddingKernel, 0},
    {"position_add", detail::positionAddKernel, 0},
    {"layer_norm", detail::layerNormKernel, 0},
    {"rms_norm", detail::rmsNormKernel, 0},
    {"add_layer_norm", detail::addLayerNormKernel, 0},
    {"add_rms_norm", detail::addRmsNormKernel, 0},
    {"qk_norm", detail::qkNormKernel, 0},
    {"linear", detail::linearKernel, 0},
    {"gelu", detail::geluKernel, 0},
    {"linear_gelu", detail::linearGeluKernel, 0},
    {"swiglu", detail::swigluKernel, 0},
    {"add", detail::addKernel, 0},
    {"bias_add", detail::biasAddKernel, 0},
    {"sp_split", detail::spSplitKernel, 0},
    {"columns", detail::columnsKernel, 0},
    {"tp_kv_assemble", detail::tpKvAssembleKernel, 0},
    {"attention", detail::attentionKernel, 0},
    {"attention_block", detail::attentionBlockKernel, 0},
    {"cp_ulysses_split", detail::ulyssesSplitKernel, 0},
    {"cp_ulysses_merge", detail::ulyssesMergeKernel, 0},
    {"cp_ulysses_natural", detail::ulyssesNaturalKernel, 0},
    {"cp_ulysses_zigzag", detail::ulyssesZigzagKernel, 0},
    {"cp_split", detail::cpSplitKernel, 0},
    {"moe_router", detail::moeRouterKernel, 0},
    {"moe_dispatch", detail::moeDispatchKernel, 0},
    {"expert_linear", detail::expertLinearKernel, 0},
    {"moe_combine", detail::moeCombineKernel, 0},
    {"moe_aux_loss", detail::moeAuxLossKernel, 0},
    {"moe_ep_counts", detail::moeEpCountsKernel, 0},
    {"moe_ep_pack", detail::moeEpPackKernel, 0},
    {"moe_ep_unpack", detail::moeEpUnpackKernel, 0},
    {"moe_ep_gather", detail::moeEpGatherKernel, 0},
    {"moe_ep_scatter", detail::moeEpScatterKernel, 0},
    {"cross_entropy", detail::crossEntropyKernel, 0},
    {"vocab_ce_stats", detail::vocabCeStatsKernel, 0},
    {"vocab_cross_entropy", detail::vocabCrossEntropyKernel, 0},
    {"loss_accumulate", detail::lossAccumulateKernel, 0},
    {"embedding_grad", detail::embeddingGradKernel, 0},
    {"position_add_grad", detail::positionAddGradKernel, 0},
    {"layer_norm_grad_input", detail::layerNormGradInputKernel, 0},
    {"layer_norm_grad_weight", detail::layerNormGradWeightKernel, 0},
    {"rms_norm_grad_input", detail::rmsNormGradInputKernel, 0},
    {"rms_norm_grad_weight", detail::rmsNormGradWeightKernel, 0},
    {"layer_norm_grad_input_add", detail::layerNormGradInputAddKernel, 0},
    {"rms_norm_grad_input_add", detail::rmsNormGradInputAddKernel, 0},
    {"qk_norm_grad_input", detail::qkNormGradInputKernel, 0},
    {"qk_norm_grad_weight", detail::qkNormGradWeightKernel, 0},
    {"linear_grad_input", detail::linearGradInputKernel, 0},
    {"columns_grad", detail::columnsGradKernel, 0},
    {"cp_split_grad", detail::cpSplitGradKernel, 0},
    {"tp_kv_assemble_grad", detail::tpKvAssembleGradKernel, 0},
    {"linear_grad_weight", detail::linearGradWeightKernel, 0},
    {"bias_grad", detail::biasGradKernel, 0},
    {"linear_grad_weight_bias", detail::linearGradWeightBiasKernel, 0},
    {"gelu_grad", detail::geluGradKernel, 0},
    {"linear_grad_input_gelu", detail::linearGradInputGeluKernel, 0},
    {"swiglu_grad", detail::swigluGradKernel, 0},
    {"attention_grad", detail::attentionGradKernel, 0},
    {"attention_block_grad", detail::attentionBlockGradKernel, 0},
    {"moe_router_grad", detail::moeRouterGradKernel, 0},
    {"moe_dispatch_grad", detail::moeDispatchGradKernel, 0},
    {"expert_linear_grad_input", detail::expertLinearGradInputKernel, 0},
    {"expert_linear_grad_weight", detail::expertLinearGradWeightKernel, 0},
    {"moe_combine_grad", detail::moeCombineGradKernel, 0},
    {"moe_aux_loss_grad", detail::moeAuxLossGradKernel, 0},
    {"cross_entropy_grad", detail::crossEntropyGradKernel, 0},
    {"cross_entropy_fused", detail::crossEntropyFusedKernel, 0},
    {"vocab_cross_entropy_grad", detail::vocabCrossEntropyGradKernel, 0},
    {"accumulate", detail::accumulateKernel, 0},
    {"zero", detail::zeroKernel, 0},
    {"adamw", detail::adamwKernel, 0},
};

/// The registry by name, built once.
const std::unordered_map<std::string, const KernelInfo *> &registry() {
  static const auto *byName = [] {
    auto *map = new std::unordered_map<std::string, const KernelInfo *>();
    int index = 0;
    for (KernelInfo &entry : kernelTable) {
      entry.index = index++;
      map->emplace(entry.name, &entry);
    }
    return map;
  }();
  return *byName;
}

} // namespace

bool kernelReadsOutputs(const std::string &op) {
  return op == "accumulate" || op == "adamw";
}

bool kernelReadsOutputs(const plan::Kernel &kernel) {
  if (kernelReadsOutputs(kernel.op()))
    return true;
  auto it = kernel.attrs().find("accumulate");
  return it != kernel.attrs().end() && it->second.i() != 0;
}

const KernelInfo *findKernel(const std::string &name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second;
}

namespace {

// Indexed by KernelAttr: one name per id, in its order.
constexpr const char *kAttrNames[] = {
    "accumulate",                 // kAccumulate
    "beta1",                      // kBeta1
    "beta2",                      // kBeta2
    "capacity",                   // kCapacity
    "cp",                         // kCp
    "eps",                        // kEps
    "experts",                    // kExperts
    "heads",                      // kHeads
    "kv_heads",                   // kKvHeads
    "lr",                         // kLr
    "members",                    // kMembers
    "norm_topk",                  // kNormTopk
    "query",                      // kQuery
    "rope_factor",                // kRopeFactor
    "rope_high_freq_factor",      // kRopeHighFreqFactor
    "rope_low_freq_factor",       // kRopeLowFreqFactor
    "rope_original_max_position", // kRopeOriginalMaxPosition
    "rope_theta",                 // kRopeTheta
    "scale",                      // kScale
    "seq",                        // kSeq
    "start",                      // kStart
    "step",                       // kStep
    "top_k",                      // kTopK
    "transpose_w",                // kTransposeW
    "valid_cols",                 // kValidCols
    "vocab",                      // kVocab
    "weight_decay",               // kWeightDecay
};
static_assert(sizeof(kAttrNames) / sizeof(kAttrNames[0]) ==
                  static_cast<size_t>(KernelAttr::kCount),
              "one name per KernelAttr");

} // namespace

const char *kernelAttrName(KernelAttr id) {
  size_t i = static_cast<size_t>(id);
  return i < static_cast<size_t>(KernelAttr::kCount) ? kAttrNames[i] : "?";
}

KernelAttrs decodeKernelAttrs(const plan::Kernel &kernel) {
  KernelAttrs attrs;
  if (kernel.attrs().empty())
    return attrs;
  for (size_t i = 0; i < static_cast<size_t>(KernelAttr::kCount); ++i) {
    auto it = kernel.attrs().find(kAttrNames[i]);
    if (it == kernel.attrs().end())
      continue;
    KernelAttrs::Value &v = attrs[static_cast<KernelAttr>(i)];
    switch (it->second.value_case()) {
    case plan::AttrValue::kI:
      v.kind = KernelAttrs::Value::kInt;
      v.i = it->second.i();
      break;
    case plan::AttrValue::kF:
      v.kind = KernelAttrs::Value::kFloat;
      v.f = it->second.f();
      break;
    default: // a string, or an AttrValue with nothing set
      v.kind = KernelAttrs::Value::kOther;
      break;
    }
  }
  return attrs;
}

Status runKernel(const plan::Kernel &kernel,
                 const std::vector<TensorRef> &inputs,
                 const std::vector<TensorRef> &outputs, KernelContext &ctx) {
  const KernelInfo *info = findKernel(kernel.op());
  if (!info)
    return Status::error("unknown kernel '" + kernel.op() + "'");
  return runKernel(*info, kernel, decodeKernelAttrs(kernel), inputs, outputs,
                   ctx);
}

Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                 const KernelAttrs &attrs, const std::vector<TensorRef> &inputs,
                 const std::vector<TensorRef> &outputs, KernelContext &ctx) {
  detail::KernelArgs args{kernel, attrs, inputs, outputs, ctx};
  PIPER_RETURN_IF_ERROR(detail::checkOperandStorage(args));
  return info.fn(args);
}

std::vector<std::string> kernelNames() {
  registry(); // numbers the entries
  std::vector<std::string> names;
  for (const KernelInfo &entry : kernelTable)
    names.push_back(entry.name);
  return names;
}

double sumOfSquares(const float *x, int64_t n) {
  // Per-chunk partial sums, added in chunk order: the same on any number of
  // threads.
  const int64_t grain = detail::kElementGrain;
  std::vector<double> partial(n > 0 ? (n + grain - 1) / grain : 0);
  detail::parallelFor(n, grain, [&](int64_t begin, int64_t end) {
    partial[begin / grain] =
        detail::dotDouble(x + begin, x + begin, end - begin);
  });
  double sum = 0;
  for (double p : partial)
    sum += p;
  return sum;
}

void zeroBytes(void *data, int64_t bytes) {
  char *p = static_cast<char *>(data);
  detail::parallelFor(
      bytes, detail::kElementGrain * 4, [&](int64_t begin, int64_t end) {
        std::memset(p + begin, 0, static_cast<size_t>(end - begin));
      });
}

std::string blasDescription() {
  const char *core = openblas_get_corename();
  return std::string("OpenBLAS ") + (core ? core : "?") + " core, " +
         std::to_string(openblas_get_num_threads()) + " thread(s)";
}

int64_t attrInt(const plan::Kernel &kernel, const std::string &name,
                int64_t dflt) {
  auto it = kernel.attrs().find(name);
  if (it == kernel.attrs().end())
    return dflt;
  const plan::AttrValue &v = it->second;
  if (v.value_case() == plan::AttrValue::kI)
    return v.i();
  if (v.value_case() == plan::AttrValue::kF && std::isfinite(v.f()) &&
      std::fabs(v.f()) < 0x1p62)
    return static_cast<int64_t>(v.f());
  return dflt;
}

double attrFloat(const plan::Kernel &kernel, const std::string &name,
                 double dflt) {
  auto it = kernel.attrs().find(name);
  if (it == kernel.attrs().end())
    return dflt;
  const plan::AttrValue &v = it->second;
  if (v.value_case() == plan::AttrValue::kF)
    return v.f();
  if (v.value_case() == plan::AttrValue::kI)
    return static_cast<double>(v.i());
  return dflt;
}

} // namespace piper::runtime

// The kernel id table and the checks of kernels and backend registries
// against it (see KernelIds.h).
#include "proto/KernelIds.h"

#include <set>

namespace piper::plan {

const std::vector<KernelSignature> &kernelSignatures() {
  // name, inputs min..max, outputs, required attributes. docs/kernels.md
  // describes every operand and attribute.
  static const std::vector<KernelSignature> table = {
      // Forward.
      {"embedding", 2, 2, 1, {}},
      {"position_add", 2, 2, 1, {"seq"}},
      {"layer_norm", 3, 3, 1, {}},
      {"rms_norm", 2, 2, 1, {}},
      // add then the norm of its sum, fused by the compiler (the residual
      // stream's norm): (x, r, gamma[, beta]) -> (s = x + r, norm(s)).
      {"add_layer_norm", 4, 4, 2, {}},
      {"add_rms_norm", 3, 3, 2, {}},
      {"qk_norm", 2, 2, 1, {"heads"}},
      {"linear", 2, 3, 1, {}},
      {"gelu", 1, 1, 1, {}},
      // linear then gelu, fused by the compiler (GEMM epilogue on CUDA):
      // (x, w[, b]) -> (h = the linear's y, gelu(h)).
      {"linear_gelu", 2, 3, 2, {}},
      {"swiglu", 1, 1, 1, {}},
      {"add", 2, 2, 1, {}},
      {"bias_add", 2, 2, 1, {}},
      {"sp_split", 1, 1, 1, {"members"}},
      // Replicated key/value heads under tensor parallelism
      // (docs/tensor-parallel.md §2b).
      {"columns", 1, 1, 1, {"start"}},
      {"tp_kv_assemble", 2, 2, 1, {"members", "query"}},
      // y and the softmax statistics (lse) the backward reads.
      {"attention", 1, 1, 2, {"heads", "seq"}},
      // Ring attention under context parallelism: one step of the ring
      // (docs/context-parallel.md).
      {"attention_block", 2, 4, 2, {"heads", "seq", "cp", "step"}},
      // Ulysses context parallelism: the layouts around its all-to-alls
      // (each pair the other's inverse; the split and the zigzag also give
      // the all-to-all's send counts).
      {"cp_ulysses_split", 1, 1, 2, {"cp", "heads"}},
      {"cp_ulysses_merge", 1, 1, 1, {"cp", "heads"}},
      {"cp_ulysses_natural", 1, 1, 1, {"cp", "seq"}},
      {"cp_ulysses_zigzag", 1, 1, 2, {"cp", "seq"}},
      // MoE layers under context parallelism: the member's rows of the
      // gathered sequence.
      {"cp_split", 1, 1, 1, {"cp", "seq"}},
      {"moe_router", 1, 1, 2, {"top_k"}},
      {"moe_dispatch", 2, 2, 1, {"experts", "capacity"}},
      {"expert_linear", 2, 2, 1, {"experts"}},
      {"moe_combine", 3, 3, 1, {"experts", "capacity"}},
      {"moe_aux_loss", 2, 2, 1, {"experts", "top_k"}},
      // Expert parallelism: layouts around the all-to-alls (their own
      // inverses' gradients).
      {"moe_ep_counts", 1, 1, 3, {"experts", "capacity", "members"}},
      {"moe_ep_pack", 2, 2, 1, {"experts", "capacity"}},
      {"moe_ep_unpack", 2, 2, 1, {"experts", "capacity"}},
      {"moe_ep_gather", 2, 2, 1, {"experts", "capacity", "members"}},
      {"moe_ep_scatter", 2, 2, 1, {"experts", "capacity", "members"}},
      {"cross_entropy", 2, 2, 1, {}},
      // Vocabulary parallelism: a member's statistics, the loss from
      // their sum over the group (docs/tensor-parallel.md §5c).
      {"vocab_ce_stats", 2, 2, 1, {"members"}},
      {"vocab_cross_entropy", 3, 3, 1, {"members"}},
      {"loss_accumulate", 1, 1, 0, {}},
      // Backward.
      {"embedding_grad", 2, 2, 1, {}},
      {"position_add_grad", 1, 1, 1, {"seq"}},
      {"layer_norm_grad_input", 3, 3, 1, {}},
      {"layer_norm_grad_weight", 2, 2, 2, {}},
      {"rms_norm_grad_input", 3, 3, 1, {}},
      {"rms_norm_grad_weight", 2, 2, 1, {}},
      // a norm's grad_input then its add to the residual stream's
      // gradient, fused by the compiler: (x, gamma, dy, r) -> r + dx.
      {"layer_norm_grad_input_add", 4, 4, 1, {}},
      {"rms_norm_grad_input_add", 4, 4, 1, {}},
      {"qk_norm_grad_input", 3, 3, 1, {"heads"}},
      {"qk_norm_grad_weight", 2, 2, 1, {"heads"}},
      {"linear_grad_input", 2, 2, 1, {}},
      {"columns_grad", 1, 1, 1, {"start"}},
      {"cp_split_grad", 1, 1, 1, {"cp", "seq"}},
      {"tp_kv_assemble_grad", 1, 1, 1, {"members", "query"}},
      {"linear_grad_weight", 2, 2, 1, {}},
      {"bias_grad", 1, 1, 1, {}},
      {"linear_grad_weight_bias", 2, 2, 2, {}},
      {"gelu_grad", 2, 2, 1, {}},
      // linear_grad_input then gelu_grad, fused by the compiler:
      // (dy, w, h) -> (dy w^T) * gelu'(h).
      {"linear_grad_input_gelu", 3, 3, 1, {}},
      {"swiglu_grad", 2, 2, 1, {}},
      {"attention_grad", 4, 4, 1, {"heads", "seq"}},
      {"attention_block_grad", 5, 7, 2, {"heads", "seq", "cp", "step"}},
      {"moe_router_grad", 3, 3, 1, {"top_k"}},
      {"moe_dispatch_grad", 2, 2, 1, {"experts", "capacity"}},
      {"expert_linear_grad_input", 2, 2, 1, {}},
      {"expert_linear_grad_weight", 2, 2, 1, {}},
      {"moe_combine_grad", 4, 4, 2, {"experts", "capacity"}},
      {"moe_aux_loss_grad", 2, 2, 1, {"experts", "top_k"}},
      {"cross_entropy_grad", 2, 2, 1, {}},
      // The fused classifier: cross_entropy and cross_entropy_grad of the
      // same logits in one pass (loss, dlogits), in the forward.
      {"cross_entropy_fused", 2, 2, 2, {}},
      {"vocab_cross_entropy_grad", 3, 3, 1, {"members"}},
      // State and optimizer.
      {"accumulate", 1, 1, 1, {}},
      {"zero", 0, 0, 1, {}},
      {"adamw", 1, 1, 3, {"lr"}},
  };
  return table;
}

const KernelSignature *findKernelSignature(const std::string &name) {
  for (const KernelSignature &sig : kernelSignatures())
    if (name == sig.name)
      return &sig;
  return nullptr;
}

const PaddedOperands *findPaddedOperands(const std::string &name) {
  // linear's y, the gradients' dy, the logits and the dlogits.
  static const std::vector<std::pair<std::string, PaddedOperands>> table = {
      {"linear", {{}, {0}}},
      {"linear_grad_input", {{0}, {}}},
      {"linear_grad_weight", {{1}, {}}},
      {"cross_entropy", {{0}, {}}},
      {"cross_entropy_grad", {{0}, {0}}},
      {"cross_entropy_fused", {{0}, {1}}},
  };
  for (const auto &[op, operands] : table)
    if (op == name)
      return &operands;
  return nullptr;
}

namespace {

std::string count(int n, const char *noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

} // namespace

std::string checkKernelSignature(const Kernel &kernel) {
  const KernelSignature *sig = findKernelSignature(kernel.op());
  if (!sig)
    return "unknown kernel '" + kernel.op() + "'";
  std::string who = "kernel '" + kernel.op() + "'";
  if (kernel.inputs_size() < sig->minInputs ||
      kernel.inputs_size() > sig->maxInputs)
    return who + " takes " +
           (sig->minInputs == sig->maxInputs
                ? count(sig->minInputs, "input")
                : std::to_string(sig->minInputs) + " or " +
                      count(sig->maxInputs, "input")) +
           ", got " + std::to_string(kernel.inputs_size());
  if (kernel.outputs_size() != sig->outputs)
    return who + " takes " + count(sig->outputs, "output") + ", got " +
           std::to_string(kernel.outputs_size());
  for (const std::string &attr : sig->requiredAttrs) {
    auto it = kernel.attrs().find(attr);
    if (it == kernel.attrs().end())
      return who + " requires attribute '" + attr + "'";
    if (it->second.value_case() != AttrValue::kI &&
        it->second.value_case() != AttrValue::kF)
      return who + ": attribute '" + attr + "' must be a number";
  }
  return "";
}

std::string checkBackendKernels(const std::string &backend,
                                const std::vector<std::string> &implemented) {
  std::set<std::string> have(implemented.begin(), implemented.end());
  std::string missing, extra;
  for (const KernelSignature &sig : kernelSignatures())
    if (!have.count(sig.name))
      missing +=
          std::string(missing.empty() ? "" : ", ") + "'" + sig.name + "'";
  for (const std::string &name : have)
    if (!findKernelSignature(name))
      extra += (extra.empty() ? "" : ", ") + ("'" + name + "'");
  if (missing.empty() && extra.empty())
    return "";
  std::string out = "backend '" + backend + "': ";
  if (!missing.empty())
    out += "no kernel " + missing;
  if (!extra.empty())
    out += std::string(missing.empty() ? "" : "; ") + "kernel " + extra +
           " not in the kernel table (proto/KernelIds.cpp)";
  return out;
}

} // namespace piper::plan

// Tests of the kernel id table: its entries, the signature check of one
// kernel and the check of a backend's registry.
#include "proto/KernelIds.h"

#include <set>
#include <string>

#include <catch2/catch.hpp>

using namespace piper::plan;

namespace {

Kernel kernel(const std::string &op, int inputs, int outputs) {
  Kernel k;
  k.set_op(op);
  for (int i = 0; i < inputs; ++i)
    k.add_inputs()->set_index(i);
  for (int i = 0; i < outputs; ++i)
    k.add_outputs()->set_index(inputs + i);
  return k;
}

std::vector<std::string> tableNames() {
  std::vector<std::string> names;
  for (const KernelSignature &sig : kernelSignatures())
    names.push_back(sig.name);
  return names;
}

} // namespace

TEST_CASE("the kernel table lists each kernel once, well formed",
          "[kernel_ids]") {
  std::set<std::string> seen;
  for (const KernelSignature &sig : kernelSignatures()) {
    INFO(sig.name);
    CHECK(seen.insert(sig.name).second);
    CHECK(findKernelSignature(sig.name) == &sig);
    CHECK(sig.minInputs >= 0);
    CHECK(sig.minInputs <= sig.maxInputs);
    CHECK(sig.outputs >= 0);
  }
  CHECK(findKernelSignature("conv2d") == nullptr);
  CHECK(findKernelSignature("") == nullptr);
  // The fused norm backwards are gone: only the split halves remain.
  CHECK(findKernelSignature("layer_norm_grad") == nullptr);
  CHECK(findKernelSignature("rms_norm_grad") == nullptr);
  CHECK(findKernelSignature("layer_norm_grad_input") != nullptr);
  CHECK(findKernelSignature("rms_norm_grad_weight") != nullptr);
}

TEST_CASE("checkKernelSignature accepts every kernel at its signature",
          "[kernel_ids]") {
  for (const KernelSignature &sig : kernelSignatures())
    for (int in = sig.minInputs; in <= sig.maxInputs; ++in) {
      Kernel k = kernel(sig.name, in, sig.outputs);
      for (const std::string &attr : sig.requiredAttrs)
        (*k.mutable_attrs())[attr].set_i(2);
      INFO(sig.name << " with " << in << " inputs");
      CHECK(checkKernelSignature(k) == "");
    }
  // Integral attributes may be written as doubles; extra attributes are fine.
  Kernel adamw = kernel("adamw", 1, 3);
  (*adamw.mutable_attrs())["lr"].set_f(0.1);
  (*adamw.mutable_attrs())["beta1"].set_f(0.9);
  CHECK(checkKernelSignature(adamw) == "");
}

TEST_CASE("checkKernelSignature names what is wrong", "[kernel_ids]") {
  CHECK(checkKernelSignature(kernel("conv2d", 1, 1)) ==
        "unknown kernel 'conv2d'");
  CHECK(checkKernelSignature(kernel("layer_norm_grad", 3, 3)) ==
        "unknown kernel 'layer_norm_grad'");
  CHECK(checkKernelSignature(kernel("linear", 1, 1)) ==
        "kernel 'linear' takes 2 or 3 inputs, got 1");
  CHECK(checkKernelSignature(kernel("linear", 4, 1)) ==
        "kernel 'linear' takes 2 or 3 inputs, got 4");
  CHECK(checkKernelSignature(kernel("gelu", 2, 1)) ==
        "kernel 'gelu' takes 1 input, got 2");
  CHECK(checkKernelSignature(kernel("add", 2, 2)) ==
        "kernel 'add' takes 1 output, got 2");
  CHECK(checkKernelSignature(kernel("adamw", 1, 1)) ==
        "kernel 'adamw' takes 3 outputs, got 1");
  CHECK(checkKernelSignature(kernel("loss_accumulate", 1, 1)) ==
        "kernel 'loss_accumulate' takes 0 outputs, got 1");

  // A plan compiled before attention saved its statistics (one output).
  CHECK(checkKernelSignature(kernel("attention", 1, 1)) ==
        "kernel 'attention' takes 2 outputs, got 1");
  Kernel attn = kernel("attention", 1, 2);
  (*attn.mutable_attrs())["seq"].set_i(4);
  CHECK(checkKernelSignature(attn) ==
        "kernel 'attention' requires attribute 'heads'");
  (*attn.mutable_attrs())["heads"].set_s("four");
  CHECK(checkKernelSignature(attn) ==
        "kernel 'attention': attribute 'heads' must be a number");
  (*attn.mutable_attrs())["heads"].set_i(4);
  CHECK(checkKernelSignature(attn) == "");
}

TEST_CASE("checkBackendKernels names missing and unknown kernels",
          "[kernel_ids]") {
  std::vector<std::string> all = tableNames();
  CHECK(checkBackendKernels("cpu", all) == "");

  std::vector<std::string> partial;
  for (const std::string &name : all)
    if (name != "gelu" && name != "adamw")
      partial.push_back(name);
  CHECK(checkBackendKernels("cuda", partial) ==
        "backend 'cuda': no kernel 'gelu', 'adamw'");

  std::vector<std::string> more = all;
  more.push_back("flash_attention");
  CHECK(checkBackendKernels("cuda", more) ==
        "backend 'cuda': kernel 'flash_attention' not in the kernel table "
        "(proto/KernelIds.cpp)");

  partial.push_back("flash_attention");
  CHECK(checkBackendKernels("cuda", partial) ==
        "backend 'cuda': no kernel 'gelu', 'adamw'; kernel 'flash_attention' "
        "not in the kernel table (proto/KernelIds.cpp)");
}

TEST_CASE("the padded forms name kernels of the table and operands they have",
          "[kernel_ids]") {
  std::set<std::string> padded;
  for (const KernelSignature &sig : kernelSignatures()) {
    const PaddedOperands *form = findPaddedOperands(sig.name);
    if (!form)
      continue;
    INFO(sig.name);
    padded.insert(sig.name);
    CHECK(form->inputs.size() + form->outputs.size() > 0);
    for (int i : form->inputs)
      CHECK((i >= 0 && i < sig.minInputs));
    for (int i : form->outputs)
      CHECK((i >= 0 && i < sig.outputs));
  }
  // docs/kernels.md, "Padded vocabulary".
  CHECK(padded == std::set<std::string>{"linear", "linear_grad_input",
                                        "linear_grad_weight", "cross_entropy",
                                        "cross_entropy_grad",
                                        "cross_entropy_fused"});
  CHECK(findPaddedOperands("gelu") == nullptr);
  CHECK(findPaddedOperands("no_such_kernel") == nullptr);
}

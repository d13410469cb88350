// Cases of the elementwise and optimizer GPU kernels (KernelCases.h).
#include "runtime/hal/gpu/test/KernelCases.h"

namespace piper::runtime::hal::testing {
namespace {

std::vector<KernelCase> cases() {
  std::vector<KernelCase> out;
  // Odd sizes, one element, and one larger than a launch's grid stride.
  const std::vector<std::vector<int64_t>> shapes = {
      {1}, {7, 13}, {3, 5, 11}, {1000, 257}};
  for (const auto &shape : shapes) {
    std::string s = std::to_string(shape.size()) + "d" +
                    std::to_string(shape.back());
    // gelu's tanh saturates beyond |x| ~ 10: scale 4 reaches it.
    out.push_back({"gelu " + s, "gelu", {}, {f32(shape, 4)}, {zeros(shape)}});
    // gelu' cancels to ~0 near x = -0.75 and -2.4: the two tanh's 1e-7
    // absolute difference shows there, relative to dy.
    KernelCase geluGrad{"gelu_grad " + s,
                        "gelu_grad",
                        {},
                        {f32(shape, 4), f32(shape)},
                        {zeros(shape)}};
    geluGrad.atol = 1e-5;
    out.push_back(geluGrad);
    out.push_back(
        {"add " + s, "add", {}, {f32(shape), f32(shape)}, {zeros(shape)}});
    out.push_back(
        {"accumulate " + s, "accumulate", {}, {f32(shape)}, {f32(shape)}});
    out.push_back({"zero f32 " + s, "zero", {}, {}, {f32(shape)}});
    out.push_back({"zero i32 " + s,
                   "zero",
                   {},
                   {},
                   {given(plan::I32, shape, {3, -1, 7})}});
  }
  for (auto [rows, width] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {5, 7}, {64, 33}, {300, 129}}) {
    std::string s = std::to_string(rows) + "x" + std::to_string(width);
    out.push_back({"swiglu " + s,
                   "swiglu",
                   {},
                   {f32({rows, 2 * width}, 3)},
                   {zeros({rows, width})}});
    out.push_back({"swiglu_grad " + s,
                   "swiglu_grad",
                   {},
                   {f32({rows, 2 * width}, 3), f32({rows, width})},
                   {zeros({rows, 2 * width})}});
  }
  // AdamW at steps 1 and 7 (bias corrections), with and without decay and a
  // schedule scale; m and v start from earlier steps' values.
  for (auto [step, decay, lrScale] :
       std::vector<std::tuple<int64_t, double, double>>{
           {1, 0.0, 1.0}, {7, 0.1, 0.5}, {3, 0.01, 0.0}}) {
    for (const auto &shape :
         std::vector<std::vector<int64_t>>{{1}, {33, 17}, {70001}}) {
      KernelCase c{"adamw step " + std::to_string(step) + " " +
                       std::to_string(shape.back()),
                   "adamw",
                   {{"lr", floatAttr(1e-3)},
                    {"beta1", floatAttr(0.9)},
                    {"beta2", floatAttr(0.95)},
                    {"eps", floatAttr(1e-8)},
                    {"weight_decay", floatAttr(decay)}},
                   {f32(shape, 0.1)},
                   {f32(shape), f32(shape, 0.01), positive(shape, 1e-4)}};
      c.step = step;
      c.lrScale = lrScale;
      out.push_back(c);
      // Mixed precision: the same update also writes the parameter's bf16
      // copy (exactly the updated parameter, rounded).
      c.name += " with bf16 copy";
      c.bf16Copy = true;
      out.push_back(c);
      // Or its packed bf16 copy (GEMM weights on the GPU backends).
      c.name += " packed";
      c.bf16Copy = false;
      c.packedCopy = true;
      out.push_back(c);
    }
  }
  // Malformed calls: the same check, the same message on both devices.
  KernelCase badShape{"gelu shape mismatch", "gelu", {}, {f32({4, 5})},
                      {zeros({4, 6})}};
  badShape.rejects = "y has shape [4,6]";
  out.push_back(badShape);
  KernelCase badGate{"swiglu odd gate_up", "swiglu", {}, {f32({3, 5})},
                     {zeros({3, 2})}};
  badGate.rejects = "even number of columns";
  out.push_back(badGate);
  KernelCase badBeta{"adamw beta1 = 1",
                     "adamw",
                     {{"lr", floatAttr(1e-3)}, {"beta1", floatAttr(1.0)}},
                     {f32({8})},
                     {f32({8}), zeros({8}), zeros({8})}};
  badBeta.rejects = "'beta1' and 'beta2' must be in [0, 1)";
  out.push_back(badBeta);
  KernelCase badZero{"zero of i32 inputs", "zero", {}, {f32({2})},
                     {zeros({2})}};
  badZero.rejects = "input";
  out.push_back(badZero);
  return out;
}

RegisterCases registered(cases());

} // namespace
} // namespace piper::runtime::hal::testing

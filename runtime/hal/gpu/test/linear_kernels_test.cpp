// The linear and loss GPU kernels beyond gpu_kernels_test's comparisons:
// malformed calls are rejected by the GPU wrapper exactly as by the CPU
// kernel (same message), out-of-range targets (which only the CPU kernels
// can reject: the GPU kernels do not read operands on the host) neither
// crash nor write out of bounds, the worst error of each kernel's cases,
// and the strided bf16 packing of the GEMMs' operand copies.
#include <catch2/catch.hpp>

#include <cmath>
#include <iostream>
#include <map>
#include <set>
#include <vector>

#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"
#include "runtime/hal/gpu/test/KernelCases.h"
#include "support/Precision.h"

using namespace piper;

using namespace piper::runtime;
using namespace piper::runtime::hal;
using namespace piper::runtime::hal::testing;

namespace {

const std::set<std::string> kOps = {"linear",
                                    "linear_grad_input",
                                    "linear_grad_weight",
                                    "bias_grad",
                                    "bias_add",
                                    "cross_entropy",
                                    "cross_entropy_grad",
                                    "cross_entropy_fused",
                                    "loss_accumulate",
                                    "vocab_ce_stats",
                                    "vocab_cross_entropy",
                                    "vocab_cross_entropy_grad"};

// Runs a malformed call on both devices; both must fail with one message.
void expectSameRejection(const KernelCase &c, const std::string &needle) {
  INFO("case " << c.name);
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  CaseResult r = runCase(c, *cpu, *gpu);
  // runCase reports "cpu: M1; cuda-emulation: M2" when both fail.
  const std::string cpuPrefix = "cpu: ", sep = "; cuda-emulation: ";
  size_t at = r.error.find(sep);
  REQUIRE(r.error.rfind(cpuPrefix, 0) == 0);
  REQUIRE(at != std::string::npos);
  std::string cpuMessage =
      r.error.substr(cpuPrefix.size(), at - cpuPrefix.size());
  std::string gpuMessage = r.error.substr(at + sep.size());
  CHECK(cpuMessage == gpuMessage);
  CHECK(cpuMessage.find(needle) != std::string::npos);
}

} // namespace

TEST_CASE("the linear GPU kernels reject malformed calls as the CPU does") {
  auto tw = [](int64_t v) {
    return std::vector<std::pair<std::string, piper::plan::AttrValue>>{
        {"transpose_w", intAttr(v)}};
  };
  expectSameRejection({"linear w rows",
                       "linear",
                       {},
                       {f32({4, 3}), f32({5, 2})},
                       {f32({4, 2})}},
                      "w has shape [5,2], expected [3,*]");
  expectSameRejection({"linear w transposed",
                       "linear",
                       tw(1),
                       {f32({4, 3}), f32({3, 2})},
                       {f32({4, 3})}},
                      "expected [*,3] (transpose_w=1)");
  expectSameRejection({"linear transpose_w 2",
                       "linear",
                       tw(2),
                       {f32({4, 3}), f32({3, 2})},
                       {f32({4, 2})}},
                      "transpose_w");
  expectSameRejection({"linear bias",
                       "linear",
                       {},
                       {f32({4, 3}), f32({3, 2}), f32({3})},
                       {f32({4, 2})}},
                      "b has shape");
  expectSameRejection(
      {"linear y", "linear", {}, {f32({4, 3}), f32({3, 2})}, {f32({2, 4})}},
      "y has shape");
  expectSameRejection(
      {"linear x rank", "linear", {}, {f32({4}), f32({3, 2})}, {f32({4, 2})}},
      "x");
  expectSameRejection({"linear four inputs",
                       "linear",
                       {},
                       {f32({4, 3}), f32({3, 2}), f32({2}), f32({2})},
                       {f32({4, 2})}},
                      "input");
  expectSameRejection({"linear_grad_input w",
                       "linear_grad_input",
                       tw(1),
                       {f32({4, 2}), f32({3, 2})},
                       {f32({4, 3})}},
                      "expected [2,*] (transpose_w=1)");
  expectSameRejection({"linear_grad_input dx",
                       "linear_grad_input",
                       {},
                       {f32({4, 2}), f32({3, 2})},
                       {f32({4, 2})}},
                      "dx has shape");
  expectSameRejection({"linear_grad_weight dy rows",
                       "linear_grad_weight",
                       {},
                       {f32({4, 3}), f32({5, 2})},
                       {f32({3, 2})}},
                      "dy has shape [5,2], expected [4,*]");
  expectSameRejection({"linear_grad_weight dw",
                       "linear_grad_weight",
                       tw(1),
                       {f32({4, 3}), f32({4, 2})},
                       {f32({3, 2})}},
                      "dw has shape");
  expectSameRejection({"linear_grad_weight_bias db",
                       "linear_grad_weight_bias",
                       tw(1),
                       {f32({4, 3}), f32({4, 2})},
                       {f32({2, 3}), f32({3})}},
                      "db has shape [3], expected [2]");
  expectSameRejection({"linear_grad_weight_bias one output",
                       "linear_grad_weight_bias",
                       {},
                       {f32({4, 3}), f32({4, 2})},
                       {f32({3, 2})}},
                      "expected 2 outputs, got 1");
  expectSameRejection({"linear_grad_weight_bias dy rows",
                       "linear_grad_weight_bias",
                       {},
                       {f32({4, 3}), f32({5, 2})},
                       {f32({3, 2}), f32({2})}},
                      "dy has shape [5,2], expected [4,*]");
  // The vocabulary padding (valid_cols).
  auto padded = [](int64_t v) {
    return std::vector<std::pair<std::string, piper::plan::AttrValue>>{
        {"valid_cols", intAttr(v)}};
  };
  expectSameRejection({"linear padded y too narrow",
                       "linear",
                       padded(9),
                       {f32({4, 3}), f32({3, 2})},
                       {f32({4, 8})}},
                      "y has shape [4,8], fewer columns than valid_cols=9");
  expectSameRejection({"linear padded y, valid_cols not out",
                       "linear",
                       padded(3),
                       {f32({4, 3}), f32({3, 2})},
                       {f32({4, 8})}},
                      "y has shape [4,8] with valid_cols=3, expected [4,2] "
                      "valid columns");
  expectSameRejection({"linear bias padded",
                       "linear",
                       padded(2),
                       {f32({4, 3}), f32({3, 2}), f32({2})},
                       {f32({4, 8})}},
                      "valid_cols (a padded y) is only for linear, "
                      "linear_grad_input and linear_grad_weight without a "
                      "bias");
  expectSameRejection({"linear_grad_weight_bias padded",
                       "linear_grad_weight_bias",
                       padded(2),
                       {f32({4, 3}), f32({4, 8})},
                       {f32({3, 2}), f32({2})}},
                      "valid_cols (a padded dy)");
  expectSameRejection({"linear_grad_input padded, w not valid_cols",
                       "linear_grad_input",
                       padded(3),
                       {f32({4, 8}), f32({3, 2})},
                       {f32({4, 3})}},
                      "w has shape [3,2], expected [*,3]");
  expectSameRejection(
      {"bias_grad db", "bias_grad", {}, {f32({4, 3})}, {f32({4})}},
      "db has shape");
  expectSameRejection({"bias_grad i32",
                       "bias_grad",
                       {},
                       {zeros({4, 3}, piper::plan::I32)},
                       {f32({3})}},
                      "dy");
}

TEST_CASE("the loss GPU kernels reject malformed calls as the CPU does") {
  expectSameRejection({"cross_entropy target count",
                       "cross_entropy",
                       {},
                       {f32({4, 5}), tokens({3}, 5)},
                       {f32({})}},
                      "targets has shape [3] (3 tokens), logits has 4 rows");
  expectSameRejection({"cross_entropy empty vocab",
                       "cross_entropy",
                       {},
                       {f32({2, 0}), tokens({2}, 1)},
                       {f32({})}},
                      "expected no empty dimension");
  expectSameRejection({"cross_entropy loss shape",
                       "cross_entropy",
                       {},
                       {f32({2, 5}), tokens({2}, 5)},
                       {f32({2})}},
                      "loss");
  expectSameRejection({"cross_entropy f32 targets",
                       "cross_entropy",
                       {},
                       {f32({2, 5}), f32({2})},
                       {f32({})}},
                      "targets");
  expectSameRejection({"cross_entropy_grad dlogits",
                       "cross_entropy_grad",
                       {},
                       {f32({2, 5}), tokens({2}, 5)},
                       {f32({5, 2})}},
                      "dlogits has shape");
  // The vocabulary padding (valid_cols): narrower than the valid columns.
  expectSameRejection({"cross_entropy_grad padded dlogits",
                       "cross_entropy_grad",
                       {{"valid_cols", intAttr(5)}},
                       {f32({2, 8}), tokens({2}, 5)},
                       {f32({2, 4})}},
                      "dlogits has shape [2,4], fewer columns than "
                      "valid_cols=5");
  expectSameRejection({"cross_entropy_fused padded logits",
                       "cross_entropy_fused",
                       {{"valid_cols", intAttr(6)}},
                       {f32({2, 5}), tokens({2}, 5)},
                       {f32({}), f32({2, 8})}},
                      "logits has shape [2,5], fewer columns than "
                      "valid_cols=6");
  expectSameRejection({"cross_entropy_grad scale",
                       "cross_entropy_grad",
                       {{"scale", floatAttr(INFINITY)}},
                       {f32({2, 5}), tokens({2}, 5)},
                       {f32({2, 5})}},
                      "scale");
  expectSameRejection({"cross_entropy_fused one output",
                       "cross_entropy_fused",
                       {},
                       {f32({2, 5}), tokens({2}, 5)},
                       {f32({})}},
                      "outputs");
  expectSameRejection({"cross_entropy_fused dlogits",
                       "cross_entropy_fused",
                       {},
                       {f32({2, 5}), tokens({2}, 5)},
                       {f32({}), f32({2, 4})}},
                      "dlogits has shape");
  expectSameRejection({"cross_entropy_fused loss",
                       "cross_entropy_fused",
                       {},
                       {f32({2, 5}), tokens({2}, 5)},
                       {f32({2, 5}), f32({2, 5})}},
                      "loss");
  expectSameRejection({"cross_entropy_fused scale",
                       "cross_entropy_fused",
                       {{"scale", floatAttr(NAN)}},
                       {f32({2, 5}), tokens({2}, 5)},
                       {f32({}), f32({2, 5})}},
                      "scale");
  expectSameRejection(
      {"loss_accumulate shape", "loss_accumulate", {}, {f32({2})}, {}}, "loss");
  expectSameRejection(
      {"loss_accumulate output", "loss_accumulate", {}, {f32({})}, {f32({})}},
      "output");
}

TEST_CASE("loss_accumulate needs an accumulator on the GPU too") {
  auto gpu = createEmulatedGpuDevice(nullptr);
  piper::plan::Kernel kernel;
  kernel.set_op("loss_accumulate");
  float loss = 2;
  std::vector<TensorRef> ins = {TensorRef{piper::plan::F32, {}, &loss}}, outs;
  KernelContext ctx; // no accumulator
  Status st = gpu->runKernel(*gpu->findKernel("loss_accumulate"), kernel,
                             decodeKernelAttrs(kernel), ins, outs, ctx);
  REQUIRE(!st);
  CHECK(st.message() ==
        "loss_accumulate: no loss accumulator in the kernel context");
}

TEST_CASE("the GPU cross entropy skips the term of an out-of-range target") {
  // Uniform logits: every row's log-sum-exp is ln V and its softmax 1/V.
  // The CPU rejects these targets; the GPU kernels cannot read them on the
  // host, so they leave the target term out instead of indexing out of the
  // row (the allocations here are exact, so a sanitizer would see a stray
  // access).
  const int64_t vocab = 5, rows = 3;
  auto gpu = createEmulatedGpuDevice(nullptr);
  std::vector<float> logits(rows * vocab, 0.0f);
  std::vector<int32_t> targets = {-1, 5, 2};
  float loss = -1;
  std::vector<float> dlogits(rows * vocab, -1.0f);
  std::vector<TensorRef> ins = {
      TensorRef{piper::plan::F32, {rows, vocab}, logits.data()},
      TensorRef{piper::plan::I32, {rows}, targets.data()}};
  KernelContext ctx;
  piper::plan::Kernel ce, ceGrad;
  ce.set_op("cross_entropy");
  ceGrad.set_op("cross_entropy_grad");
  std::vector<TensorRef> lossOut = {TensorRef{piper::plan::F32, {}, &loss}};
  std::vector<TensorRef> gradOut = {
      TensorRef{piper::plan::F32, {rows, vocab}, dlogits.data()}};
  REQUIRE(gpu->runKernel(*gpu->findKernel("cross_entropy"), ce,
                         decodeKernelAttrs(ce), ins, lossOut, ctx));
  REQUIRE(gpu->runKernel(*gpu->findKernel("cross_entropy_grad"), ceGrad,
                         decodeKernelAttrs(ceGrad), ins, gradOut, ctx));
  // Rows 0 and 1 contribute ln V, row 2 ln V - 0.
  CHECK(loss == Approx(std::log(5.0)).epsilon(1e-6));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < vocab; ++j) {
      INFO("row " << r << " class " << j);
      double want = (0.2 - (r == 2 && j == 2 ? 1.0 : 0.0)) / rows;
      CHECK(dlogits[r * vocab + j] == Approx(want).epsilon(1e-6));
    }
  // The CPU rejects both calls.
  auto cpu = createCpuDevice(nullptr);
  CHECK(!cpu->runKernel(*cpu->findKernel("cross_entropy"), ce,
                        decodeKernelAttrs(ce), ins, lossOut, ctx));
}

TEST_CASE("worst error of the linear and loss GPU kernels") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  std::map<std::string, std::pair<double, int>> worst;
  for (const KernelCase &c : kernelCases()) {
    if (!kOps.count(c.op))
      continue;
    CaseResult r = runCase(c, *cpu, *gpu);
    INFO("case " << c.name);
    CHECK(r.error == "");
    auto &w = worst[c.op];
    w.first = std::max(w.first, r.worstRelative);
    ++w.second;
  }
  CHECK(worst.size() == kOps.size());
  for (const auto &[op, w] : worst)
    std::cout << op << ": " << w.second << " cases, worst |gpu - cpu| / "
              << "(atol + rtol |cpu|) = " << w.first << "\n";
}

TEST_CASE("the GEMMs' bf16 operand copies are packed with a new column "
          "stride, every element rounded to nearest even") {
  // 7 rows of 5 columns 9 floats apart, packed 8 apart (the CUDA GEMM
  // rounds a copy's stride up to 16 bytes); the packed gap stays as it
  // was. The values are not bf16 values, so each is rounded.
  namespace g = piper::runtime::hal::PIPER_GPU_NS;
  const int64_t rows = 7, cols = 5, srcLd = 9, dstLd = 8;
  std::vector<float> src(static_cast<size_t>(srcLd * cols));
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = 1.0f + static_cast<float>(i) / 3.0f;
  std::vector<uint16_t> dst(static_cast<size_t>(dstLd * cols), 0xFFFF);
  g::Context ctx;
  REQUIRE(g::launchPackBf16Columns(ctx, dst.data(), dstLd, src.data(), srcLd,
                                   rows, cols));
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < dstLd; ++r) {
      INFO("column " << c << ", row " << r);
      uint16_t got = dst[static_cast<size_t>(c * dstLd + r)];
      if (r < rows)
        CHECK(got == floatToBf16(src[static_cast<size_t>(c * srcLd + r)]));
      else
        CHECK(got == 0xFFFF);
    }
}

TEST_CASE("an empty product with a bias is the bias on every row, and needs "
          "beta 0 and a dense C") {
  namespace g = piper::runtime::hal::PIPER_GPU_NS;
  g::Context ctx;
  const float bias[3] = {0.5f, -1.0f, 2.0f};
  std::vector<float> c(2 * 4, 7.0f);
  // C [2, 3] with ldc 3: each row is the bias.
  REQUIRE(g::gemm(ctx, false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3,
                  0.0f, c.data(), 3, bias));
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 3; ++j)
      CHECK(c[r * 3 + j] == bias[j]);
  const std::string need = "gemm: k = 0 with a bias needs beta 0 and a dense C";
  CHECK(g::gemm(ctx, false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 1.0f,
                c.data(), 3, bias)
            .message() == need);
  CHECK(g::gemm(ctx, false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.0f,
                c.data(), 4, bias)
            .message() == need);
}

// A packed bf16 operand (GemmOperand::bf16) is for bf16 GEMMs only: in an
// fp32 GEMM it is an error, whatever the shape (the empty products too);
// in a bf16 GEMM it gives the bits of its values as fp32 (the emulation).
TEST_CASE("a packed GEMM operand needs a bf16 GEMM") {
  namespace g = piper::runtime::hal::PIPER_GPU_NS;
  g::Context fp32, bf16;
  bf16.bf16 = true;
  const std::vector<uint16_t> a16 = {0x3f80, 0x4000, 0x4040, 0x4080}; // 1..4
  const std::vector<float> a = {1, 2, 3, 4}, b = {0.5f, -1, 2, 0.25f};
  std::vector<float> c(4, 0.0f), want(4, 0.0f);
  const std::string refused = "gemm: a packed bf16 operand in an fp32 GEMM";
  for (int64_t k : {2, 0})
    CHECK(g::gemm(fp32, false, false, 2, 2, k, 1.0f, a16.data(), 2, b.data(), 2,
                  0.0f, c.data(), 2)
              .message() == refused);
  REQUIRE(g::gemm(bf16, false, false, 2, 2, 2, 1.0f, a16.data(), 2, b.data(), 2,
                  0.0f, c.data(), 2));
  REQUIRE(g::gemm(bf16, false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2,
                  0.0f, want.data(), 2));
  CHECK(c == want);
}

// A packed output (ColMajorGemm::c16) likewise: refused in an fp32 GEMM,
// with an fp32 C too, with beta other than 0; in a bf16 GEMM it holds the
// fp32 result rounded and packed, the empty product's bias included.
TEST_CASE("a packed GEMM output needs a bf16 GEMM with beta 0") {
  namespace g = piper::runtime::hal::PIPER_GPU_NS;
  g::Context fp32, bf16;
  bf16.bf16 = true;
  const std::vector<float> a = {1, 2, 3, 4}, b = {0.5f, -1, 2, 0.3f};
  const std::vector<float> bias = {1.0f / 3, -2.5f};
  std::vector<float> c(4, 0.0f);
  std::vector<uint16_t> c16(4, 0xFFFF);
  const std::string refused = "gemm: a packed output needs a bf16 GEMM with "
                              "beta 0, no fp32 C, no operand sums and no GELU";
  CHECK(g::gemm(fp32, false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2,
                0.0f, nullptr, 2, nullptr, nullptr, nullptr, c16.data())
            .message() == refused);
  CHECK(g::gemm(bf16, false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2,
                0.0f, c.data(), 2, nullptr, nullptr, nullptr, c16.data())
            .message() == refused);
  CHECK(g::gemm(bf16, false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2,
                1.0f, nullptr, 2, nullptr, nullptr, nullptr, c16.data())
            .message() == refused);
  for (int64_t k : {2, 0}) {
    INFO("k = " << k);
    REQUIRE(g::gemm(bf16, false, false, 2, 2, k, 1.0f, a.data(), 2, b.data(), 2,
                    0.0f, c.data(), 2, bias.data()));
    REQUIRE(g::gemm(bf16, false, false, 2, 2, k, 1.0f, a.data(), 2, b.data(), 2,
                    0.0f, nullptr, 2, bias.data(), nullptr, nullptr,
                    c16.data()));
    for (size_t i = 0; i < c.size(); ++i)
      CHECK(c16[i] == piper::floatToBf16(c[i]));
  }
}

// GELU into its own output (GemmGelu::out) takes beta 0: cuBLASLt's
// epilogue writes D = that output, which is then also its C, so beta would
// scale the output's old values, not C's.
TEST_CASE("a GEMM with GELU into its own output needs beta 0") {
  namespace g = piper::runtime::hal::PIPER_GPU_NS;
  g::Context ctx;
  const std::vector<float> a = {1, 2, 3, 4}, b = {0.5f, -1, 2, 0.3f};
  std::vector<float> c(4, 1.0f), y(4, 0.0f);
  g::GemmGelu gelu;
  gelu.out = y.data();
  CHECK(g::gemm(ctx, false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2,
                1.0f, c.data(), 2, nullptr, nullptr, &gelu)
            .message() == "gemm: GELU into its own output needs beta 0 (the "
                          "epilogue's C is that output, not C)");
  CHECK(g::gemm(ctx, false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2,
                0.0f, c.data(), 2, nullptr, nullptr, &gelu));
}

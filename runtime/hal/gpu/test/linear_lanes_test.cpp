// The linear and loss launchers' warp code on the host: LinearLaunch.inl
// compiled with an Exec whose rows run on 32 lanes (32 threads that meet at
// every lanes.sum/max, combining in a warp's butterfly order) and whose
// forEach visits the indices in reverse order. The emulation (HostExec) runs
// one lane, so only this test exercises the lane striding and the
// cross-lane log-sum-exp of the cross entropy before a GPU does. Compared
// with the CPU kernels on host memory.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/LinearLaunch.h"
#include "runtime/hal/gpu/Simt.h"
#include "runtime/hal/gpu/host/LanesExec.h"
#include "runtime/kernels/Kernels.h"

namespace piper::runtime::hal::PIPER_GPU_NS {
using Exec = LanesExec;

} // namespace piper::runtime::hal::PIPER_GPU_NS

#include "runtime/hal/gpu/LinearLaunch.inl"

using namespace piper;
using namespace piper::runtime;
namespace lanes = piper::runtime::hal::PIPER_GPU_NS;

namespace {

std::vector<float> normal(int64_t n, double scale, std::mt19937_64 &rng) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float &x : v)
    x = static_cast<float>(d(rng));
  return v;
}

template <class T>
TensorRef ref(plan::DType dtype, std::vector<int64_t> shape,
              std::vector<T> &data) {
  return TensorRef{dtype, std::move(shape), data.data()};
}

void runCpu(const std::string &op, double scale, std::vector<TensorRef> ins,
            std::vector<TensorRef> outs) {
  plan::Kernel kernel;
  kernel.set_op(op);
  if (scale != 1.0)
    (*kernel.mutable_attrs())["scale"].set_f(scale);
  KernelContext ctx;
  Status st = runKernel(kernel, ins, outs, ctx);
  INFO(st.message());
  REQUIRE(bool(st));
}

void expectClose(const std::vector<float> &want,
                 const std::vector<float> &got) {
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i << ": cpu " << want[i] << ", lanes " << got[i]);
    REQUIRE(std::fabs(got[i] - want[i]) <= 1e-6 + 1e-5 * std::fabs(want[i]));
  }
}

} // namespace

TEST_CASE("the cross entropy on 32 lanes agrees with the CPU kernels") {
  lanes::Context ctx;
  // Vocabularies below a warp (idle lanes), not a multiple of it, and
  // several strides; logits narrow and wide (scale 20).
  for (auto [rows, vocab, scale] :
       std::vector<std::tuple<int64_t, int64_t, double>>{{1, 1, 1},
                                                         {3, 7, 1},
                                                         {4, 32, 1},
                                                         {5, 33, 20},
                                                         {37, 100, 2},
                                                         {2, 5000, 20}}) {
    INFO(rows << "x" << vocab << " scale " << scale);
    std::mt19937_64 rng(static_cast<uint64_t>(rows * 100000 + vocab));
    auto logits = normal(rows * vocab, scale, rng);
    std::vector<int32_t> targets(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      targets[r] = static_cast<int32_t>(
          std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng));
    std::vector<float> wantLoss(1), gotLoss(1);
    std::vector<double> rowLoss(static_cast<size_t>(rows));
    const lanes::CrossEntropyDims dims{rows, vocab, vocab, vocab};
    runCpu("cross_entropy", 1.0,
           {ref(plan::F32, {rows, vocab}, logits),
            ref(plan::I32, {rows}, targets)},
           {ref(plan::F32, {}, wantLoss)});
    REQUIRE(bool(lanes::launchCrossEntropy(ctx, logits.data(), targets.data(),
                                           dims, rowLoss.data(), gotLoss.data(),
                                           0.0, nullptr)));
    expectClose(wantLoss, gotLoss);

    std::vector<float> want(static_cast<size_t>(rows * vocab)), got = want;
    runCpu("cross_entropy_grad", 0.5,
           {ref(plan::F32, {rows, vocab}, logits),
            ref(plan::I32, {rows}, targets)},
           {ref(plan::F32, {rows, vocab}, want)});
    REQUIRE(bool(lanes::launchCrossEntropy(ctx, logits.data(), targets.data(),
                                           dims, nullptr, nullptr, 0.5 / rows,
                                           got.data())));
    expectClose(want, got);

    // The fused classifier: both outputs in one pass, bit for bit.
    std::vector<float> fusedLoss(1), fused(got.size());
    REQUIRE(bool(lanes::launchCrossEntropy(
        ctx, logits.data(), targets.data(), dims, rowLoss.data(),
        fusedLoss.data(), 0.5 / rows, fused.data())));
    CHECK(std::memcmp(&fusedLoss[0], &gotLoss[0], sizeof(float)) == 0);
    CHECK(std::memcmp(fused.data(), got.data(), got.size() * sizeof(float)) ==
          0);
  }
}

TEST_CASE("bias_grad's chunked column sums agree with the CPU kernel") {
  lanes::Context ctx;
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {63, 3}, {64, 2}, {65, 7}, {200, 1}}) {
    INFO(rows << "x" << cols);
    std::mt19937_64 rng(static_cast<uint64_t>(rows * 1000 + cols));
    auto dy = normal(rows * cols, 1, rng);
    std::vector<float> want(static_cast<size_t>(cols)), got = want;
    std::vector<double> partials(
        static_cast<size_t>(lanes::columnSumChunks(rows) * cols));
    runCpu("bias_grad", 1.0, {ref(plan::F32, {rows, cols}, dy)},
           {ref(plan::F32, {cols}, want)});
    REQUIRE(bool(lanes::launchColumnSums(ctx, dy.data(), rows, cols,
                                         partials.data(), got.data())));
    expectClose(want, got);
  }
}

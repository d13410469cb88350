// The layer launchers' warp code, on the host: LayerLaunch.inl compiled
// with an Exec whose rows run on 32 lanes (32 threads that meet at every
// lanes.sum, as a warp's shuffles), and whose forEach visits the indices in
// reverse order. The emulation (HostExec) runs one lane, so only this test
// exercises the lane striding, the cross-lane reductions and the embedding
// gradient's per-lane scan before a GPU does. Compared with the CPU kernels
// (runKernel) on host memory.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <type_traits>

#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/LayerLaunch.h"
#include "runtime/hal/gpu/Simt.h"
#include "runtime/hal/gpu/host/LanesExec.h"
#include "runtime/kernels/Kernels.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

// What the launchers need of the backend.
Status launchStatus(int, const char *) { return Status::ok(); }
Status zeroAsync(const Context &, void *ptr, size_t bytes) {
  std::memset(ptr, 0, bytes);
  return Status::ok();
}
using Exec = LanesExec;

} // namespace piper::runtime::hal::PIPER_GPU_NS

#include "runtime/hal/gpu/LayerLaunch.inl"

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

TensorRef f32(std::vector<int64_t> shape, std::vector<float> &data) {
  return TensorRef{plan::F32, std::move(shape), data.data()};
}

// Runs the CPU kernel `op` on the given host operands.
void runCpu(const std::string &op,
            std::vector<std::pair<std::string, plan::AttrValue>> attrs,
            std::vector<TensorRef> inputs, std::vector<TensorRef> outputs) {
  plan::Kernel kernel;
  kernel.set_op(op);
  for (auto &[name, value] : attrs)
    (*kernel.mutable_attrs())[name] = value;
  KernelContext ctx;
  Status st = runKernel(kernel, inputs, outputs, ctx);
  INFO(st.message());
  REQUIRE(bool(st));
}

plan::AttrValue intAttr(int64_t v) {
  plan::AttrValue a;
  a.set_i(v);
  return a;
}
plan::AttrValue floatAttr(double v) {
  plan::AttrValue a;
  a.set_f(v);
  return a;
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

TEST_CASE("layer norms on 32 lanes agree with the CPU kernels") {
  lanes::Context ctx;
  // Rows narrower than a warp, not a multiple of it, several strides; one
  // column chunk and many (64 rows each).
  for (auto [rows, hidden] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {3, 7}, {5, 33}, {70, 100}, {130, 64}, {2, 0}}) {
    INFO(rows << "x" << hidden);
    std::mt19937_64 rng(static_cast<uint64_t>(rows * 1000 + hidden));
    auto x = normal(rows * hidden, 3, rng), dy = normal(rows * hidden, 1, rng);
    auto gamma = normal(hidden, 1, rng), beta = normal(hidden, 1, rng);
    const double eps = 1e-5, rmsEps = 1e-6;
    std::vector<float> want(static_cast<size_t>(rows * hidden)), got = want;
    std::vector<float> wantG(static_cast<size_t>(hidden)),
        gotG = wantG, wantB = wantG, gotB = wantG;
    std::vector<double> scratch(static_cast<size_t>(
        2 * rows + 2 * lanes::columnChunks(rows).chunks * hidden + 1));

    runCpu("layer_norm", {},
           {f32({rows, hidden}, x), f32({hidden}, gamma), f32({hidden}, beta)},
           {f32({rows, hidden}, want)});
    REQUIRE(
        bool(lanes::launchLayerNorm(ctx, x.data(), gamma.data(), beta.data(),
                                    got.data(), rows, hidden, eps)));
    expectClose(want, got);

    runCpu(
        "layer_norm_grad_input", {},
        {f32({rows, hidden}, x), f32({hidden}, gamma), f32({rows, hidden}, dy)},
        {f32({rows, hidden}, want)});
    REQUIRE(bool(lanes::launchLayerNormGradInput(ctx, x.data(), gamma.data(),
                                                 dy.data(), got.data(), rows,
                                                 hidden, eps)));
    expectClose(want, got);

    runCpu("layer_norm_grad_weight", {},
           {f32({rows, hidden}, x), f32({rows, hidden}, dy)},
           {f32({hidden}, wantG), f32({hidden}, wantB)});
    REQUIRE(bool(lanes::launchLayerNormGradWeight(
        ctx, x.data(), dy.data(), gotG.data(), gotB.data(), rows, hidden, eps,
        scratch.data())));
    expectClose(wantG, gotG);
    expectClose(wantB, gotB);

    runCpu("rms_norm", {}, {f32({rows, hidden}, x), f32({hidden}, gamma)},
           {f32({rows, hidden}, want)});
    REQUIRE(bool(lanes::launchRmsNorm(ctx, x.data(), gamma.data(), got.data(),
                                      rows, hidden, rmsEps)));
    expectClose(want, got);

    runCpu(
        "rms_norm_grad_input", {{"eps", floatAttr(0.1)}},
        {f32({rows, hidden}, x), f32({hidden}, gamma), f32({rows, hidden}, dy)},
        {f32({rows, hidden}, want)});
    REQUIRE(bool(lanes::launchRmsNormGradInput(ctx, x.data(), gamma.data(),
                                               dy.data(), got.data(), rows,
                                               hidden, 0.1)));
    expectClose(want, got);

    runCpu("rms_norm_grad_weight", {},
           {f32({rows, hidden}, x), f32({rows, hidden}, dy)},
           {f32({hidden}, wantG)});
    REQUIRE(bool(lanes::launchRmsNormGradWeight(ctx, x.data(), dy.data(),
                                                gotG.data(), rows, hidden,
                                                rmsEps, scratch.data())));
    expectClose(wantG, gotG);
  }
}

TEST_CASE("embedding_grad's per-lane scan on 32 lanes agrees with the CPU") {
  lanes::Context ctx;
  // Vocabularies smaller than the lanes (empty lane blocks), not a multiple
  // of them, and larger; over several scan tiles (1024 ids); rows over
  // several sort chunks (64 rows).
  for (auto [rows, vocab, hidden] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1},
                                                          {10, 5, 3},
                                                          {100, 33, 4},
                                                          {1000, 70, 2},
                                                          {3000, 1000, 3},
                                                          {3000, 2500, 2}}) {
    INFO(rows << " rows, vocab " << vocab << ", hidden " << hidden);
    std::mt19937_64 rng(static_cast<uint64_t>(rows + vocab));
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int32_t &id : ids)
      id = static_cast<int32_t>(
          std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng));
    auto dy = normal(rows * hidden, 1, rng);
    std::vector<float> want(static_cast<size_t>(vocab * hidden)),
        got(want.size(), 7.0f);
    std::vector<int32_t> scratch(
        static_cast<size_t>(lanes::embeddingGradScratchWords(rows, vocab)));
    runCpu("embedding_grad", {{"vocab", intAttr(vocab)}},
           {TensorRef{plan::I32, {rows}, ids.data()}, f32({rows, hidden}, dy)},
           {f32({vocab, hidden}, want)});
    REQUIRE(
        bool(lanes::launchEmbeddingGrad(ctx, ids.data(), dy.data(), got.data(),
                                        rows, vocab, hidden, 0, scratch.data())));
    // The same order of additions as the CPU: equal, not just close.
    CHECK(want == got);
  }
}

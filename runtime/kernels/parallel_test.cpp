// The multithreaded and vectorized kernels give the same floats on any number
// of threads (docs/performance.md): every kernel that splits its work with
// parallelFor, run on tensors large enough to be split, once on one thread
// and once on three, must agree bit for bit; and the vectorized exp, tanh and
// sigmoid stay within their documented error.
#include <catch2/catch.hpp>

#include <cblas.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels/Kernels.h"
#include "runtime/kernels/Parallel.h"
#include "runtime/kernels/VecMath.h"
#include "runtime/kernels/kernels_test_util.h"

using namespace piper;
using namespace piper::runtime;

namespace {

Tensor randomF32(std::vector<int64_t> shape, uint32_t seed, float scale = 1) {
  Tensor t;
  t.shape = std::move(shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  t.f.resize(t.numel());
  for (float &v : t.f)
    v = dist(rng);
  return t;
}

Tensor zerosF32(std::vector<int64_t> shape) {
  Tensor t;
  t.shape = std::move(shape);
  t.f.assign(t.numel(), 0.0f);
  return t;
}

Tensor tokens(int64_t n, int32_t vocab, uint32_t seed) {
  Tensor t;
  t.dtype = plan::I32;
  t.shape = {n};
  std::mt19937 rng(seed);
  for (int64_t k = 0; k < n; ++k)
    t.i.push_back(static_cast<int32_t>(rng() % uint32_t(vocab)));
  return t;
}

plan::Kernel kernel(const std::string &op,
                    std::vector<std::pair<std::string, double>> attrs = {}) {
  plan::Kernel k;
  k.set_op(op);
  for (auto &[name, value] : attrs)
    (*k.mutable_attrs())[name].set_f(value);
  return k;
}

/// Runs `k` on copies of `ins` / `outs` with `threads` BLAS (= kernel)
/// threads and returns the outputs.
std::vector<Tensor> runWith(int threads, const plan::Kernel &k,
                            std::vector<Tensor> ins, std::vector<Tensor> outs) {
  openblas_set_num_threads(threads);
  REQUIRE(detail::parallelThreads() == threads);
  std::vector<TensorRef> in, out;
  for (Tensor &t : ins)
    in.push_back(t.ref());
  for (Tensor &t : outs)
    out.push_back(t.ref());
  KernelContext ctx;
  Status s = runKernel(k, in, out, ctx);
  INFO(s.message());
  REQUIRE(s.isOk());
  return outs;
}

void checkSameOnAnyThreads(const plan::Kernel &k,
                           const std::vector<Tensor> &ins,
                           const std::vector<Tensor> &outs) {
  INFO(k.op());
  std::vector<Tensor> one = runWith(1, k, ins, outs);
  std::vector<Tensor> three = runWith(3, k, ins, outs);
  REQUIRE(one.size() == three.size());
  for (size_t o = 0; o < one.size(); ++o) {
    INFO("output " << o);
    REQUIRE(one[o].f.size() == three[o].f.size());
    CHECK(std::memcmp(one[o].f.data(), three[o].f.data(),
                      one[o].f.size() * sizeof(float)) == 0);
  }
}

} // namespace

TEST_CASE("parallelFor visits every chunk once, on any thread count",
          "[kernels][parallel]") {
  for (int threads : {1, 2, 4}) {
    openblas_set_num_threads(threads);
    const int64_t n = 1000003, grain = 4096;
    std::vector<std::atomic<int>> seen(n);
    detail::parallelFor(n, grain, [&](int64_t begin, int64_t end) {
      CHECK(begin % grain == 0);
      CHECK(end == std::min(n, begin + grain));
      for (int64_t k = begin; k < end; ++k)
        seen[k].fetch_add(1);
    });
    int64_t wrong = 0;
    for (auto &s : seen)
      wrong += s.load() != 1;
    CHECK(wrong == 0);
  }
}

TEST_CASE("parallel kernels give the same floats on one and three threads",
          "[kernels][parallel]") {
  const int64_t rows = 512, hidden = 1536, vocab = 3000;
  Tensor x = randomF32({rows, hidden}, 1);
  Tensor dy = randomF32({rows, hidden}, 2);
  Tensor gamma = randomF32({hidden}, 3);
  Tensor beta = randomF32({hidden}, 4);
  Tensor y = zerosF32({rows, hidden});

  checkSameOnAnyThreads(kernel("gelu"), {x}, {y});
  checkSameOnAnyThreads(kernel("gelu_grad"), {x, dy}, {y});
  checkSameOnAnyThreads(kernel("add"), {x, dy}, {y});
  checkSameOnAnyThreads(kernel("layer_norm"), {x, gamma, beta}, {y});
  checkSameOnAnyThreads(kernel("rms_norm"), {x, gamma}, {y});
  checkSameOnAnyThreads(kernel("layer_norm_grad_input"), {x, gamma, dy}, {y});
  checkSameOnAnyThreads(kernel("rms_norm_grad_input"), {x, gamma, dy}, {y});
  checkSameOnAnyThreads(kernel("swiglu"), {x}, {zerosF32({rows, hidden / 2})});
  checkSameOnAnyThreads(kernel("swiglu_grad"),
                        {x, randomF32({rows, hidden / 2}, 5)}, {y});
  checkSameOnAnyThreads(kernel("accumulate"), {x}, {dy});
  checkSameOnAnyThreads(kernel("zero"), {}, {dy});
  checkSameOnAnyThreads(
      kernel("adamw", {{"lr", 1e-3}, {"weight_decay", 0.1}}), {x},
      {randomF32({rows, hidden}, 6), randomF32({rows, hidden}, 7, 0.01f),
       zerosF32({rows, hidden})});

  Tensor logits = randomF32({rows, vocab}, 8, 3.0f);
  Tensor targets = tokens(rows, vocab, 9);
  checkSameOnAnyThreads(kernel("cross_entropy_grad", {{"scale", 0.5}}),
                        {logits, targets}, {zerosF32({rows, vocab})});
  std::vector<Tensor> one =
      runWith(1, kernel("cross_entropy"), {logits, targets}, {zerosF32({})});
  std::vector<Tensor> three =
      runWith(3, kernel("cross_entropy"), {logits, targets}, {zerosF32({})});
  CHECK(one[0].f[0] == three[0].f[0]);

  openblas_set_num_threads(1);
  double sumOne = sumOfSquares(x.f.data(), x.numel());
  openblas_set_num_threads(3);
  double sumThree = sumOfSquares(x.f.data(), x.numel());
  CHECK(sumOne == sumThree);
  double reference = 0;
  for (float v : x.f)
    reference += double(v) * v;
  CHECK(sumOne == Approx(reference).epsilon(1e-12));
}

TEST_CASE("vectorized exp, tanh and sigmoid are accurate",
          "[kernels][parallel]") {
  double worstExp = 0, worstTanh = 0, worstSigmoid = 0;
  for (double v = -87.0; v <= 88.0; v += 0.001) {
    float x = static_cast<float>(v);
    double e = std::exp(double(x));
    worstExp = std::max(worstExp, std::fabs(detail::fastExp(x) - e) / e);
  }
  for (double v = -20.0; v <= 20.0; v += 0.0005) {
    float x = static_cast<float>(v);
    worstTanh = std::max(worstTanh,
                         std::fabs(detail::fastTanh(x) - std::tanh(double(x))));
    worstSigmoid =
        std::max(worstSigmoid, std::fabs(detail::fastSigmoid(x) -
                                         1.0 / (1.0 + std::exp(-double(x)))));
  }
  CHECK(worstExp < 3e-7);     // within about 2 ulp
  CHECK(worstTanh < 2e-7);    // absolute
  CHECK(worstSigmoid < 2e-7); // absolute
  CHECK(detail::fastExp(-100.0f) == 0.0f);
  CHECK(std::isinf(detail::fastExp(100.0f)));
  CHECK(std::isnan(detail::fastExp(std::nanf(""))));
  CHECK(detail::fastExp(-__builtin_inff()) == 0.0f);
  CHECK(detail::fastExp(0.0f) == 1.0f);
}

// Unit tests of the CPU kernels: hand-computed forward cases, finite-difference
// checks of every gradient, the AdamW update and the error paths.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "runtime/kernels/Kernels.h"

using namespace piper;
using namespace piper::runtime;

namespace {

/// An owning tensor for tests.
struct Tensor {
  plan::DType dtype = plan::F32;
  std::vector<int64_t> shape;
  std::vector<float> f;
  std::vector<int32_t> i;

  static Tensor f32(std::vector<int64_t> shape,
                    std::vector<float> values = {}) {
    Tensor t;
    t.shape = std::move(shape);
    t.f = std::move(values);
    if (t.f.empty())
      t.f.assign(t.numel(), 0.0f);
    REQUIRE(int64_t(t.f.size()) == t.numel());
    return t;
  }
  static Tensor i32(std::vector<int64_t> shape, std::vector<int32_t> values) {
    Tensor t;
    t.dtype = plan::I32;
    t.shape = std::move(shape);
    t.i = std::move(values);
    REQUIRE(int64_t(t.i.size()) == t.numel());
    return t;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  TensorRef ref() {
    TensorRef r;
    r.dtype = dtype;
    r.shape = shape;
    r.data = dtype == plan::I32 ? static_cast<void *>(i.data())
                                : static_cast<void *>(f.data());
    return r;
  }
};

/// Builds a plan::Kernel: K("attention").i("heads", 2).f("eps", 1e-5).
struct K {
  plan::Kernel kernel;
  explicit K(const std::string &op) { kernel.set_op(op); }
  K &i(const std::string &name, int64_t v) {
    (*kernel.mutable_attrs())[name].set_i(v);
    return *this;
  }
  K &f(const std::string &name, double v) {
    (*kernel.mutable_attrs())[name].set_f(v);
    return *this;
  }
  K &s(const std::string &name, const std::string &v) {
    (*kernel.mutable_attrs())[name].set_s(v);
    return *this;
  }
  operator const plan::Kernel &() const { return kernel; }
};

Status run(const plan::Kernel &kernel, std::vector<Tensor> &ins,
           std::vector<Tensor> &outs, KernelContext &ctx) {
  std::vector<TensorRef> inRefs, outRefs;
  for (Tensor &t : ins)
    inRefs.push_back(t.ref());
  for (Tensor &t : outs)
    outRefs.push_back(t.ref());
  return runKernel(kernel, inRefs, outRefs, ctx);
}

Status run(const plan::Kernel &kernel, std::vector<Tensor> &ins,
           std::vector<Tensor> &outs) {
  KernelContext ctx;
  return run(kernel, ins, outs, ctx);
}

/// Runs a kernel that must succeed.
void mustRun(const plan::Kernel &kernel, std::vector<Tensor> &ins,
             std::vector<Tensor> &outs) {
  Status s = run(kernel, ins, outs);
  INFO(kernel.op() << ": " << s.message());
  REQUIRE(s.isOk());
}

/// Runs a kernel that must fail with an error naming its op.
std::string mustFail(const plan::Kernel &kernel, std::vector<Tensor> ins,
                     std::vector<Tensor> outs = {}) {
  Status s = run(kernel, ins, outs);
  INFO(kernel.op());
  REQUIRE_FALSE(s.isOk());
  CHECK(s.message().rfind(kernel.op() + ": ", 0) == 0);
  CHECK(s.message().back() != '.');
  return s.message();
}

/// Deterministic uniform numbers in [lo, hi) (splitmix64), the same on every
/// standard library.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  double next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return double(z >> 11) * 0x1p-53;
  }
  float uniform(double lo, double hi) { return float(lo + (hi - lo) * next()); }
  std::vector<float> vec(int64_t n, double lo = -1.0, double hi = 1.0) {
    std::vector<float> v(n);
    for (float &x : v)
      x = uniform(lo, hi);
    return v;
  }
};

Tensor randomF32(Rng &rng, std::vector<int64_t> shape, double lo = -1.0,
                 double hi = 1.0) {
  Tensor t = Tensor::f32(std::move(shape));
  t.f = rng.vec(t.numel(), lo, hi);
  return t;
}

/// L = sum(y * r) over the single output y of the forward kernel, in double.
double probeLoss(const plan::Kernel &forward, std::vector<Tensor> ins,
                 const std::vector<int64_t> &outShape,
                 const std::vector<float> &r) {
  std::vector<Tensor> outs = {Tensor::f32(outShape)};
  Status s = run(forward, ins, outs);
  if (!s.isOk())
    FAIL(s.message());
  double loss = 0;
  for (size_t e = 0; e < r.size(); ++e)
    loss += double(outs[0].f[e]) * r[e];
  return loss;
}

/// Compares `analytic` = dL/d(ins[wrt]) with central differences of
/// probeLoss, element by element. The forward runs in fp32, so the step is
/// large (1e-2) and |fd - analytic| <= atol + rtol |fd|; observed errors are
/// below 3e-5, so a wrong term of any size that matters fails.
void checkGradient(const plan::Kernel &forward, std::vector<Tensor> ins,
                   size_t wrt, const std::vector<int64_t> &outShape,
                   const std::vector<float> &r,
                   const std::vector<float> &analytic, double step = 1e-2,
                   double atol = 2e-4, double rtol = 1e-3) {
  REQUIRE(analytic.size() == ins[wrt].f.size());
  double worst = 0, worstFd = 0, worstAnalytic = 0;
  size_t worstAt = 0;
  bool ok = true;
  for (size_t e = 0; e < analytic.size(); ++e) {
    float orig = ins[wrt].f[e];
    float plus = orig + float(step), minus = orig - float(step);
    ins[wrt].f[e] = plus;
    double lossPlus = probeLoss(forward, ins, outShape, r);
    ins[wrt].f[e] = minus;
    double lossMinus = probeLoss(forward, ins, outShape, r);
    ins[wrt].f[e] = orig;
    double fd = (lossPlus - lossMinus) / (double(plus) - double(minus));
    double err = std::fabs(fd - analytic[e]);
    if (err > atol + rtol * std::fabs(fd))
      ok = false;
    if (err > worst) {
      worst = err;
      worstAt = e;
      worstFd = fd;
      worstAnalytic = analytic[e];
    }
  }
  INFO(forward.op() << " input " << wrt << ": worst element " << worstAt
                    << " finite difference " << worstFd << " analytic "
                    << worstAnalytic << " error " << worst);
  CHECK(ok);
}

/// The gradients these tests compare must not be trivially zero.
void requireNonZero(const std::vector<float> &g) {
  double norm = 0;
  for (float v : g)
    norm += std::fabs(v);
  REQUIRE(norm > 1e-3);
}

} // namespace

// ---------------------------------------------------------------------------
// Registry and attributes.

TEST_CASE("kernelNames lists every kernel once", "[kernels]") {
  std::vector<std::string> names = kernelNames();
  std::set<std::string> unique(names.begin(), names.end());
  CHECK(unique.size() == names.size());
  const std::vector<std::string> spec = {"embedding",
                                         "position_add",
                                         "layer_norm",
                                         "rms_norm",
                                         "linear",
                                         "gelu",
                                         "swiglu",
                                         "add",
                                         "attention",
                                         "cross_entropy",
                                         "loss_accumulate",
                                         "embedding_grad",
                                         "position_add_grad",
                                         "layer_norm_grad",
                                         "rms_norm_grad",
                                         "linear_grad_input",
                                         "linear_grad_weight",
                                         "bias_grad",
                                         "gelu_grad",
                                         "swiglu_grad",
                                         "attention_grad",
                                         "cross_entropy_grad",
                                         "accumulate",
                                         "zero",
                                         "adamw"};
  for (const std::string &want : spec)
    CHECK(unique.count(want) == 1);
  CHECK(names.size() == 25);
}

TEST_CASE("attrInt and attrFloat read attributes or defaults", "[kernels]") {
  K k("linear");
  k.i("transpose_w", 1).f("eps", 0.25).f("whole", 3.0).s("name", "x");
  CHECK(attrInt(k, "transpose_w", 0) == 1);
  CHECK(attrInt(k, "missing", 7) == 7);
  CHECK(attrInt(k, "whole", 0) == 3);
  CHECK(attrInt(k, "name", 5) == 5);
  CHECK(attrFloat(k, "eps", 1.0) == 0.25);
  CHECK(attrFloat(k, "transpose_w", 0.0) == 1.0);
  CHECK(attrFloat(k, "missing", 0.5) == 0.5);
  CHECK(attrFloat(k, "name", 0.5) == 0.5);
}

// ---------------------------------------------------------------------------
// Forward kernels on hand-computed cases.

TEST_CASE("embedding gathers table rows", "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::i32({2, 2}, {2, 0, 2, 1}),
                             Tensor::f32({3, 2}, {1, 2, 3, 4, 5, 6})};
  std::vector<Tensor> outs = {Tensor::f32({4, 2})};
  mustRun(K("embedding"), ins, outs);
  CHECK(outs[0].f == std::vector<float>{5, 6, 1, 2, 5, 6, 3, 4});
}

TEST_CASE("position_add adds pos[n % seq]", "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::f32({4, 2}, {0, 0, 1, 1, 2, 2, 3, 3}),
                             Tensor::f32({3, 2}, {10, 20, 30, 40, 50, 60})};
  std::vector<Tensor> outs = {Tensor::f32({4, 2})};
  mustRun(K("position_add").i("seq", 2), ins, outs);
  CHECK(outs[0].f == std::vector<float>{10, 20, 31, 41, 12, 22, 33, 43});
}

TEST_CASE("layer_norm normalizes rows, then scales and shifts",
          "[kernels][forward]") {
  Rng rng(1);
  Tensor x = randomF32(rng, {3, 8}, -2.0, 5.0);
  std::vector<Tensor> ins = {x, Tensor::f32({8}), Tensor::f32({8})};
  std::fill(ins[1].f.begin(), ins[1].f.end(), 1.0f);
  std::vector<Tensor> outs = {Tensor::f32({3, 8})};
  mustRun(K("layer_norm").f("eps", 0.0), ins, outs);
  for (int n = 0; n < 3; ++n) {
    double mean = 0, var = 0;
    for (int j = 0; j < 8; ++j)
      mean += outs[0].f[n * 8 + j];
    mean /= 8;
    for (int j = 0; j < 8; ++j)
      var += (outs[0].f[n * 8 + j] - mean) * (outs[0].f[n * 8 + j] - mean);
    var /= 8; // biased, like torch.nn.LayerNorm
    CHECK(mean == Approx(0.0).margin(1e-6));
    CHECK(var == Approx(1.0).epsilon(1e-5));
  }

  // Row [1, 3]: mean 2, biased variance 1, so xhat = [-1, 1].
  std::vector<Tensor> small = {Tensor::f32({1, 2}, {1, 3}),
                               Tensor::f32({2}, {2, 3}),
                               Tensor::f32({2}, {0.5, -1})};
  std::vector<Tensor> smallOut = {Tensor::f32({1, 2})};
  mustRun(K("layer_norm"), small, smallOut);
  double rstd = 1.0 / std::sqrt(1.0 + 1e-5); // default eps
  CHECK(smallOut[0].f[0] == Approx(-2 * rstd + 0.5));
  CHECK(smallOut[0].f[1] == Approx(3 * rstd - 1));
}

TEST_CASE("linear matches hand-computed products", "[kernels][forward]") {
  // x = [[1,2],[3,4]], w = [[1,0,2],[0,1,3]] ([K=2,M=3]), b = [1,1,1].
  Tensor x = Tensor::f32({2, 2}, {1, 2, 3, 4});
  Tensor w = Tensor::f32({2, 3}, {1, 0, 2, 0, 1, 3});
  Tensor b = Tensor::f32({3}, {1, 1, 1});
  std::vector<float> want = {1, 2, 8, 3, 4, 18};

  std::vector<Tensor> ins = {x, w};
  std::vector<Tensor> outs = {Tensor::f32({2, 3})};
  mustRun(K("linear"), ins, outs);
  CHECK(outs[0].f == want);

  ins.push_back(b);
  outs[0].f.assign(6, 123.0f); // must be overwritten, not accumulated into
  mustRun(K("linear"), ins, outs);
  CHECK(outs[0].f == std::vector<float>{2, 3, 9, 4, 5, 19});

  // The same product with w stored transposed ([M=3,K=2]).
  Tensor wt = Tensor::f32({3, 2}, {1, 0, 0, 1, 2, 3});
  std::vector<Tensor> tins = {x, wt};
  std::vector<Tensor> touts = {Tensor::f32({2, 3})};
  mustRun(K("linear").i("transpose_w", 1), tins, touts);
  CHECK(touts[0].f == want);
}

TEST_CASE("linear matches a naive product on odd sizes", "[kernels][forward]") {
  Rng rng(2);
  const int64_t n = 7, k = 13, m = 5;
  Tensor x = randomF32(rng, {n, k}), w = randomF32(rng, {k, m});
  Tensor b = randomF32(rng, {m});
  std::vector<Tensor> ins = {x, w, b};
  std::vector<Tensor> outs = {Tensor::f32({n, m})};
  mustRun(K("linear"), ins, outs);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < m; ++c) {
      double want = b.f[c];
      for (int64_t j = 0; j < k; ++j)
        want += double(x.f[r * k + j]) * w.f[j * m + c];
      CHECK(outs[0].f[r * m + c] == Approx(want).margin(1e-5));
    }
}

TEST_CASE("gelu uses the tanh approximation", "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::f32({5}, {0, 1, -1, 2, -3})};
  std::vector<Tensor> outs = {Tensor::f32({5})};
  mustRun(K("gelu"), ins, outs);
  // torch.nn.functional.gelu(x, approximate='tanh').
  CHECK(outs[0].f[0] == 0.0f);
  CHECK(outs[0].f[1] == Approx(0.8411920).margin(1e-6));
  CHECK(outs[0].f[2] == Approx(-0.1588080).margin(1e-6));
  CHECK(outs[0].f[3] == Approx(1.9545977).margin(1e-6));
  CHECK(outs[0].f[4] == Approx(-0.0036374).margin(1e-6));
}

TEST_CASE("add sums elementwise", "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::f32({2, 2}, {1, 2, 3, 4}),
                             Tensor::f32({2, 2}, {10, 20, 30, 40})};
  std::vector<Tensor> outs = {Tensor::f32({2, 2})};
  mustRun(K("add"), ins, outs);
  CHECK(outs[0].f == std::vector<float>{11, 22, 33, 44});
}

TEST_CASE("attention on one and two tokens", "[kernels][forward]") {
  // One head, hd = 2. Rows are [q | k | v].
  SECTION("a single token attends only to itself") {
    std::vector<Tensor> ins = {Tensor::f32({1, 6}, {3, -1, 2, 5, 7, 8})};
    std::vector<Tensor> outs = {Tensor::f32({1, 2})};
    mustRun(K("attention").i("heads", 1).i("seq", 1), ins, outs);
    CHECK(outs[0].f == std::vector<float>{7, 8});
  }
  SECTION("the second token mixes both values by softmax of q.k/sqrt(hd)") {
    std::vector<Tensor> ins = {
        Tensor::f32({2, 6}, {9, 9, 1, 0, 1, 2, // token 0: q ignored by the mask
                             1, 2, 0, 1, 3, 4})}; // token 1
    std::vector<Tensor> outs = {Tensor::f32({2, 2})};
    mustRun(K("attention").i("heads", 1).i("seq", 2), ins, outs);
    // q1.k0 = 1, q1.k1 = 2, scaled by 1/sqrt(2).
    double s0 = 1 / std::sqrt(2.0), s1 = 2 / std::sqrt(2.0);
    double p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1)), p1 = 1 - p0;
    CHECK(outs[0].f[0] == Approx(1));
    CHECK(outs[0].f[1] == Approx(2));
    CHECK(outs[0].f[2] == Approx(p0 * 1 + p1 * 3));
    CHECK(outs[0].f[3] == Approx(p0 * 2 + p1 * 4));
  }
  SECTION("sequences in a microbatch are independent") {
    // Two sequences of one token each: each output is its own value.
    std::vector<Tensor> ins = {
        Tensor::f32({2, 6}, {1, 1, 1, 1, 5, 6, 1, 1, 1, 1, -5, -6})};
    std::vector<Tensor> outs = {Tensor::f32({2, 2})};
    mustRun(K("attention").i("heads", 1).i("seq", 1), ins, outs);
    CHECK(outs[0].f == std::vector<float>{5, 6, -5, -6});
  }
}

TEST_CASE("attention matches a naive double-precision reference",
          "[kernels][forward]") {
  Rng rng(3);
  const int64_t batch = 2, seq = 5, heads = 3, hd = 4, hidden = heads * hd;
  const int64_t rows = batch * seq;
  Tensor qkv = randomF32(rng, {rows, 3 * hidden}, -2.0, 2.0);
  std::vector<Tensor> ins = {qkv};
  std::vector<Tensor> outs = {Tensor::f32({rows, hidden})};
  mustRun(K("attention").i("heads", heads).i("seq", seq), ins, outs);

  auto at = [&](int64_t row, int64_t part, int64_t h, int64_t c) {
    return double(qkv.f[row * 3 * hidden + part * hidden + h * hd + c]);
  };
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < seq; ++i) {
        std::vector<double> score(i + 1);
        double maxScore = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < hd; ++c)
            dot += at(b * seq + i, 0, h, c) * at(b * seq + j, 1, h, c);
          score[j] = dot / std::sqrt(double(hd));
          maxScore = std::max(maxScore, score[j]);
        }
        for (double &s : score)
          sum += (s = std::exp(s - maxScore));
        for (int64_t c = 0; c < hd; ++c) {
          double want = 0;
          for (int64_t j = 0; j <= i; ++j)
            want += score[j] / sum * at(b * seq + j, 2, h, c);
          CHECK(outs[0].f[(b * seq + i) * hidden + h * hd + c] ==
                Approx(want).margin(1e-5));
        }
      }
}

TEST_CASE("rms_norm divides by the root mean square, then scales",
          "[kernels][forward]") {
  // Row [3, 4]: mean(x^2) = 12.5. Row [1, 1]: mean(x^2) = 1.
  std::vector<Tensor> ins = {Tensor::f32({2, 2}, {3, 4, 1, 1}),
                             Tensor::f32({2}, {2, -1})};
  std::vector<Tensor> outs = {Tensor::f32({2, 2})};
  mustRun(K("rms_norm"), ins, outs);
  double r0 = 1.0 / std::sqrt(12.5 + 1e-6), r1 = 1.0 / std::sqrt(1.0 + 1e-6);
  CHECK(outs[0].f[0] == Approx(3 * r0 * 2));
  CHECK(outs[0].f[1] == Approx(4 * r0 * -1));
  CHECK(outs[0].f[2] == Approx(2 * r1));
  CHECK(outs[0].f[3] == Approx(-1 * r1));

  // The default eps is 1e-6, not layer_norm's 1e-5: on a row of tiny values
  // the two differ visibly. mean(x^2) = 1e-6, so y = x / sqrt(2e-6).
  std::vector<Tensor> tiny = {Tensor::f32({1, 2}, {1e-3f, -1e-3f}),
                              Tensor::f32({2}, {1, 1})};
  std::vector<Tensor> tinyOut = {Tensor::f32({1, 2})};
  mustRun(K("rms_norm"), tiny, tinyOut);
  CHECK(tinyOut[0].f[0] == Approx(1e-3 / std::sqrt(2e-6)));
  CHECK(tinyOut[0].f[1] == Approx(-1e-3 / std::sqrt(2e-6)));

  // With unit gamma and eps 0 every row has mean square 1, and the mean is
  // not subtracted.
  Rng rng(4);
  Tensor x = randomF32(rng, {3, 8}, 1.0, 5.0); // all positive
  std::vector<Tensor> rins = {x, Tensor::f32({8})};
  std::fill(rins[1].f.begin(), rins[1].f.end(), 1.0f);
  std::vector<Tensor> routs = {Tensor::f32({3, 8})};
  mustRun(K("rms_norm").f("eps", 0.0), rins, routs);
  for (int n = 0; n < 3; ++n) {
    double sq = 0;
    for (int j = 0; j < 8; ++j) {
      sq += double(routs[0].f[n * 8 + j]) * routs[0].f[n * 8 + j];
      CHECK(routs[0].f[n * 8 + j] > 0.0f);
    }
    CHECK(sq / 8 == Approx(1.0).epsilon(1e-6));
  }
}

TEST_CASE("swiglu multiplies silu(gate) by up", "[kernels][forward]") {
  // F = 3; rows are [gate(3) | up(3)].
  std::vector<Tensor> ins = {
      Tensor::f32({2, 6}, {0, 1, -2, 5, 2, 3, //
                           4, -30, 30, 1, 1, -0.5f})};
  std::vector<Tensor> outs = {Tensor::f32({2, 3})};
  mustRun(K("swiglu"), ins, outs);
  auto silu = [](double g) { return g / (1.0 + std::exp(-g)); };
  CHECK(outs[0].f[0] == 0.0f);
  CHECK(outs[0].f[1] == Approx(0.7310586 * 2).margin(1e-6)); // silu(1) * 2
  CHECK(outs[0].f[2] == Approx(-0.2384058 * 3).margin(1e-6)); // silu(-2) * 3
  CHECK(outs[0].f[3] == Approx(silu(4)));
  CHECK(outs[0].f[4] == Approx(silu(-30)).margin(1e-10)); // ~ -2.8e-12
  CHECK(outs[0].f[5] == Approx(-15.0));                   // silu(30) ~ 30
}

namespace {

/// Causal GQA attention with rotary embeddings, computed directly in double
/// from the spec: qkv rows are [q(heads*hd) | k(kv*hd) | v(kv*hd)].
std::vector<double> referenceAttention(const std::vector<float> &qkv,
                                       int64_t batch, int64_t seq,
                                       int64_t heads, int64_t kv, int64_t hd,
                                       double theta) {
  const int64_t cols = (heads + 2 * kv) * hd, width = heads * hd;
  auto vec = [&](int64_t row, int64_t offset, bool rotate) {
    std::vector<double> x(hd);
    for (int64_t c = 0; c < hd; ++c)
      x[c] = qkv[row * cols + offset + c];
    if (!rotate || theta == 0)
      return x;
    std::vector<double> r(hd);
    double pos = double(row % seq);
    for (int64_t i = 0; i < hd / 2; ++i) {
      double angle = pos * std::pow(theta, -2.0 * i / hd);
      r[i] = x[i] * std::cos(angle) - x[i + hd / 2] * std::sin(angle);
      r[i + hd / 2] = x[i + hd / 2] * std::cos(angle) + x[i] * std::sin(angle);
    }
    return r;
  };
  std::vector<double> y(batch * seq * width);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      int64_t g = h / (heads / kv);
      for (int64_t i = 0; i < seq; ++i) {
        std::vector<double> q = vec(b * seq + i, h * hd, true);
        std::vector<double> score(i + 1);
        double maxScore = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          std::vector<double> k = vec(b * seq + j, (heads + g) * hd, true);
          double dot = 0;
          for (int64_t c = 0; c < hd; ++c)
            dot += q[c] * k[c];
          score[j] = dot / std::sqrt(double(hd));
          maxScore = std::max(maxScore, score[j]);
        }
        for (double &s : score)
          sum += (s = std::exp(s - maxScore));
        for (int64_t j = 0; j <= i; ++j) {
          std::vector<double> v =
              vec(b * seq + j, (heads + kv + g) * hd, false);
          for (int64_t c = 0; c < hd; ++c)
            y[(b * seq + i) * width + h * hd + c] += score[j] / sum * v[c];
        }
      }
    }
  return y;
}

} // namespace

TEST_CASE("attention with rotary embeddings rotates q and k by position",
          "[kernels][forward]") {
  // One head, hd = 2, theta irrelevant for i = 0: freq_0 = 1, so the token
  // at position 1 is rotated by 1 radian. q1 = k0 = k1 = [1, 0]; after the
  // rotation q1.k0 = cos(1) and q1.k1 = 1 (relative position 0).
  std::vector<Tensor> ins = {
      Tensor::f32({2, 6}, {9, 9, 1, 0, 1, 2, //
                           1, 0, 1, 0, 3, 4})};
  std::vector<Tensor> outs = {Tensor::f32({2, 2})};
  mustRun(K("attention").i("heads", 1).i("seq", 2).f("rope_theta", 10000.0),
          ins, outs);
  double s0 = std::cos(1.0) / std::sqrt(2.0), s1 = 1 / std::sqrt(2.0);
  double p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1)), p1 = 1 - p0;
  CHECK(outs[0].f[0] == Approx(1)); // v is never rotated
  CHECK(outs[0].f[1] == Approx(2));
  CHECK(outs[0].f[2] == Approx(p0 * 1 + p1 * 3));
  CHECK(outs[0].f[3] == Approx(p0 * 2 + p1 * 4));
}

TEST_CASE("grouped-query attention with rotary embeddings matches a "
          "double-precision reference",
          "[kernels][forward]") {
  struct Config {
    int64_t heads, kv, hd;
    double theta;
  };
  const Config config = GENERATE(Config{4, 2, 4, 10000.0},
                                 Config{6, 2, 6, 500000.0},
                                 Config{4, 1, 2, 10.0}, Config{3, 3, 4, 0.0},
                                 Config{4, 2, 3, 0.0});
  INFO("heads=" << config.heads << " kv_heads=" << config.kv
                << " hd=" << config.hd << " rope_theta=" << config.theta);
  Rng rng(5);
  const int64_t batch = 2, seq = 7, rows = batch * seq;
  const int64_t cols = (config.heads + 2 * config.kv) * config.hd;
  const int64_t width = config.heads * config.hd;
  Tensor qkv = randomF32(rng, {rows, cols}, -2.0, 2.0);
  std::vector<Tensor> ins = {qkv};
  std::vector<Tensor> outs = {Tensor::f32({rows, width})};
  mustRun(K("attention")
              .i("heads", config.heads)
              .i("kv_heads", config.kv)
              .i("seq", seq)
              .f("rope_theta", config.theta),
          ins, outs);
  std::vector<double> want = referenceAttention(
      qkv.f, batch, seq, config.heads, config.kv, config.hd, config.theta);
  for (int64_t e = 0; e < rows * width; ++e) {
    INFO("element " << e);
    CHECK(outs[0].f[e] == Approx(want[e]).margin(2e-5));
  }
}

TEST_CASE("grouped-query attention equals attention with repeated k and v",
          "[kernels][forward]") {
  // heads 4 over kv_heads 2 is MHA whose k and v heads are [k0 k0 k1 k1].
  Rng rng(6);
  const int64_t seq = 4, rows = 2 * seq, hd = 2, heads = 4, kv = 2;
  const int64_t cols = (heads + 2 * kv) * hd, mhaCols = 3 * heads * hd;
  Tensor qkv = randomF32(rng, {rows, cols}, -2.0, 2.0);
  Tensor mha = Tensor::f32({rows, mhaCols});
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t c = 0; c < heads * hd; ++c)
      mha.f[n * mhaCols + c] = qkv.f[n * cols + c];
    for (int64_t part = 1; part <= 2; ++part)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = 0; c < hd; ++c)
          mha.f[n * mhaCols + part * heads * hd + h * hd + c] =
              qkv.f[n * cols + heads * hd + (part - 1) * kv * hd +
                    (h / 2) * hd + c];
  }
  for (double theta : {0.0, 10000.0}) {
    std::vector<Tensor> gqaIns = {qkv}, mhaIns = {mha};
    std::vector<Tensor> gqaOut = {Tensor::f32({rows, heads * hd})};
    std::vector<Tensor> mhaOut = {Tensor::f32({rows, heads * hd})};
    mustRun(K("attention")
                .i("heads", heads)
                .i("kv_heads", kv)
                .i("seq", seq)
                .f("rope_theta", theta),
            gqaIns, gqaOut);
    mustRun(K("attention").i("heads", heads).i("seq", seq).f("rope_theta",
                                                             theta),
            mhaIns, mhaOut);
    for (int64_t e = 0; e < rows * heads * hd; ++e)
      CHECK(gqaOut[0].f[e] == Approx(mhaOut[0].f[e]).margin(1e-6));
  }
}

TEST_CASE("explicit default kv_heads and rope_theta change nothing",
          "[kernels][forward]") {
  Rng rng(7);
  Tensor qkv = randomF32(rng, {6, 18}, -2.0, 2.0);
  std::vector<Tensor> ins = {qkv};
  std::vector<Tensor> plain = {Tensor::f32({6, 6})};
  std::vector<Tensor> explicitOut = {Tensor::f32({6, 6})};
  mustRun(K("attention").i("heads", 2).i("seq", 3), ins, plain);
  mustRun(K("attention").i("heads", 2).i("kv_heads", 2).i("seq", 3).f(
              "rope_theta", 0.0),
          ins, explicitOut);
  CHECK(plain[0].f == explicitOut[0].f);
}

TEST_CASE("cross_entropy of uniform logits is ln V", "[kernels][forward]") {
  const int64_t vocab = 7;
  std::vector<Tensor> ins = {Tensor::f32({3, vocab}),
                             Tensor::i32({1, 3}, {0, 6, 3})};
  std::fill(ins[0].f.begin(), ins[0].f.end(), 2.5f);
  std::vector<Tensor> outs = {Tensor::f32({})};
  mustRun(K("cross_entropy"), ins, outs);
  CHECK(outs[0].f[0] == Approx(std::log(7.0)));
}

TEST_CASE("cross_entropy is stable for large logits and averages rows",
          "[kernels][forward]") {
  // Row 0: the target is far ahead, loss ~ 0. Row 1: far behind, loss ~ 1000.
  std::vector<Tensor> ins = {Tensor::f32({2, 2}, {1000, 0, 1000, 0}),
                             Tensor::i32({2, 1}, {0, 1})};
  std::vector<Tensor> outs = {Tensor::f32({1})};
  mustRun(K("cross_entropy"), ins, outs);
  CHECK(std::isfinite(outs[0].f[0]));
  CHECK(outs[0].f[0] == Approx(500.0));

  std::vector<Tensor> gradOuts = {Tensor::f32({2, 2})};
  mustRun(K("cross_entropy_grad"), ins, gradOuts);
  CHECK(gradOuts[0].f[0] == Approx(0.0).margin(1e-12));
  CHECK(gradOuts[0].f[2] == Approx(0.5));
  CHECK(gradOuts[0].f[3] == Approx(-0.5));
}

TEST_CASE("loss_accumulate adds scale * loss to the context",
          "[kernels][forward]") {
  double total = 1.0;
  KernelContext ctx;
  ctx.lossAccumulator = &total;
  std::vector<Tensor> ins = {Tensor::f32({}, {2.0f})};
  std::vector<Tensor> outs;
  REQUIRE(run(K("loss_accumulate").f("scale", 0.25), ins, outs, ctx).isOk());
  REQUIRE(run(K("loss_accumulate").f("scale", 0.25), ins, outs, ctx).isOk());
  CHECK(total == 2.0);
}

// ---------------------------------------------------------------------------
// Finite-difference checks of every backward kernel.

TEST_CASE("embedding_grad is the gradient of embedding", "[kernels][grad]") {
  Rng rng(10);
  const int64_t vocab = 6, hidden = 4;
  Tensor ids = Tensor::i32({2, 3}, {1, 4, 1, 0, 4, 1}); // 1 and 4 repeat
  Tensor table = randomF32(rng, {vocab, hidden});
  std::vector<float> r = rng.vec(6 * hidden);

  std::vector<Tensor> ins = {ids, Tensor::f32({6, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({vocab, hidden})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be zeroed
  mustRun(K("embedding_grad").i("vocab", vocab), ins, outs);
  requireNonZero(outs[0].f);
  for (int64_t j = 0; j < hidden; ++j) {
    CHECK(outs[0].f[2 * hidden + j] == 0.0f); // ids never seen
    CHECK(outs[0].f[5 * hidden + j] == 0.0f);
  }
  checkGradient(K("embedding"), {ids, table}, 1, {6, hidden}, r, outs[0].f);
}

TEST_CASE("position_add gradients", "[kernels][grad]") {
  Rng rng(11);
  const int64_t seq = 3, positions = 5, hidden = 4, rows = 2 * seq;
  Tensor x = randomF32(rng, {rows, hidden});
  Tensor pos = randomF32(rng, {positions, hidden});
  std::vector<float> r = rng.vec(rows * hidden);
  K forward = K("position_add").i("seq", seq);

  // dx is dy itself: the runtime passes it through without a kernel.
  checkGradient(forward, {x, pos}, 0, {rows, hidden}, r, r);

  std::vector<Tensor> ins = {Tensor::f32({rows, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({positions, hidden})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f);
  mustRun(K("position_add_grad").i("seq", seq), ins, outs);
  requireNonZero(outs[0].f);
  for (int64_t j = seq * hidden; j < positions * hidden; ++j)
    CHECK(outs[0].f[j] == 0.0f); // positions past seq
  checkGradient(forward, {x, pos}, 1, {rows, hidden}, r, outs[0].f);
}

TEST_CASE("layer_norm_grad is the gradient of layer_norm", "[kernels][grad]") {
  Rng rng(12);
  const int64_t rows = 4, hidden = 6;
  Tensor x = randomF32(rng, {rows, hidden}, -2.0, 2.0);
  Tensor gamma = randomF32(rng, {hidden}, 0.5, 1.5);
  Tensor beta = randomF32(rng, {hidden});
  std::vector<float> r = rng.vec(rows * hidden);
  K forward = K("layer_norm").f("eps", 1e-3);

  std::vector<Tensor> ins = {x, gamma, Tensor::f32({rows, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, hidden}),
                              Tensor::f32({hidden}), Tensor::f32({hidden})};
  mustRun(K("layer_norm_grad").f("eps", 1e-3), ins, outs);
  for (const Tensor &g : outs)
    requireNonZero(g.f);
  checkGradient(forward, {x, gamma, beta}, 0, {rows, hidden}, r, outs[0].f);
  checkGradient(forward, {x, gamma, beta}, 1, {rows, hidden}, r, outs[1].f);
  checkGradient(forward, {x, gamma, beta}, 2, {rows, hidden}, r, outs[2].f);
}

TEST_CASE("linear gradients", "[kernels][grad]") {
  const int64_t transposeW = GENERATE(0, 1);
  const bool withBias = GENERATE(false, true);
  INFO("transpose_w=" << transposeW << " bias=" << withBias);
  Rng rng(13 + transposeW);
  const int64_t rows = 5, in = 4, out = 3;
  std::vector<int64_t> wShape = transposeW ? std::vector<int64_t>{out, in}
                                           : std::vector<int64_t>{in, out};
  Tensor x = randomF32(rng, {rows, in});
  Tensor w = randomF32(rng, wShape);
  std::vector<Tensor> fwdIns = {x, w};
  if (withBias)
    fwdIns.push_back(randomF32(rng, {out}));
  std::vector<float> r = rng.vec(rows * out);
  K forward = K("linear").i("transpose_w", transposeW);
  Tensor dy = Tensor::f32({rows, out}, r);

  std::vector<Tensor> ins = {dy, w};
  std::vector<Tensor> outs = {Tensor::f32({rows, in})};
  mustRun(K("linear_grad_input").i("transpose_w", transposeW), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, fwdIns, 0, {rows, out}, r, outs[0].f);

  ins = {x, dy};
  outs = {Tensor::f32(wShape)};
  mustRun(K("linear_grad_weight").i("transpose_w", transposeW), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, fwdIns, 1, {rows, out}, r, outs[0].f);

  if (withBias) {
    ins = {dy};
    outs = {Tensor::f32({out})};
    mustRun(K("bias_grad"), ins, outs);
    requireNonZero(outs[0].f);
    checkGradient(forward, fwdIns, 2, {rows, out}, r, outs[0].f);
  }
}

TEST_CASE("gelu_grad is the gradient of gelu", "[kernels][grad]") {
  Rng rng(14);
  Tensor x = randomF32(rng, {3, 7}, -3.0, 3.0);
  std::vector<float> r = rng.vec(21);
  std::vector<Tensor> ins = {x, Tensor::f32({3, 7}, r)};
  std::vector<Tensor> outs = {Tensor::f32({3, 7})};
  mustRun(K("gelu_grad"), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(K("gelu"), {x}, 0, {3, 7}, r, outs[0].f);
}

TEST_CASE("add passes the gradient to both inputs", "[kernels][grad]") {
  // add has no backward kernel: both inputs receive dy unchanged.
  Rng rng(15);
  Tensor a = randomF32(rng, {2, 3}), b = randomF32(rng, {2, 3});
  std::vector<float> r = rng.vec(6);
  checkGradient(K("add"), {a, b}, 0, {2, 3}, r, r);
  checkGradient(K("add"), {a, b}, 1, {2, 3}, r, r);
}

TEST_CASE("attention_grad is the gradient of attention", "[kernels][grad]") {
  Rng rng(16);
  const int64_t batch = 2, seq = 3, heads = 2, hd = 3, hidden = heads * hd;
  const int64_t rows = batch * seq;
  Tensor qkv = randomF32(rng, {rows, 3 * hidden}, -1.5, 1.5);
  std::vector<float> r = rng.vec(rows * hidden);
  K forward = K("attention").i("heads", heads).i("seq", seq);

  std::vector<Tensor> ins = {qkv, Tensor::f32({rows, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, 3 * hidden})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be overwritten
  mustRun(K("attention_grad").i("heads", heads).i("seq", seq), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, {qkv}, 0, {rows, hidden}, r, outs[0].f);
}

TEST_CASE("attention_grad with grouped-query heads and rotary embeddings",
          "[kernels][grad]") {
  struct Config {
    int64_t heads, kv, hd;
    double theta;
  };
  // Llama-style GQA with rope; MQA without rope; the old default (kv_heads
  // and rope_theta absent) with an odd head dim.
  const Config config =
      GENERATE(Config{4, 2, 4, 10000.0}, Config{2, 1, 3, 0.0},
               Config{2, 2, 3, -1.0}, Config{4, 1, 2, 10.0});
  INFO("heads=" << config.heads << " kv_heads=" << config.kv
                << " hd=" << config.hd << " rope_theta=" << config.theta);
  Rng rng(18);
  const int64_t batch = 2, seq = 3, rows = batch * seq;
  const int64_t cols = (config.heads + 2 * config.kv) * config.hd;
  const int64_t width = config.heads * config.hd;
  Tensor qkv = randomF32(rng, {rows, cols}, -1.5, 1.5);
  std::vector<float> r = rng.vec(rows * width);
  K forward = K("attention").i("heads", config.heads).i("seq", seq);
  K backward = K("attention_grad").i("heads", config.heads).i("seq", seq);
  if (config.theta >= 0) { // -1: leave both attributes out
    forward.i("kv_heads", config.kv).f("rope_theta", config.theta);
    backward.i("kv_heads", config.kv).f("rope_theta", config.theta);
  }

  std::vector<Tensor> ins = {qkv, Tensor::f32({rows, width}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, cols})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be overwritten
  mustRun(backward, ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, {qkv}, 0, {rows, width}, r, outs[0].f);
}

TEST_CASE("rms_norm_grad is the gradient of rms_norm", "[kernels][grad]") {
  Rng rng(19);
  const int64_t rows = 4, hidden = 6;
  Tensor x = randomF32(rng, {rows, hidden}, -2.0, 2.0);
  Tensor gamma = randomF32(rng, {hidden}, 0.5, 1.5);
  std::vector<float> r = rng.vec(rows * hidden);
  for (double eps : {1e-3, -1.0}) { // -1: the default eps
    INFO("eps=" << eps);
    K forward("rms_norm"), backward("rms_norm_grad");
    if (eps >= 0) {
      forward.f("eps", eps);
      backward.f("eps", eps);
    }
    std::vector<Tensor> ins = {x, gamma, Tensor::f32({rows, hidden}, r)};
    std::vector<Tensor> outs = {Tensor::f32({rows, hidden}),
                                Tensor::f32({hidden})};
    std::fill(outs[1].f.begin(), outs[1].f.end(), 9.0f); // overwritten
    mustRun(backward, ins, outs);
    for (const Tensor &g : outs)
      requireNonZero(g.f);
    checkGradient(forward, {x, gamma}, 0, {rows, hidden}, r, outs[0].f);
    checkGradient(forward, {x, gamma}, 1, {rows, hidden}, r, outs[1].f);
  }
}

TEST_CASE("swiglu_grad is the gradient of swiglu", "[kernels][grad]") {
  Rng rng(20);
  const int64_t rows = 3, width = 5;
  Tensor gateUp = randomF32(rng, {rows, 2 * width}, -4.0, 4.0);
  std::vector<float> r = rng.vec(rows * width);
  std::vector<Tensor> ins = {gateUp, Tensor::f32({rows, width}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, 2 * width})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be overwritten
  mustRun(K("swiglu_grad"), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(K("swiglu"), {gateUp}, 0, {rows, width}, r, outs[0].f);
}

TEST_CASE("cross_entropy_grad is the gradient of scale * cross_entropy",
          "[kernels][grad]") {
  Rng rng(17);
  const int64_t rows = 4, vocab = 5;
  Tensor logits = randomF32(rng, {rows, vocab}, -2.0, 2.0);
  Tensor targets = Tensor::i32({2, 2}, {0, 4, 2, 4});
  const double scale = 2.5;

  std::vector<Tensor> ins = {logits, targets};
  std::vector<Tensor> outs = {Tensor::f32({rows, vocab})};
  mustRun(K("cross_entropy_grad").f("scale", scale), ins, outs);
  requireNonZero(outs[0].f);
  for (int64_t n = 0; n < rows; ++n) {
    double rowSum = 0;
    for (int64_t j = 0; j < vocab; ++j)
      rowSum += outs[0].f[n * vocab + j];
    CHECK(rowSum == Approx(0.0).margin(1e-6)); // softmax minus one-hot
  }
  checkGradient(K("cross_entropy"), {logits, targets}, 0, {}, {float(scale)},
                outs[0].f);
}

// ---------------------------------------------------------------------------
// State and optimizer kernels.

TEST_CASE("accumulate adds in place and zero clears", "[kernels][state]") {
  std::vector<Tensor> ins = {Tensor::f32({3}, {1, 2, 3})};
  std::vector<Tensor> outs = {Tensor::f32({3}, {10, 20, 30})};
  mustRun(K("accumulate"), ins, outs);
  mustRun(K("accumulate"), ins, outs);
  CHECK(outs[0].f == std::vector<float>{12, 24, 36});

  std::vector<Tensor> none;
  mustRun(K("zero"), none, outs);
  CHECK(outs[0].f == std::vector<float>{0, 0, 0});
  std::vector<Tensor> ints = {Tensor::i32({2}, {4, 5})};
  mustRun(K("zero"), none, ints);
  CHECK(ints[0].i == std::vector<int32_t>{0, 0});
}

TEST_CASE("adamw matches a double-precision AdamW over three steps",
          "[kernels][state]") {
  const double lr = 0.1, beta1 = 0.8, beta2 = 0.9, eps = 1e-6, wd = 0.05;
  const std::vector<std::vector<double>> grads = {
      {0.5, -1.0, 0.0, 2.0}, {0.25, 1.0, -0.5, 2.0}, {-0.75, 0.5, 0.1, -1.0}};
  std::vector<double> p = {1.0, -2.0, 0.5, 0.0}, m(4, 0.0), v(4, 0.0);

  std::vector<Tensor> outs = {Tensor::f32({2, 2}, {1.0f, -2.0f, 0.5f, 0.0f}),
                              Tensor::f32({2, 2}), Tensor::f32({2, 2})};
  K kernel = K("adamw")
                 .f("lr", lr)
                 .f("beta1", beta1)
                 .f("beta2", beta2)
                 .f("eps", eps)
                 .f("weight_decay", wd);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<double> &g = grads[step - 1];
    for (int i = 0; i < 4; ++i) {
      p[i] -= lr * wd * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      double mhat = m[i] / (1 - std::pow(beta1, step));
      double vhat = v[i] / (1 - std::pow(beta2, step));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
    std::vector<Tensor> ins = {Tensor::f32(
        {2, 2}, {float(g[0]), float(g[1]), float(g[2]), float(g[3])})};
    KernelContext ctx;
    ctx.step = step;
    REQUIRE(run(kernel, ins, outs, ctx).isOk());
  }
  for (int i = 0; i < 4; ++i) {
    INFO("element " << i);
    CHECK(outs[0].f[i] == Approx(p[i]).margin(1e-6));
    CHECK(outs[1].f[i] == Approx(m[i]).margin(1e-6));
    CHECK(outs[2].f[i] == Approx(v[i]).margin(1e-6));
  }
}

TEST_CASE("adamw defaults follow the spec", "[kernels][state]") {
  // With only lr given: beta1 0.9, beta2 0.95, eps 1e-8, no weight decay. The
  // first bias-corrected step moves every parameter by lr * sign(g).
  std::vector<Tensor> ins = {Tensor::f32({3}, {0.3f, -2.0f, 0.0f})};
  std::vector<Tensor> outs = {Tensor::f32({3}, {1, 1, 1}), Tensor::f32({3}),
                              Tensor::f32({3})};
  mustRun(K("adamw").f("lr", 0.01), ins, outs);
  CHECK(outs[0].f[0] == Approx(0.99).margin(1e-6));
  CHECK(outs[0].f[1] == Approx(1.01).margin(1e-6));
  CHECK(outs[0].f[2] == 1.0f);
  CHECK(outs[1].f[0] == Approx(0.1 * 0.3));
  CHECK(outs[2].f[1] == Approx(0.05 * 4.0));
}

// ---------------------------------------------------------------------------
// Error paths: every bad input is a Status, never a crash.

TEST_CASE("unknown kernels are rejected", "[kernels][errors]") {
  std::vector<Tensor> none;
  Status s = run(K("conv2d"), none, none);
  REQUIRE_FALSE(s.isOk());
  CHECK(s.message() == "unknown kernel 'conv2d'");
}

TEST_CASE("every kernel rejects missing or extra operands",
          "[kernels][errors]") {
  for (const std::string &name : kernelNames()) {
    mustFail(K(name), {}, {});
    std::vector<Tensor> many(5, Tensor::f32({2, 2}));
    mustFail(K(name), many, many);
  }
}

TEST_CASE("wrong shapes are rejected", "[kernels][errors]") {
  CHECK(mustFail(K("linear"), {Tensor::f32({2, 3}), Tensor::f32({4, 5})},
                 {Tensor::f32({2, 5})}) ==
        "linear: w has shape [4,5], expected [3,*] (transpose_w=0)");
  mustFail(K("linear"), {Tensor::f32({2, 3}), Tensor::f32({3, 5})},
           {Tensor::f32({2, 4})});
  mustFail(K("linear"),
           {Tensor::f32({2, 3}), Tensor::f32({3, 5}), Tensor::f32({4})},
           {Tensor::f32({2, 5})});
  mustFail(K("linear").i("transpose_w", 1),
           {Tensor::f32({2, 3}), Tensor::f32({3, 5})}, {Tensor::f32({2, 3})});
  mustFail(K("linear").i("transpose_w", 2),
           {Tensor::f32({2, 3}), Tensor::f32({3, 5})}, {Tensor::f32({2, 5})});
  mustFail(K("linear_grad_input"), {Tensor::f32({2, 4}), Tensor::f32({3, 5})},
           {Tensor::f32({2, 3})});
  mustFail(K("linear_grad_weight"), {Tensor::f32({2, 3}), Tensor::f32({3, 5})},
           {Tensor::f32({3, 5})});
  mustFail(K("linear_grad_weight").i("transpose_w", 1),
           {Tensor::f32({2, 3}), Tensor::f32({2, 5})}, {Tensor::f32({3, 5})});
  mustFail(K("bias_grad"), {Tensor::f32({2, 3})}, {Tensor::f32({2})});
  mustFail(K("layer_norm"),
           {Tensor::f32({2, 3}), Tensor::f32({3}), Tensor::f32({2})},
           {Tensor::f32({2, 3})});
  mustFail(K("layer_norm_grad"),
           {Tensor::f32({2, 3}), Tensor::f32({3}), Tensor::f32({2, 3})},
           {Tensor::f32({2, 3}), Tensor::f32({3}), Tensor::f32({4})});
  mustFail(K("add"), {Tensor::f32({2, 3}), Tensor::f32({3, 2})},
           {Tensor::f32({2, 3})});
  mustFail(K("gelu"), {Tensor::f32({4})}, {Tensor::f32({2, 2})});
  mustFail(K("gelu_grad"), {Tensor::f32({4}), Tensor::f32({3})},
           {Tensor::f32({4})});
  mustFail(K("embedding"),
           {Tensor::i32({2, 2}, {0, 0, 0, 0}), Tensor::f32({3, 2})},
           {Tensor::f32({4, 3})});
  mustFail(K("embedding_grad").i("vocab", 4),
           {Tensor::i32({2}, {0, 0}), Tensor::f32({2, 2})},
           {Tensor::f32({3, 2})});
  mustFail(K("position_add").i("seq", 4),
           {Tensor::f32({4, 2}), Tensor::f32({3, 2})}, {Tensor::f32({4, 2})});
  mustFail(K("position_add").i("seq", 3),
           {Tensor::f32({4, 2}), Tensor::f32({3, 2})}, {Tensor::f32({4, 2})});
  mustFail(K("position_add").i("seq", 2),
           {Tensor::f32({4, 2}), Tensor::f32({3, 2})});
  mustFail(K("position_add_grad").i("seq", 2), {Tensor::f32({4, 2})},
           {Tensor::f32({1, 2})});
  mustFail(K("attention").i("heads", 4).i("seq", 2), {Tensor::f32({4, 18})},
           {Tensor::f32({4, 6})});
  mustFail(K("attention").i("heads", 2).i("seq", 3), {Tensor::f32({4, 18})},
           {Tensor::f32({4, 6})});
  mustFail(K("attention").i("heads", 2).i("seq", 2), {Tensor::f32({4, 17})},
           {Tensor::f32({4, 6})});
  mustFail(K("attention_grad").i("heads", 2).i("seq", 2),
           {Tensor::f32({4, 18}), Tensor::f32({4, 5})}, {Tensor::f32({4, 18})});
  mustFail(K("cross_entropy"),
           {Tensor::f32({3, 4}), Tensor::i32({1, 2}, {0, 0})},
           {Tensor::f32({})});
  mustFail(K("cross_entropy"),
           {Tensor::f32({2, 4}), Tensor::i32({1, 2}, {0, 0})},
           {Tensor::f32({2})});
  mustFail(K("cross_entropy_grad"),
           {Tensor::f32({2, 4}), Tensor::i32({1, 2}, {0, 0})},
           {Tensor::f32({2, 3})});
  mustFail(K("accumulate"), {Tensor::f32({3})}, {Tensor::f32({4})});
  mustFail(K("adamw").f("lr", 0.1), {Tensor::f32({3})},
           {Tensor::f32({3}), Tensor::f32({3}), Tensor::f32({2})});
}

TEST_CASE("wrong dtypes are rejected", "[kernels][errors]") {
  CHECK(mustFail(K("embedding"), {Tensor::f32({1, 2}), Tensor::f32({3, 2})},
                 {Tensor::f32({2, 2})}) ==
        "embedding: ids must be i32, got f32");
  mustFail(
      K("embedding"),
      {Tensor::i32({1, 2}, {0, 0}), Tensor::i32({3, 2}, {0, 0, 0, 0, 0, 0})},
      {Tensor::f32({2, 2})});
  mustFail(K("layer_norm"),
           {Tensor::i32({1, 2}, {1, 2}), Tensor::f32({2}), Tensor::f32({2})},
           {Tensor::f32({1, 2})});
  mustFail(K("cross_entropy"), {Tensor::f32({2, 3}), Tensor::f32({1, 2})},
           {Tensor::f32({})});
  mustFail(K("add"), {Tensor::f32({2}), Tensor::i32({2}, {1, 2})},
           {Tensor::f32({2})});
  mustFail(K("gelu"), {Tensor::f32({2})}, {Tensor::i32({2}, {0, 0})});
  Tensor unspecified = Tensor::f32({2});
  unspecified.dtype = plan::DTYPE_UNSPECIFIED;
  mustFail(K("zero"), {}, {unspecified});
}

TEST_CASE("rms_norm and swiglu reject bad operands", "[kernels][errors]") {
  CHECK(mustFail(K("rms_norm"), {Tensor::f32({2, 3}), Tensor::f32({2})},
                 {Tensor::f32({2, 3})}) ==
        "rms_norm: gamma has shape [2], expected [3]");
  mustFail(K("rms_norm"), {Tensor::f32({2, 3}), Tensor::f32({3})},
           {Tensor::f32({3, 2})});
  mustFail(K("rms_norm"), {Tensor::f32({6}), Tensor::f32({6})},
           {Tensor::f32({6})});
  mustFail(K("rms_norm"),
           {Tensor::i32({1, 2}, {1, 2}), Tensor::f32({2})},
           {Tensor::f32({1, 2})});
  CHECK(mustFail(K("rms_norm").f("eps", -1.0),
                 {Tensor::f32({1, 2}), Tensor::f32({2})},
                 {Tensor::f32({1, 2})}) ==
        "rms_norm: attribute 'eps' must not be negative");
  mustFail(K("rms_norm").s("eps", "small"),
           {Tensor::f32({1, 2}), Tensor::f32({2})}, {Tensor::f32({1, 2})});
  // rms_norm has no beta: three inputs is layer_norm's signature.
  CHECK(mustFail(K("rms_norm"),
                 {Tensor::f32({1, 2}), Tensor::f32({2}), Tensor::f32({2})},
                 {Tensor::f32({1, 2})}) ==
        "rms_norm: expected 2 inputs, got 3");
  mustFail(K("rms_norm_grad"),
           {Tensor::f32({2, 3}), Tensor::f32({3}), Tensor::f32({2, 3})},
           {Tensor::f32({2, 3}), Tensor::f32({2})});
  mustFail(K("rms_norm_grad"),
           {Tensor::f32({2, 3}), Tensor::f32({3}), Tensor::f32({3, 2})},
           {Tensor::f32({2, 3}), Tensor::f32({3})});
  CHECK(mustFail(K("rms_norm_grad"),
                 {Tensor::f32({2, 3}), Tensor::f32({3}), Tensor::f32({2, 3})},
                 {Tensor::f32({2, 3}), Tensor::f32({3}),
                  Tensor::f32({3})}) ==
        "rms_norm_grad: expected 2 outputs, got 3");

  CHECK(mustFail(K("swiglu"), {Tensor::f32({2, 5})}, {Tensor::f32({2, 2})}) ==
        "swiglu: gate_up has shape [2,5], expected an even number of columns "
        "[gate | up]");
  CHECK(mustFail(K("swiglu"), {Tensor::f32({2, 6})}, {Tensor::f32({2, 6})}) ==
        "swiglu: y has shape [2,6], expected [2,3]");
  mustFail(K("swiglu"), {Tensor::f32({12})}, {Tensor::f32({6})});
  mustFail(K("swiglu"), {Tensor::i32({1, 2}, {1, 2})}, {Tensor::f32({1, 1})});
  mustFail(K("swiglu_grad"), {Tensor::f32({2, 6}), Tensor::f32({2, 6})},
           {Tensor::f32({2, 6})});
  mustFail(K("swiglu_grad"), {Tensor::f32({2, 6}), Tensor::f32({2, 3})},
           {Tensor::f32({2, 3})});
  mustFail(K("swiglu_grad"), {Tensor::f32({2, 7}), Tensor::f32({2, 3})},
           {Tensor::f32({2, 7})});
}

TEST_CASE("attention rejects bad kv_heads, rope_theta and widths",
          "[kernels][errors]") {
  // heads 4, kv_heads 2, hd 2: qkv [N, 16], y [N, 8].
  Tensor qkv = Tensor::f32({4, 16});
  Tensor y = Tensor::f32({4, 8});
  K good = K("attention").i("heads", 4).i("kv_heads", 2).i("seq", 2);
  {
    std::vector<Tensor> ins = {qkv}, outs = {y};
    mustRun(good, ins, outs);
  }
  CHECK(mustFail(K("attention").i("heads", 4).i("kv_heads", 3).i("seq", 2),
                 {qkv}, {y}) ==
        "attention: attribute 'heads' 4 is not a multiple of 'kv_heads' 3");
  mustFail(K("attention").i("heads", 2).i("kv_heads", 4).i("seq", 2),
           {Tensor::f32({4, 20})}, {Tensor::f32({4, 4})});
  CHECK(mustFail(K("attention").i("heads", 4).i("kv_heads", 0).i("seq", 2),
                 {qkv}, {y}) ==
        "attention: attribute 'kv_heads' must be positive, got 0");
  mustFail(K("attention").i("heads", 4).f("kv_heads", 1.5).i("seq", 2), {qkv},
           {y});
  // The multi-head width without kv_heads, and the GQA width with the wrong
  // kv_heads.
  CHECK(mustFail(K("attention").i("heads", 4).i("seq", 2), {qkv}, {y}) ==
        "attention: qkv has 16 columns, expected (heads 4 + 2 * kv_heads 4) "
        "* head dim 2");
  mustFail(K("attention").i("heads", 4).i("kv_heads", 1).i("seq", 2), {qkv},
           {y});
  CHECK(mustFail(good, {qkv}, {Tensor::f32({4, 6})}) ==
        "attention: y has 6 columns, expected a positive multiple of heads 4");
  mustFail(good, {qkv}, {Tensor::f32({4, 0})});
  CHECK(mustFail(good, {qkv}, {Tensor::f32({2, 8})}) ==
        "attention: y has shape [2,8], expected [4,*]");
  mustFail(good, {qkv}, {Tensor::f32({32})});

  CHECK(mustFail(K(good).f("rope_theta", -10000.0), {qkv}, {y}) ==
        "attention: attribute 'rope_theta' must not be negative");
  mustFail(K(good).s("rope_theta", "10000"), {qkv}, {y});
  mustFail(K(good).f("rope_theta", std::nan("")), {qkv}, {y});
  // hd = 3 is fine without rotary embeddings, not with them.
  std::vector<Tensor> oddIns = {Tensor::f32({2, 9})};
  std::vector<Tensor> oddOuts = {Tensor::f32({2, 3})};
  mustRun(K("attention").i("heads", 1).i("seq", 2), oddIns, oddOuts);
  CHECK(mustFail(K("attention").i("heads", 1).i("seq", 2).f("rope_theta",
                                                           10000.0),
                 oddIns, oddOuts) ==
        "attention: head dim 3 must be even for rotary embeddings");

  K goodGrad = K("attention_grad").i("heads", 4).i("kv_heads", 2).i("seq", 2);
  {
    std::vector<Tensor> ins = {qkv, y}, outs = {qkv};
    mustRun(goodGrad, ins, outs);
  }
  mustFail(goodGrad, {qkv, y}, {Tensor::f32({4, 24})});
  mustFail(goodGrad, {qkv, Tensor::f32({4, 12})}, {qkv});
  mustFail(K(goodGrad).i("kv_heads", 3), {qkv, y}, {qkv});
  mustFail(K("attention_grad").i("heads", 1).i("seq", 2).f("rope_theta", 1e4),
           {Tensor::f32({2, 9}), Tensor::f32({2, 3})}, {Tensor::f32({2, 9})});

  // Zero rows: nothing to compute, however long the sequence.
  std::vector<Tensor> emptyIns = {Tensor::f32({0, 16})};
  std::vector<Tensor> emptyOuts = {Tensor::f32({0, 8})};
  mustRun(K(good).i("seq", 1 << 30).f("rope_theta", 1e4), emptyIns, emptyOuts);
}

TEST_CASE("token ids out of range are rejected", "[kernels][errors]") {
  Tensor table = Tensor::f32({5, 2});
  CHECK(mustFail(K("embedding"), {Tensor::i32({1, 2}, {0, 5}), table},
                 {Tensor::f32({2, 2})}) ==
        "embedding: ids[1] = 5 is out of range [0, 5)");
  mustFail(K("embedding"), {Tensor::i32({1, 2}, {-1, 0}), table},
           {Tensor::f32({2, 2})});
  mustFail(K("embedding_grad").i("vocab", 5),
           {Tensor::i32({1, 2}, {0, 7}), Tensor::f32({2, 2})},
           {Tensor::f32({5, 2})});
  mustFail(K("cross_entropy"),
           {Tensor::f32({2, 3}), Tensor::i32({1, 2}, {0, 3})},
           {Tensor::f32({})});
  mustFail(K("cross_entropy_grad"),
           {Tensor::f32({2, 3}), Tensor::i32({1, 2}, {-2, 0})},
           {Tensor::f32({2, 3})});
}

TEST_CASE("bad attributes and context are rejected", "[kernels][errors]") {
  Tensor qkv = Tensor::f32({2, 6});
  CHECK(mustFail(K("attention").i("seq", 2), {qkv}, {Tensor::f32({2, 2})}) ==
        "attention: missing attribute 'heads'");
  mustFail(K("attention").i("heads", 0).i("seq", 2), {qkv},
           {Tensor::f32({2, 2})});
  mustFail(K("attention").s("heads", "one").i("seq", 2), {qkv},
           {Tensor::f32({2, 2})});
  mustFail(K("attention").f("heads", 1.5).i("seq", 2), {qkv},
           {Tensor::f32({2, 2})});
  mustFail(K("position_add"), {Tensor::f32({2, 2}), Tensor::f32({2, 2})},
           {Tensor::f32({2, 2})});
  mustFail(K("layer_norm").f("eps", -1.0),
           {Tensor::f32({1, 2}), Tensor::f32({2}), Tensor::f32({2})},
           {Tensor::f32({1, 2})});

  mustFail(K("loss_accumulate").f("scale", 1.0), {Tensor::f32({})}, {});
  mustFail(K("loss_accumulate"), {Tensor::f32({2})}, {});

  std::vector<Tensor> adamOuts = {Tensor::f32({2}), Tensor::f32({2}),
                                  Tensor::f32({2})};
  CHECK(mustFail(K("adamw"), {Tensor::f32({2})}, adamOuts) ==
        "adamw: missing attribute 'lr'");
  mustFail(K("adamw").f("lr", 0.1).f("beta2", 1.0), {Tensor::f32({2})},
           adamOuts);
  std::vector<Tensor> grad = {Tensor::f32({2})};
  KernelContext ctx;
  ctx.step = 0;
  Status s = run(K("adamw").f("lr", 0.1), grad, adamOuts, ctx);
  REQUIRE_FALSE(s.isOk());
  CHECK(s.message() == "adamw: step must be at least 1, got 0");
}

TEST_CASE("bad storage is rejected before any kernel runs",
          "[kernels][errors]") {
  KernelContext ctx;
  Tensor x = Tensor::f32({2, 2});
  TensorRef good = x.ref();
  TensorRef negative = good;
  negative.shape = {-2, -2};
  TensorRef missing = good;
  missing.data = nullptr;
  Status s = runKernel(K("gelu"), {negative}, {good}, ctx);
  REQUIRE_FALSE(s.isOk());
  CHECK(s.message().rfind("gelu: input 0 has negative dimension", 0) == 0);
  s = runKernel(K("gelu"), {good}, {missing}, ctx);
  REQUIRE_FALSE(s.isOk());
  CHECK(s.message() == "gelu: output 0 has no storage");
}

TEST_CASE("empty batches are handled without touching memory",
          "[kernels][errors]") {
  // Zero rows: linear and its gradients produce empty or zero results.
  std::vector<Tensor> ins = {Tensor::f32({0, 3}), Tensor::f32({3, 2})};
  std::vector<Tensor> outs = {Tensor::f32({0, 2})};
  mustRun(K("linear"), ins, outs);
  ins = {Tensor::f32({0, 3}), Tensor::f32({0, 2})};
  outs = {Tensor::f32({3, 2}, {1, 1, 1, 1, 1, 1})};
  mustRun(K("linear_grad_weight"), ins, outs);
  CHECK(outs[0].f == std::vector<float>(6, 0.0f));
  // The mean over zero rows is undefined.
  mustFail(K("cross_entropy"), {Tensor::f32({0, 3}), Tensor::i32({0, 1}, {})},
           {Tensor::f32({})});
}

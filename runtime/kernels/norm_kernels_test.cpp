// The CPU norm kernels: layer_norm, rms_norm and qk_norm, forward and
// their split backward (input and weight gradients).
#include "runtime/kernels/kernels_test_util.h"

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

namespace {

/// Equal bytes: stricter than ==, which takes -0 for +0.
bool sameBits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// `op` with attribute eps, or without (the default) when eps < 0.
K withEps(const std::string &op, double eps) {
  K k(op);
  if (eps >= 0)
    k.f("eps", eps);
  return k;
}

/// The backward of layer_norm (rms = false) or rms_norm (rms = true) in
/// double: dx, dgamma and (layer_norm only) dbeta.
void refNormBackward(bool rms, const std::vector<float> &x,
                     const std::vector<float> &gamma,
                     const std::vector<float> &dy, int64_t rows, int64_t hidden,
                     double eps, std::vector<double> &dx,
                     std::vector<double> &dgamma, std::vector<double> &dbeta) {
  dx.assign(rows * hidden, 0.0);
  dgamma.assign(hidden, 0.0);
  dbeta.assign(hidden, 0.0);
  for (int64_t n = 0; n < rows; ++n) {
    const float *xr = x.data() + n * hidden, *dyr = dy.data() + n * hidden;
    double mean = 0, sq = 0;
    for (int64_t j = 0; j < hidden; ++j)
      mean += xr[j];
    mean = rms ? 0.0 : mean / hidden;
    for (int64_t j = 0; j < hidden; ++j)
      sq += (xr[j] - mean) * (xr[j] - mean);
    double r = 1.0 / std::sqrt(sq / hidden + eps);
    double gMean = 0, gxMean = 0;
    for (int64_t j = 0; j < hidden; ++j) {
      double xhat = (xr[j] - mean) * r, g = double(dyr[j]) * gamma[j];
      gMean += g / hidden;
      gxMean += g * xhat / hidden;
      dgamma[j] += dyr[j] * xhat;
      dbeta[j] += dyr[j];
    }
    for (int64_t j = 0; j < hidden; ++j) {
      double xhat = (xr[j] - mean) * r, g = double(dyr[j]) * gamma[j];
      dx[n * hidden + j] = r * (g - (rms ? 0.0 : gMean) - xhat * gxMean);
    }
  }
}

void checkNear(const std::vector<float> &got, const std::vector<double> &want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(got[i] - want[i]) <= 1e-5 * (1.0 + std::fabs(want[i])));
  }
}

/// Runs NORM_grad_input and NORM_grad_weight on x, gamma, dy and checks them
/// against refNormBackward, and dx against the same kernel run row by row.
void checkSplitNormBackward(const std::string &norm, int64_t rows,
                            int64_t hidden, double eps, uint64_t seed) {
  const bool rms = norm == "rms_norm";
  INFO(norm << " shape [" << rows << "," << hidden << "] eps=" << eps);
  Rng rng(seed);
  Tensor x = randomF32(rng, {rows, hidden}, -3.0, 3.0);
  Tensor gamma = randomF32(rng, {hidden}, -1.5, 1.5);
  Tensor dy = randomF32(rng, {rows, hidden}, -2.0, 2.0);

  std::vector<Tensor> ins = {x, gamma, dy};
  std::vector<Tensor> dx = {Tensor::f32({rows, hidden})};
  std::fill(dx[0].f.begin(), dx[0].f.end(), 7.0f); // overwritten
  mustRun(withEps(norm + "_grad_input", eps), ins, dx);

  std::vector<Tensor> wins = {x, dy};
  std::vector<Tensor> dw = {Tensor::f32({hidden})};
  if (!rms)
    dw.push_back(Tensor::f32({hidden}));
  for (Tensor &t : dw)
    std::fill(t.f.begin(), t.f.end(), 7.0f); // overwritten, even for N = 0
  mustRun(withEps(norm + "_grad_weight", eps), wins, dw);

  std::vector<double> refDx, refDgamma, refDbeta;
  refNormBackward(rms, x.f, gamma.f, dy.f, rows, hidden,
                  eps >= 0 ? eps : (rms ? 1e-6 : 1e-5), refDx, refDgamma,
                  refDbeta);
  checkNear(dx[0].f, refDx);
  checkNear(dw[0].f, refDgamma);
  if (!rms)
    checkNear(dw[1].f, refDbeta);

  // Rows are independent: one row at a time gives the same bits.
  std::vector<float> byRow;
  for (int64_t n = 0; n < rows; ++n) {
    auto row = [&](const Tensor &t) {
      return Tensor::f32({1, hidden},
                         std::vector<float>(t.f.begin() + n * hidden,
                                            t.f.begin() + (n + 1) * hidden));
    };
    std::vector<Tensor> rowIns = {row(x), gamma, row(dy)};
    std::vector<Tensor> rowDx = {Tensor::f32({1, hidden})};
    mustRun(withEps(norm + "_grad_input", eps), rowIns, rowDx);
    byRow.insert(byRow.end(), rowDx[0].f.begin(), rowDx[0].f.end());
  }
  CHECK(sameBits(dx[0].f, byRow));
}

} // namespace

TEST_CASE("split norm gradients match a double-precision reference on edge "
          "shapes",
          "[kernels][grad]") {
  const std::vector<int64_t> shape =
      GENERATE(std::vector<int64_t>{4, 6}, std::vector<int64_t>{9, 37},
               std::vector<int64_t>{1, 1}, std::vector<int64_t>{0, 5},
               std::vector<int64_t>{3, 0}, std::vector<int64_t>{300, 17});
  const double eps = GENERATE(-1.0, 1e-3, 0.25); // -1: the default eps
  const int64_t rows = shape[0], hidden = shape[1];
  checkSplitNormBackward("layer_norm", rows, hidden, eps,
                         uint64_t(100 + rows * 1000 + hidden));
  checkSplitNormBackward("rms_norm", rows, hidden, eps,
                         uint64_t(200 + rows * 1000 + hidden));
}

TEST_CASE("layer_norm_grad_input and layer_norm_grad_weight are the "
          "gradients of layer_norm",
          "[kernels][grad]") {
  Rng rng(31);
  const int64_t rows = 4, hidden = 6;
  Tensor x = randomF32(rng, {rows, hidden}, -2.0, 2.0);
  Tensor gamma = randomF32(rng, {hidden}, 0.5, 1.5);
  Tensor beta = randomF32(rng, {hidden});
  std::vector<float> r = rng.vec(rows * hidden);
  for (double eps : {1e-3, -1.0}) { // -1: the default eps
    INFO("eps=" << eps);
    K forward = withEps("layer_norm", eps);
    std::vector<Tensor> ins = {x, gamma, Tensor::f32({rows, hidden}, r)};
    std::vector<Tensor> dx = {Tensor::f32({rows, hidden})};
    mustRun(withEps("layer_norm_grad_input", eps), ins, dx);
    std::vector<Tensor> wins = {x, Tensor::f32({rows, hidden}, r)};
    std::vector<Tensor> dw = {Tensor::f32({hidden}), Tensor::f32({hidden})};
    mustRun(withEps("layer_norm_grad_weight", eps), wins, dw);
    requireNonZero(dx[0].f);
    for (const Tensor &g : dw)
      requireNonZero(g.f);
    checkGradient(forward, {x, gamma, beta}, 0, {rows, hidden}, r, dx[0].f);
    checkGradient(forward, {x, gamma, beta}, 1, {rows, hidden}, r, dw[0].f);
    checkGradient(forward, {x, gamma, beta}, 2, {rows, hidden}, r, dw[1].f);
  }
}

TEST_CASE("rms_norm_grad_input and rms_norm_grad_weight are the gradients "
          "of rms_norm",
          "[kernels][grad]") {
  Rng rng(32);
  const int64_t rows = 4, hidden = 6;
  Tensor x = randomF32(rng, {rows, hidden}, -2.0, 2.0);
  Tensor gamma = randomF32(rng, {hidden}, 0.5, 1.5);
  std::vector<float> r = rng.vec(rows * hidden);
  for (double eps : {1e-3, -1.0}) { // -1: the default eps
    INFO("eps=" << eps);
    K forward = withEps("rms_norm", eps);
    std::vector<Tensor> ins = {x, gamma, Tensor::f32({rows, hidden}, r)};
    std::vector<Tensor> dx = {Tensor::f32({rows, hidden})};
    mustRun(withEps("rms_norm_grad_input", eps), ins, dx);
    std::vector<Tensor> wins = {x, Tensor::f32({rows, hidden}, r)};
    std::vector<Tensor> dw = {Tensor::f32({hidden})};
    mustRun(withEps("rms_norm_grad_weight", eps), wins, dw);
    requireNonZero(dx[0].f);
    requireNonZero(dw[0].f);
    checkGradient(forward, {x, gamma}, 0, {rows, hidden}, r, dx[0].f);
    checkGradient(forward, {x, gamma}, 1, {rows, hidden}, r, dw[0].f);
  }
}

TEST_CASE("qk_norm is rms_norm on each q and k head, v copied", "[kernels]") {
  // 2 rows of heads 4, kv_heads 2, hd 3: q heads 0-3 with gamma[0:3], k
  // heads 4-5 with gamma[3:6], v heads 6-7 untouched. Each head is checked
  // against the rms_norm kernel on that head alone.
  Rng rng(41);
  const int64_t rows = 2, heads = 4, kv = 2, hd = 3, g = heads + 2 * kv;
  Tensor x = randomF32(rng, {rows, g * hd}, -2.0, 2.0);
  Tensor gamma = randomF32(rng, {2 * hd}, 0.5, 1.5);
  std::vector<Tensor> ins = {x, gamma};
  std::vector<Tensor> outs = {Tensor::f32({rows, g * hd})};
  mustRun(K("qk_norm").i("heads", heads).i("kv_heads", kv).f("eps", 1e-3), ins,
          outs);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t j = 0; j < g; ++j) {
      INFO("row " << n << " head " << j);
      const float *xr = x.f.data() + (n * g + j) * hd;
      const float *yr = outs[0].f.data() + (n * g + j) * hd;
      if (j >= heads + kv) {
        for (int64_t t = 0; t < hd; ++t)
          CHECK(yr[t] == xr[t]);
        continue;
      }
      const int64_t c = j < heads ? 0 : 1;
      std::vector<Tensor> one = {
          Tensor::f32({1, hd}, std::vector<float>(xr, xr + hd)),
          Tensor::f32({hd},
                      std::vector<float>(gamma.f.begin() + c * hd,
                                         gamma.f.begin() + (c + 1) * hd))};
      std::vector<Tensor> want = {Tensor::f32({1, hd})};
      mustRun(K("rms_norm").f("eps", 1e-3), one, want);
      for (int64_t t = 0; t < hd; ++t)
        CHECK(yr[t] == want[0].f[t]);
    }
}

TEST_CASE("qk_norm_grad_input and qk_norm_grad_weight are the gradients of "
          "qk_norm",
          "[kernels][grad]") {
  Rng rng(42);
  // kv_heads given (grouped-query) and left out (= heads).
  for (int64_t kv : {1, 0}) {
    const int64_t rows = 3, heads = 2, hd = 4;
    const int64_t g = heads + 2 * (kv ? kv : heads);
    INFO("kv_heads=" << kv);
    auto attrs = [&](const std::string &op) {
      K k(op);
      k.i("heads", heads).f("eps", 1e-3);
      if (kv)
        k.i("kv_heads", kv);
      return k;
    };
    Tensor x = randomF32(rng, {rows, g * hd}, -2.0, 2.0);
    Tensor gamma = randomF32(rng, {2 * hd}, 0.5, 1.5);
    std::vector<float> r = rng.vec(rows * g * hd);
    std::vector<Tensor> ins = {x, gamma, Tensor::f32({rows, g * hd}, r)};
    std::vector<Tensor> dx = {Tensor::f32({rows, g * hd})};
    mustRun(attrs("qk_norm_grad_input"), ins, dx);
    std::vector<Tensor> wins = {x, Tensor::f32({rows, g * hd}, r)};
    std::vector<Tensor> dw = {Tensor::f32({2 * hd})};
    mustRun(attrs("qk_norm_grad_weight"), wins, dw);
    requireNonZero(dx[0].f);
    requireNonZero(dw[0].f);
    checkGradient(attrs("qk_norm"), {x, gamma}, 0, {rows, g * hd}, r, dx[0].f);
    checkGradient(attrs("qk_norm"), {x, gamma}, 1, {rows, g * hd}, r, dw[0].f);
  }
}

TEST_CASE("qk_norm rejects bad operands and attributes", "[kernels][errors]") {
  CHECK(mustFail(K("qk_norm"), {Tensor::f32({2, 6}), Tensor::f32({2})},
                 {Tensor::f32({2, 6})}) ==
        "qk_norm: missing attribute 'heads'");
  CHECK(mustFail(K("qk_norm").i("heads", 2).i("kv_heads", 0),
                 {Tensor::f32({2, 6}), Tensor::f32({2})}, {Tensor::f32({2, 6})})
            .find("kv_heads") != std::string::npos);
  CHECK(mustFail(K("qk_norm").i("heads", 2),
                 {Tensor::f32({2, 12}), Tensor::f32({3})},
                 {Tensor::f32({2, 12})}) ==
        "qk_norm: gamma has shape [3], expected [4]");
  CHECK(mustFail(K("qk_norm").i("heads", 2).f("eps", -1.0),
                 {Tensor::f32({2, 12}), Tensor::f32({4})},
                 {Tensor::f32({2, 12})}) ==
        "qk_norm: attribute 'eps' must not be negative");
  CHECK(mustFail(K("qk_norm_grad_weight").i("heads", 2),
                 {Tensor::f32({2, 12}), Tensor::f32({2, 6})},
                 {Tensor::f32({4})}) ==
        "qk_norm_grad_weight: dy has shape [2,6], expected [2,12]");
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

// The CPU attention kernels: causal grouped-query attention with rotary
// embeddings and its gradient, ring attention's steps and Ulysses'
// layouts (context parallelism), Llama 3.1's rotary scaling.
#include "runtime/kernels/kernels_test_util.h"

TEST_CASE("attention on one and two tokens", "[kernels][forward]") {
  // One head, hd = 2. Rows are [q | k | v].
  SECTION("a single token attends only to itself") {
    std::vector<Tensor> ins = {Tensor::f32({1, 6}, {3, -1, 2, 5, 7, 8})};
    std::vector<Tensor> outs = attentionOuts(1, 2, 1);
    mustRun(K("attention").i("heads", 1).i("seq", 1), ins, outs);
    CHECK(outs[0].f == std::vector<float>{7, 8});
    // One score, q.k / sqrt(2) = 1 / sqrt(2): its log-sum-exp is itself.
    // The score is rounded once (2^-24 relative), and fastExp(0) is within
    // 2 ulp of 1 (VecMath.h), so log(sum) within 2.4e-7: 1e-6 holds.
    CHECK(detail::loadRingLse(outs[1].f.data(), 1, 0, 0) ==
          Approx(1 / std::sqrt(2.0)).margin(1e-6));
  }
  SECTION("the second token mixes both values by softmax of q.k/sqrt(hd)") {
    std::vector<Tensor> ins = {
        Tensor::f32({2, 6}, {9, 9, 1, 0, 1, 2, // token 0: q ignored by the mask
                             1, 2, 0, 1, 3, 4})}; // token 1
    std::vector<Tensor> outs = attentionOuts(2, 2, 1);
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
    std::vector<Tensor> outs = attentionOuts(2, 2, 1);
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
  std::vector<Tensor> outs = attentionOuts(rows, hidden, heads);
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
        // lse: the log-sum-exp of the row's scaled scores. A float score of
        // hd = 4 products of |q|, |k| < 2 errs by at most hd * 2^-24 * 16 <
        // 4e-6, which moves the log-sum-exp by as much; fastExp's 2 ulp and
        // the float lse add < 1e-6: the y bound, 1e-5, holds for lse too.
        CHECK(detail::loadRingLse(outs[1].f.data(), heads, b * seq + i, h) ==
              Approx(maxScore + std::log(sum)).margin(1e-5));
        for (int64_t c = 0; c < hd; ++c) {
          double want = 0;
          for (int64_t j = 0; j <= i; ++j)
            want += score[j] / sum * at(b * seq + j, 2, h, c);
          CHECK(outs[0].f[(b * seq + i) * hidden + h * hd + c] ==
                Approx(want).margin(1e-5));
        }
      }
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
  std::vector<Tensor> ins = {Tensor::f32({2, 6}, {9, 9, 1, 0, 1, 2, //
                                                  1, 0, 1, 0, 3, 4})};
  std::vector<Tensor> outs = attentionOuts(2, 2, 1);
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
  const Config config = GENERATE(
      Config{4, 2, 4, 10000.0}, Config{6, 2, 6, 500000.0},
      Config{4, 1, 2, 10.0}, Config{3, 3, 4, 0.0}, Config{4, 2, 3, 0.0});
  INFO("heads=" << config.heads << " kv_heads=" << config.kv
                << " hd=" << config.hd << " rope_theta=" << config.theta);
  Rng rng(5);
  const int64_t batch = 2, seq = 7, rows = batch * seq;
  const int64_t cols = (config.heads + 2 * config.kv) * config.hd;
  const int64_t width = config.heads * config.hd;
  Tensor qkv = randomF32(rng, {rows, cols}, -2.0, 2.0);
  std::vector<Tensor> ins = {qkv};
  std::vector<Tensor> outs = attentionOuts(rows, width, config.heads);
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
    std::vector<Tensor> gqaOut = attentionOuts(rows, heads * hd, heads);
    std::vector<Tensor> mhaOut = attentionOuts(rows, heads * hd, heads);
    mustRun(K("attention")
                .i("heads", heads)
                .i("kv_heads", kv)
                .i("seq", seq)
                .f("rope_theta", theta),
            gqaIns, gqaOut);
    mustRun(
        K("attention").i("heads", heads).i("seq", seq).f("rope_theta", theta),
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
  std::vector<Tensor> plain = attentionOuts(6, 6, 2);
  std::vector<Tensor> explicitOut = attentionOuts(6, 6, 2);
  mustRun(K("attention").i("heads", 2).i("seq", 3), ins, plain);
  mustRun(K("attention")
              .i("heads", 2)
              .i("kv_heads", 2)
              .i("seq", 3)
              .f("rope_theta", 0.0),
          ins, explicitOut);
  CHECK(plain[0].f == explicitOut[0].f);
}

TEST_CASE("attention_grad is the gradient of attention", "[kernels][grad]") {
  Rng rng(16);
  const int64_t batch = 2, seq = 3, heads = 2, hd = 3, hidden = heads * hd;
  const int64_t rows = batch * seq;
  Tensor qkv = randomF32(rng, {rows, 3 * hidden}, -1.5, 1.5);
  std::vector<float> r = rng.vec(rows * hidden);
  K forward = K("attention").i("heads", heads).i("seq", seq);
  std::vector<Tensor> fwdIns = {qkv}, fwd = attentionOuts(rows, hidden, heads);
  mustRun(forward, fwdIns, fwd);

  // From the forward's q|k|v, y and lse.
  std::vector<Tensor> ins = {qkv, fwd[0], fwd[1],
                             Tensor::f32({rows, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, 3 * hidden})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be overwritten
  K backward = K("attention_grad").i("heads", heads).i("seq", seq);
  mustRun(backward, ins, outs);
  requireNonZero(outs[0].f);
  checkGradientOf(forward, {qkv}, 0, attentionOuts(rows, hidden, heads), 0, r,
                  outs[0].f);

  // y and lse must have the forward's shapes; attention writes both.
  CHECK(mustFail(backward,
                 {qkv, Tensor::f32({rows, hidden + 1}), fwd[1],
                  Tensor::f32({rows, hidden}, r)},
                 outs)
            .find("y has shape") != std::string::npos);
  CHECK(mustFail(backward,
                 {qkv, fwd[0], Tensor::f32({rows, heads}),
                  Tensor::f32({rows, hidden}, r)},
                 outs)
            .find("lse has shape") != std::string::npos);
  CHECK(mustFail(backward, {qkv, Tensor::f32({rows, hidden}, r)}, outs)
            .find("expected 4 inputs, got 2") != std::string::npos);
  CHECK(mustFail(forward, {qkv}, {Tensor::f32({rows, hidden})})
            .find("expected 2 outputs, got 1") != std::string::npos);
}

TEST_CASE("attention_grad with grouped-query heads and rotary embeddings",
          "[kernels][grad]") {
  struct Config {
    int64_t heads, kv, hd;
    double theta;
  };
  // Llama-style GQA with rope; MQA without rope; the old default (kv_heads
  // and rope_theta absent) with an odd head dim.
  const Config config = GENERATE(Config{4, 2, 4, 10000.0}, Config{2, 1, 3, 0.0},
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

  std::vector<Tensor> fwdIns = {qkv},
                      fwd = attentionOuts(rows, width, config.heads);
  mustRun(forward, fwdIns, fwd);
  std::vector<Tensor> ins = {qkv, fwd[0], fwd[1],
                             Tensor::f32({rows, width}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, cols})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be overwritten
  mustRun(backward, ins, outs);
  requireNonZero(outs[0].f);
  checkGradientOf(forward, {qkv}, 0, attentionOuts(rows, width, config.heads),
                  0, r, outs[0].f);
}

// Ring attention (context parallelism): the members' steps, emulated in
// one process, give the whole-sequence attention and its gradient on each
// member's rows.
TEST_CASE("ring attention steps equal attention and attention_grad over "
          "the whole sequence",
          "[kernels][grad]") {
  struct Config {
    int64_t cp, heads, kv, hd;
    double theta;
  };
  const Config config =
      GENERATE(Config{2, 4, 2, 4, 10000.0}, Config{4, 2, 1, 2, 0.0},
               Config{2, 2, 2, 3, 0.0}, Config{4, 4, 4, 2, 10.0},
               Config{1, 2, 1, 4, 10000.0});
  const int64_t n = config.cp;
  INFO("cp=" << n << " heads=" << config.heads << " kv_heads=" << config.kv
             << " hd=" << config.hd << " rope_theta=" << config.theta);
  Rng rng(31);
  const int64_t batch = 2, seq = 4 * n, local = seq / n, rows = batch * seq;
  const int64_t qCols = config.heads * config.hd,
                kvCols = config.kv * config.hd;
  const int64_t cols = qCols + 2 * kvCols;
  auto attrs = [&](K k) {
    return k.i("heads", config.heads)
        .i("kv_heads", config.kv)
        .i("seq", seq)
        .f("rope_theta", config.theta);
  };
  Tensor qkv = randomF32(rng, {rows, cols}, -1.5, 1.5);
  Tensor dy = randomF32(rng, {rows, qCols});
  std::vector<Tensor> ins = {qkv},
                      want = attentionOuts(rows, qCols, config.heads);
  mustRun(attrs(K("attention")), ins, want);
  std::vector<Tensor> gradIns = {qkv, want[0], want[1], dy},
                      wantGrad = {Tensor::f32({rows, cols})};
  mustRun(attrs(K("attention_grad")), gradIns, wantGrad);

  // Member m's rows: chunks m and 2n-1-m of each sequence (written out
  // here, not through plan::contextPosition).
  auto globalRow = [&](int64_t m, int64_t r) {
    int64_t b = r / local, t = r % local, c = seq / (2 * n);
    int64_t pos = t < c ? m * c + t : (2 * n - 1 - m) * c + (t - c);
    return b * seq + pos;
  };
  auto gather = [&](const Tensor &whole, int64_t m, int64_t first,
                    int64_t width) {
    int64_t wholeCols = whole.shape[1];
    Tensor part = Tensor::f32({batch * local, width});
    for (int64_t r = 0; r < batch * local; ++r)
      for (int64_t c = 0; c < width; ++c)
        part.f[r * width + c] =
            whole.f[globalRow(m, r) * wholeCols + first + c];
    return part;
  };
  std::vector<Tensor> q(n), kv(n), y(n), lse(n), dq(n), dkv(n);
  for (int64_t m = 0; m < n; ++m) {
    q[m] = gather(qkv, m, 0, cols);
    kv[m] = gather(qkv, m, qCols, 2 * kvCols);
  }
  const int64_t l = batch * local;
  // Forward: at step s member m holds owner (m - s) mod n's shard.
  for (int64_t s = 0; s < n; ++s)
    for (int64_t m = 0; m < n; ++m) {
      KernelContext ctx;
      ctx.contextMember = m;
      std::vector<Tensor> in = {q[m], kv[(m - s + n) % n]};
      if (s > 0) {
        in.push_back(y[m]);
        in.push_back(lse[m]);
      }
      std::vector<Tensor> out = {
          Tensor::f32({l, qCols}, std::vector<float>(l * qCols, 9.0f)),
          Tensor::f32({l, 2 * config.heads})};
      Status st = run(attrs(K("attention_block")).i("cp", n).i("step", s), in,
                      out, ctx);
      REQUIRE(st);
      y[m] = out[0];
      lse[m] = out[1];
    }
  // Backward: at step s member m holds owner (m + s) mod n's shard and the
  // partial sum of its key/value gradient.
  for (int64_t s = 0; s < n; ++s)
    for (int64_t m = 0; m < n; ++m) {
      int64_t owner = (m + s) % n;
      KernelContext ctx;
      ctx.contextMember = m;
      std::vector<Tensor> in = {q[m], kv[owner], y[m], lse[m],
                                gather(dy, m, 0, qCols)};
      if (s > 0) {
        in.push_back(dq[m]);
        in.push_back(dkv[owner]);
      }
      std::vector<Tensor> out = {
          Tensor::f32({l, qCols}, std::vector<float>(l * qCols, 9.0f)),
          Tensor::f32({l, 2 * kvCols},
                      std::vector<float>(l * 2 * kvCols, 9.0f))};
      Status st = run(attrs(K("attention_block_grad")).i("cp", n).i("step", s),
                      in, out, ctx);
      REQUIRE(st);
      dq[m] = out[0];
      dkv[owner] = out[1];
    }
  // fp32 sums of at most seq terms of inputs below 1.5 in magnitude,
  // in another order than the whole-sequence kernels: the bound of the
  // attention tests against their double reference.
  for (int64_t m = 0; m < n; ++m) {
    Tensor wantY = gather(want[0], m, 0, qCols);
    Tensor wantDq = gather(wantGrad[0], m, 0, qCols);
    Tensor wantDkv = gather(wantGrad[0], m, qCols, 2 * kvCols);
    for (size_t e = 0; e < wantY.f.size(); ++e)
      CHECK(y[m].f[e] == Approx(wantY.f[e]).margin(2e-5));
    for (size_t e = 0; e < wantDq.f.size(); ++e)
      CHECK(dq[m].f[e] == Approx(wantDq.f[e]).margin(2e-5));
    for (size_t e = 0; e < wantDkv.f.size(); ++e)
      CHECK(dkv[m].f[e] == Approx(wantDkv.f[e]).margin(2e-5));
  }
}

TEST_CASE("Ulysses' layouts around emulated all-to-alls give attention "
          "over the whole sequence of each member's heads",
          "[kernels]") {
  struct Config {
    int64_t cp, heads, kv, hd;
  };
  const Config config = GENERATE(Config{2, 4, 2, 4}, Config{4, 8, 4, 2},
                                 Config{2, 2, 2, 6}, Config{4, 4, 4, 2});
  const int64_t n = config.cp;
  INFO("cp=" << n << " heads=" << config.heads << " kv_heads=" << config.kv
             << " hd=" << config.hd);
  Rng rng(37);
  const int64_t batch = 2, seq = 4 * n, local = seq / n, rows = batch * seq;
  const int64_t l = batch * local;
  const int64_t qCols = config.heads * config.hd,
                kvCols = config.kv * config.hd;
  const int64_t cols = qCols + 2 * kvCols;
  Tensor qkv = randomF32(rng, {rows, cols}, -1.5, 1.5);
  std::vector<Tensor> ins = {qkv},
                      want = attentionOuts(rows, qCols, config.heads);
  mustRun(K("attention")
              .i("heads", config.heads)
              .i("kv_heads", config.kv)
              .i("seq", seq)
              .f("rope_theta", 10000.0),
          ins, want);
  // Member m's rows: chunks m and 2n-1-m of each sequence (written out
  // here, not through UlyssesLayout.h).
  auto globalRow = [&](int64_t m, int64_t r) {
    int64_t b = r / local, t = r % local, c = seq / (2 * n);
    int64_t pos = t < c ? m * c + t : (2 * n - 1 - m) * c + (t - c);
    return b * seq + pos;
  };
  auto rowsOf = [&](const Tensor &whole, int64_t m) {
    int64_t width = whole.shape[1];
    Tensor part = Tensor::f32({l, width});
    for (int64_t r = 0; r < l; ++r)
      std::copy_n(whole.f.begin() + globalRow(m, r) * width, width,
                  part.f.begin() + r * width);
    return part;
  };
  // Member j's all-to-all result: block i is member i's block j.
  auto allToAll = [&](const std::vector<Tensor> &sent) {
    std::vector<Tensor> got(n);
    int64_t block = sent[0].numel() / n;
    for (int64_t j = 0; j < n; ++j) {
      got[j] = Tensor::f32(sent[0].shape);
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(sent[i].f.begin() + j * block, block,
                    got[j].f.begin() + i * block);
    }
    return got;
  };
  auto cpCols = [&](K k, bool kv) {
    k.i("cp", n).i("heads", config.heads);
    if (kv)
      k.i("kv_heads", config.kv);
    return k;
  };
  std::vector<Tensor> blocks(n), counts(n);
  for (int64_t m = 0; m < n; ++m) {
    std::vector<Tensor> in = {rowsOf(qkv, m)};
    std::vector<Tensor> out = {Tensor::f32({rows, cols / n}),
                               Tensor::i32({n}, std::vector<int32_t>(n, -1))};
    mustRun(cpCols(K("cp_ulysses_split"), true), in, out);
    blocks[m] = out[0];
    CHECK(out[1].i == std::vector<int32_t>(n, int32_t(l)));
  }
  std::vector<Tensor> received = allToAll(blocks), back(n);
  const int64_t h = config.heads / n, kv = config.kv / n;
  for (int64_t m = 0; m < n; ++m) {
    std::vector<Tensor> in = {received[m]},
                        natural = {Tensor::f32({rows, cols / n})};
    mustRun(K("cp_ulysses_natural").i("cp", n).i("seq", seq), in, natural);
    // Every row, in sequence order, of member m's query, key and value
    // heads.
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols / n; ++c) {
        int64_t group = c < h * config.hd          ? 0
                        : c < (h + kv) * config.hd ? 1
                                                   : 2;
        int64_t wideCol =
            group == 0 ? m * h * config.hd + c
                       : qCols + (group - 1) * kvCols + m * kv * config.hd +
                             (c - h * config.hd - (group - 1) * kv * config.hd);
        REQUIRE(natural[0].f[r * (cols / n) + c] == qkv.f[r * cols + wideCol]);
      }
    std::vector<Tensor> yLse = attentionOuts(rows, qCols / n, h);
    mustRun(K("attention")
                .i("heads", h)
                .i("kv_heads", kv)
                .i("seq", seq)
                .f("rope_theta", 10000.0),
            natural, yLse);
    std::vector<Tensor> y = {yLse[0]};
    std::vector<Tensor> out = {Tensor::f32({rows, qCols / n}),
                               Tensor::i32({n}, std::vector<int32_t>(n, -1))};
    mustRun(K("cp_ulysses_zigzag").i("cp", n).i("seq", seq), y, out);
    CHECK(out[1].i == std::vector<int32_t>(n, int32_t(l)));
    back[m] = out[0];
  }
  std::vector<Tensor> returned = allToAll(back);
  for (int64_t m = 0; m < n; ++m) {
    std::vector<Tensor> in = {returned[m]}, y = {Tensor::f32({l, qCols})};
    mustRun(cpCols(K("cp_ulysses_merge"), false), in, y);
    // The same kernel on the same rows and heads: bit for bit.
    CHECK(y[0].f == rowsOf(want[0], m).f);
  }
  // The inverses: merge after split, zigzag after natural.
  std::vector<Tensor> in = {blocks[0]}, merged = {Tensor::f32({l, cols})};
  mustRun(cpCols(K("cp_ulysses_merge"), true), in, merged);
  CHECK(merged[0].f == rowsOf(qkv, 0).f);
}

TEST_CASE("cp_split keeps the member's rows and cp_split_grad puts them "
          "back",
          "[kernels]") {
  const int64_t cp = GENERATE(2, 4);
  const int64_t batch = 2, seq = 4 * cp, rows = batch * seq, cols = 3;
  const int64_t local = seq / cp, chunk = seq / (2 * cp);
  Rng rng(41);
  Tensor x = randomF32(rng, {rows, cols});
  std::vector<int> covered(rows, 0);
  for (int64_t m = 0; m < cp; ++m) {
    KernelContext ctx;
    ctx.contextMember = m;
    std::vector<Tensor> in = {x}, out = {Tensor::f32({rows / cp, cols})};
    REQUIRE(run(K("cp_split").i("cp", cp).i("seq", seq), in, out, ctx));
    std::vector<Tensor> back = {
        Tensor::f32({rows, cols}, std::vector<float>(rows * cols, 9.0f))};
    REQUIRE(run(K("cp_split_grad").i("cp", cp).i("seq", seq), out, back, ctx));
    // Row t of sequence b: chunk m, then chunk 2 cp - 1 - m (written out).
    for (int64_t r = 0; r < rows / cp; ++r) {
      int64_t b = r / local, t = r % local;
      int64_t pos =
          t < chunk ? m * chunk + t : (2 * cp - 1 - m) * chunk + (t - chunk);
      int64_t g = b * seq + pos;
      ++covered[g];
      for (int64_t c = 0; c < cols; ++c)
        CHECK(out[0].f[r * cols + c] == x.f[g * cols + c]);
    }
    for (int64_t g = 0; g < rows; ++g)
      for (int64_t c = 0; c < cols; ++c) {
        bool mine = false;
        for (int64_t r = 0; r < rows / cp; ++r) {
          int64_t b = r / local, t = r % local;
          int64_t pos = t < chunk ? m * chunk + t
                                  : (2 * cp - 1 - m) * chunk + (t - chunk);
          mine = mine || b * seq + pos == g;
        }
        CHECK(back[0].f[g * cols + c] == (mine ? x.f[g * cols + c] : 0.0f));
      }
  }
  CHECK(std::count(covered.begin(), covered.end(), 1) == rows);
  KernelContext outside;
  outside.contextMember = cp;
  std::vector<Tensor> in = {x}, out = {Tensor::f32({rows / cp, cols})};
  Status s = run(K("cp_split").i("cp", cp).i("seq", seq), in, out, outside);
  REQUIRE_FALSE(s);
  CHECK(s.message().find("context-parallel member " + std::to_string(cp) +
                         " is not one of") != std::string::npos);
  CHECK(mustFail(K("cp_split").i("cp", 2).i("seq", 8), {Tensor::f32({16, 3})},
                 {Tensor::f32({4, 3})})
            .find("y has shape [4,3]") != std::string::npos);
}

TEST_CASE("Ulysses' layouts reject bad heads, sequences and shapes",
          "[kernels]") {
  auto counts = [](int64_t n) {
    return Tensor::i32({n}, std::vector<int32_t>(n));
  };
  CHECK(mustFail(K("cp_ulysses_split").i("cp", 2).i("heads", 3),
                 {Tensor::f32({4, 6})}, {Tensor::f32({8, 3}), counts(2)})
            .find("heads (3) and kv_heads (0) must be multiples of cp = 2") !=
        std::string::npos);
  CHECK(mustFail(K("cp_ulysses_split").i("cp", 1).i("heads", 2),
                 {Tensor::f32({4, 6})}, {Tensor::f32({4, 6}), counts(1)})
            .find("cp must be at least 2") != std::string::npos);
  CHECK(
      mustFail(K("cp_ulysses_split").i("cp", 2).i("heads", 2).i("kv_heads", 2),
               {Tensor::f32({4, 12})}, {Tensor::f32({4, 6}), counts(2)})
          .find("the narrow matrix must be [8, 6]") != std::string::npos);
  CHECK(mustFail(K("cp_ulysses_merge").i("cp", 2).i("heads", 2),
                 {Tensor::f32({8, 3})}, {Tensor::f32({4, 5})})
            .find("are not (heads + 2 kv_heads) = 2 heads") !=
        std::string::npos);
  CHECK(mustFail(K("cp_ulysses_natural").i("cp", 2).i("seq", 6),
                 {Tensor::f32({12, 2})}, {Tensor::f32({12, 2})})
            .find("seq 6 must be a multiple of 2 cp = 4") != std::string::npos);
  CHECK(mustFail(K("cp_ulysses_zigzag").i("cp", 2).i("seq", 8),
                 {Tensor::f32({12, 2})}, {Tensor::f32({12, 2}), counts(2)})
            .find("rows 12 are not whole sequences of 8") != std::string::npos);
  CHECK(mustFail(K("cp_ulysses_zigzag").i("cp", 2).i("seq", 8),
                 {Tensor::f32({16, 2})}, {Tensor::f32({16, 2}), counts(3)})
            .find("counts") != std::string::npos);
}

TEST_CASE("ring attention's log-sum-exp pair survives bf16 storage",
          "[kernels]") {
  // hi is v rounded to bf16 and lo the exact rest: their fp32 sum is v,
  // and with lo rounded to bf16 too (mixed precision stores every value
  // so) the error is at most lo's bf16 rounding, |lo| u with u = 2^-8 (8
  // significant bits), |lo| being at most v's rounding, |v| u: |v| 2^-16.
  Rng rng(5);
  for (int i = 0; i < 1000; ++i) {
    float v = static_cast<float>(rng.uniform(-40.0, 40.0));
    float lse[4];
    detail::storeRingLse(lse, 2, 0, 1, v);
    CHECK(lse[1] == roundToBf16(lse[1]));
    CHECK(detail::loadRingLse(lse, 2, 0, 1) == v);
    lse[3] = roundToBf16(lse[3]);
    CHECK(std::abs(detail::loadRingLse(lse, 2, 0, 1) - v) <=
          std::abs(v) * std::ldexp(1.0f, -16));
  }
  float lse[2];
  detail::storeRingLse(lse, 1, 0, 0, -std::numeric_limits<float>::infinity());
  CHECK(lse[1] == 0.0f);
  CHECK(detail::loadRingLse(lse, 1, 0, 0) ==
        -std::numeric_limits<float>::infinity());
}

TEST_CASE("ring attention steps reject bad members, steps and shapes",
          "[kernels]") {
  auto block = [](int64_t cp, int64_t step) {
    return K("attention_block")
        .i("heads", 2)
        .i("seq", 8)
        .i("cp", cp)
        .i("step", step);
  };
  // heads 2, hd 2: qkv [8, 12], kv [8, 8]; 8 / 2 = 4 rows of each
  // sequence per member, 2 sequences.
  auto ins = [] {
    return std::vector<Tensor>{Tensor::f32({8, 12}), Tensor::f32({8, 8})};
  };
  auto outs = [] {
    return std::vector<Tensor>{Tensor::f32({8, 4}), Tensor::f32({8, 4})};
  };
  auto fails = [&](const plan::Kernel &k, std::vector<Tensor> in,
                   std::vector<Tensor> out, int64_t member,
                   const std::string &needle) {
    KernelContext ctx;
    ctx.contextMember = member;
    Status st = run(k, in, out, ctx);
    INFO("message: " << st.message());
    REQUIRE_FALSE(st);
    CHECK(st.message().find(needle) != std::string::npos);
  };
  {
    KernelContext ctx;
    ctx.contextMember = 1;
    std::vector<Tensor> in = ins(), out = outs();
    REQUIRE(run(block(2, 1), in, out, ctx));
  }
  fails(block(2, 2), ins(), outs(), 0,
        "attribute 'step' 2 is not in [0, cp 2)");
  fails(block(2, 0), ins(), outs(), 2, "context member 2 is not one of 2");
  fails(block(3, 0), ins(), outs(), 0, "seq 8 is not a multiple of 2 x cp 3");
  fails(block(2, 0), {Tensor::f32({6, 12}), Tensor::f32({6, 8})},
        {Tensor::f32({6, 4}), Tensor::f32({6, 4})}, 0,
        "qkv has 6 rows, not a multiple of the member's seq / cp 4");
  std::vector<Tensor> three = ins();
  three.push_back(Tensor::f32({8, 4}));
  fails(block(2, 1), three, outs(), 0, "got 3 inputs");
  std::vector<Tensor> narrowKv = {Tensor::f32({8, 12}), Tensor::f32({8, 4})};
  fails(block(2, 0), narrowKv, outs(), 0, "kv");
  fails(K("attention_block").i("heads", 2).i("seq", 8).i("step", 0), ins(),
        outs(), 0, "'cp'");
}

// The norm backwards come in two halves (zero-bubble schedules run the input
// gradient BI and the weight gradient BW at different times); each half
// recomputes the row statistics from x. Over edge shapes they must match a
// double-precision reference, overwrite their outputs, and give the same
// bits whether the rows are processed together (dx is computed in parallel
// chunks of rows) or one at a time.

TEST_CASE("attention rejects bad kv_heads, rope_theta and widths",
          "[kernels][errors]") {
  // heads 4, kv_heads 2, hd 2: qkv [N, 16], y [N, 8].
  Tensor qkv = Tensor::f32({4, 16});
  Tensor y = Tensor::f32({4, 8}), lse = Tensor::f32({4, 8});
  K good = K("attention").i("heads", 4).i("kv_heads", 2).i("seq", 2);
  {
    std::vector<Tensor> ins = {qkv}, outs = {y, lse};
    mustRun(good, ins, outs);
  }
  CHECK(mustFail(K("attention").i("heads", 4).i("kv_heads", 3).i("seq", 2),
                 {qkv}, {y, lse}) ==
        "attention: attribute 'heads' 4 is not a multiple of 'kv_heads' 3");
  mustFail(K("attention").i("heads", 2).i("kv_heads", 4).i("seq", 2),
           {Tensor::f32({4, 20})}, {Tensor::f32({4, 4}), Tensor::f32({4, 4})});
  CHECK(mustFail(K("attention").i("heads", 4).i("kv_heads", 0).i("seq", 2),
                 {qkv}, {y, lse}) ==
        "attention: attribute 'kv_heads' must be positive, got 0");
  mustFail(K("attention").i("heads", 4).f("kv_heads", 1.5).i("seq", 2), {qkv},
           {y, lse});
  // The multi-head width without kv_heads, and the GQA width with the wrong
  // kv_heads.
  CHECK(mustFail(K("attention").i("heads", 4).i("seq", 2), {qkv}, {y, lse}) ==
        "attention: qkv has 16 columns, expected (heads 4 + 2 * kv_heads 4) "
        "* head dim 2");
  mustFail(K("attention").i("heads", 4).i("kv_heads", 1).i("seq", 2), {qkv},
           {y, lse});
  CHECK(mustFail(good, {qkv}, {Tensor::f32({4, 6}), lse}) ==
        "attention: y has 6 columns, expected a positive multiple of heads 4");
  mustFail(good, {qkv}, {Tensor::f32({4, 0}), lse});
  CHECK(mustFail(good, {qkv}, {Tensor::f32({2, 8}), lse}) ==
        "attention: y has shape [2,8], expected [4,*]");
  mustFail(good, {qkv}, {Tensor::f32({32}), lse});

  CHECK(mustFail(K(good).f("rope_theta", -10000.0), {qkv}, {y, lse}) ==
        "attention: attribute 'rope_theta' must not be negative");
  mustFail(K(good).s("rope_theta", "10000"), {qkv}, {y, lse});
  mustFail(K(good).f("rope_theta", std::nan("")), {qkv}, {y, lse});
  // hd = 3 is fine without rotary embeddings, not with them.
  std::vector<Tensor> oddIns = {Tensor::f32({2, 9})};
  std::vector<Tensor> oddOuts = {Tensor::f32({2, 3}), Tensor::f32({2, 2})};
  mustRun(K("attention").i("heads", 1).i("seq", 2), oddIns, oddOuts);
  CHECK(mustFail(
            K("attention").i("heads", 1).i("seq", 2).f("rope_theta", 10000.0),
            oddIns, oddOuts) ==
        "attention: head dim 3 must be even for rotary embeddings");

  K goodGrad = K("attention_grad").i("heads", 4).i("kv_heads", 2).i("seq", 2);
  {
    std::vector<Tensor> ins = {qkv, y, lse, y}, outs = {qkv};
    mustRun(goodGrad, ins, outs);
  }
  CHECK(mustFail(goodGrad, {qkv, y, lse, y}, {Tensor::f32({4, 24})}) ==
        "attention_grad: dqkv has shape [4,24], expected [4,16]");
  mustFail(goodGrad, {qkv, y, lse, Tensor::f32({4, 12})}, {qkv});
  mustFail(K(goodGrad).i("kv_heads", 3), {qkv, y, lse, y}, {qkv});
  mustFail(K("attention_grad").i("heads", 1).i("seq", 2).f("rope_theta", 1e4),
           {Tensor::f32({2, 9}), Tensor::f32({2, 3}), Tensor::f32({2, 2}),
            Tensor::f32({2, 3})},
           {Tensor::f32({2, 9})});

  // Zero rows: nothing to compute, however long the sequence.
  std::vector<Tensor> emptyIns = {Tensor::f32({0, 16})};
  std::vector<Tensor> emptyOuts = {Tensor::f32({0, 8}), Tensor::f32({0, 8})};
  mustRun(K(good).i("seq", 1 << 30).f("rope_theta", 1e4), emptyIns, emptyOuts);
}

TEST_CASE("Llama 3.1's rotary frequencies in their three ranges",
          "[kernels][rope]") {
  // theta 10000, head dim 8: f_i = 10000^(-i/4) = 1, 0.1, 0.01, 0.001,
  // wavelengths 2 pi / f_i = 6.28, 62.8, 628, 6283. With an original
  // context of 1000, low 1 and high 4: w < 250 keeps f, w > 1000 divides
  // it by the factor 8, between interpolates with s = (1000 / w - 1) / 3.
  const RopeScaling s{8.0, 1.0, 4.0, 1000.0};
  const double pi = 3.14159265358979323846;
  CHECK(ropeFrequency(10000.0, 8, 0, s) == 1.0);
  CHECK(ropeFrequency(10000.0, 8, 1, s) == Approx(0.1).epsilon(1e-15));
  const double f2 = std::pow(10000.0, -0.5),
               t = (1000.0 * f2 / (2 * pi) - 1) / 3;
  CHECK(ropeFrequency(10000.0, 8, 2, s) ==
        Approx((1 - t) * f2 / 8 + t * f2).epsilon(1e-15));
  CHECK(ropeFrequency(10000.0, 8, 3, s) ==
        Approx(std::pow(10000.0, -0.75) / 8).epsilon(1e-15));
  CHECK(ropeFrequency(10000.0, 8, 3, RopeScaling{}) ==
        std::pow(10000.0, -0.75));
}

TEST_CASE("attention rejects a bad Llama 3.1 rotary scaling",
          "[kernels][rope]") {
  std::vector<Tensor> ins = {Tensor::f32({2, 6}, std::vector<float>(12, 0.5f))};
  std::vector<Tensor> outs = {Tensor::f32({2, 2}), Tensor::f32({2, 2})};
  auto scaled = [](double theta, double factor, double low, double high,
                   int64_t original) {
    K k = K("attention").i("heads", 1).i("seq", 2);
    if (theta != 0)
      k.f("rope_theta", theta);
    k.f("rope_factor", factor)
        .f("rope_low_freq_factor", low)
        .f("rope_high_freq_factor", high);
    if (original != 0)
      k.i("rope_original_max_position", original);
    return k;
  };
  mustRun(scaled(500000.0, 8.0, 1.0, 4.0, 64), ins, outs);
  CHECK(mustFail(scaled(0, 8.0, 1.0, 4.0, 64), ins, outs) ==
        "attention: attribute 'rope_factor' needs 'rope_theta'");
  CHECK(mustFail(scaled(500000.0, 8.0, 4.0, 1.0, 64), ins, outs) ==
        "attention: attributes 'rope_factor', 'rope_low_freq_factor' and "
        "'rope_high_freq_factor' must satisfy factor > 0 and 0 < low < high");
  CHECK(mustFail(scaled(500000.0, 8.0, 1.0, 4.0, 0), ins, outs)
            .find("rope_original_max_position") != std::string::npos);
}

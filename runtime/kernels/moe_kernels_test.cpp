// The CPU mixture-of-experts kernels: router, dispatch, expert linear,
// combine, the load-balancing loss, their gradients, and the
// expert-parallel exchanges' layouts.
#include "runtime/kernels/kernels_test_util.h"

namespace {

/// Softmax of one row, in double.
std::vector<double> refSoftmax(const float *row, int64_t n) {
  double rowMax = -1e300, sum = 0;
  for (int64_t e = 0; e < n; ++e)
    rowMax = std::max(rowMax, double(row[e]));
  std::vector<double> p(n);
  for (int64_t e = 0; e < n; ++e)
    sum += (p[e] = std::exp(double(row[e]) - rowMax));
  for (double &v : p)
    v /= sum;
  return p;
}

/// Top-k routing by sorting all experts on (p descending, index ascending).
void refRouter(const Tensor &logits, int64_t k, bool norm,
               std::vector<int32_t> &indices, std::vector<double> &weights) {
  const int64_t rows = logits.shape[0], experts = logits.shape[1];
  indices.clear();
  weights.clear();
  for (int64_t n = 0; n < rows; ++n) {
    std::vector<double> p = refSoftmax(logits.f.data() + n * experts, experts);
    std::vector<int32_t> order(experts);
    for (int32_t e = 0; e < experts; ++e)
      order[e] = e;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return p[a] != p[b] ? p[a] > p[b] : a < b;
    });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j)
      sum += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      indices.push_back(order[j]);
      weights.push_back(p[order[j]] / (norm ? sum : 1.0));
    }
  }
}

/// The capacity rule with a counter per expert: the buffer row of every
/// (n, j) in row-major order, or -1 when dropped.
std::vector<int64_t> refSlots(const std::vector<int32_t> &indices,
                              int64_t experts, int64_t capacity) {
  std::vector<int64_t> used(experts, 0), slots;
  for (int32_t e : indices)
    slots.push_back(used[e] < capacity ? e * capacity + used[e]++ : -1);
  return slots;
}

/// Logits whose rows are a permutation of 0, 0.3, 0.6, ... plus noise of at
/// most 0.05, so that a finite-difference step never changes the top-k.
Tensor separatedLogits(Rng &rng, int64_t rows, int64_t experts) {
  Tensor t = Tensor::f32({rows, experts});
  for (int64_t n = 0; n < rows; ++n) {
    std::vector<int64_t> rank(experts);
    for (int64_t e = 0; e < experts; ++e)
      rank[e] = e;
    for (int64_t e = experts - 1; e > 0; --e)
      std::swap(rank[e], rank[int64_t(rng.next() * (e + 1))]);
    for (int64_t e = 0; e < experts; ++e)
      t.f[n * experts + e] =
          float(0.3 * rank[e] - 1.0 + rng.uniform(-0.05, 0.05));
  }
  return t;
}

/// Random routing: k distinct experts per row.
Tensor randomIndices(Rng &rng, int64_t rows, int64_t k, int64_t experts) {
  std::vector<int32_t> ids;
  for (int64_t n = 0; n < rows; ++n) {
    std::vector<int32_t> all(experts);
    for (int32_t e = 0; e < experts; ++e)
      all[e] = e;
    for (int64_t j = 0; j < k; ++j) {
      std::swap(all[j], all[j + int64_t(rng.next() * (experts - j))]);
      ids.push_back(all[j]);
    }
  }
  return Tensor::i32({rows, k}, ids);
}

K routerKernel(const std::string &op, int64_t k, int64_t norm) {
  K kernel(op);
  kernel.i("top_k", k);
  if (norm >= 0) // -1: leave norm_topk at its default
    kernel.i("norm_topk", norm);
  return kernel;
}

K slotKernel(const std::string &op, int64_t experts, int64_t capacity) {
  return K(op).i("experts", experts).i("capacity", capacity);
}

} // namespace

TEST_CASE("moe_router picks the top_k probabilities, ties to the lower index",
          "[kernels][forward][moe]") {
  // Row 0: experts 1 and 3 tie for first. Row 1: p = [1, 0, 0] after
  // underflow, so experts 1 and 2 tie at 0 although their logits differ.
  std::vector<Tensor> ins = {
      Tensor::f32({2, 4}, {1, 3, 2, 3, 0, -2000, -1000, -3000})};
  std::vector<Tensor> outs = {Tensor::i32({2, 3}, {9, 9, 9, 9, 9, 9}),
                              Tensor::f32({2, 3}, {9, 9, 9, 9, 9, 9})};
  mustRun(routerKernel("moe_router", 3, -1), ins, outs);
  CHECK(outs[0].i == std::vector<int32_t>{1, 3, 2, 0, 1, 2});
  double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
  double sel = 2 * std::exp(3.0) + std::exp(2.0);
  CHECK(outs[1].f[0] == Approx(std::exp(3.0) / sel));
  CHECK(outs[1].f[1] == Approx(std::exp(3.0) / sel));
  CHECK(outs[1].f[2] == Approx(std::exp(2.0) / sel));
  CHECK(outs[1].f[3] == 1.0f);
  CHECK(outs[1].f[4] == 0.0f);

  // norm_topk = 0 keeps the full-softmax probabilities.
  mustRun(routerKernel("moe_router", 3, 0), ins, outs);
  CHECK(outs[0].i == std::vector<int32_t>{1, 3, 2, 0, 1, 2});
  CHECK(outs[1].f[0] == Approx(std::exp(3.0) / z));
  CHECK(outs[1].f[2] == Approx(std::exp(2.0) / z));

  // top_1 with normalization: weight 1.
  std::vector<Tensor> one = {Tensor::i32({2, 1}, {9, 9}),
                             Tensor::f32({2, 1}, {9, 9})};
  mustRun(routerKernel("moe_router", 1, 1), ins, one);
  CHECK(one[0].i == std::vector<int32_t>{1, 0});
  CHECK(one[1].f == std::vector<float>{1, 1});
}

TEST_CASE("moe_router matches a sorting reference", "[kernels][forward][moe]") {
  const int64_t k = GENERATE(1, 2, 3, 6);
  const int64_t norm = GENERATE(0, 1);
  INFO("top_k=" << k << " norm_topk=" << norm);
  Rng rng(40 + k);
  const int64_t rows = 11, experts = 6;
  Tensor logits = randomF32(rng, {rows, experts}, -3.0, 3.0);
  for (int64_t i = 0; i < rows * experts; i += 3) // many exact ties
    logits.f[i] = std::round(logits.f[i]);
  for (int64_t i = 1; i < rows * experts; i += 3)
    logits.f[i] = std::round(logits.f[i]);
  std::vector<Tensor> ins = {logits};
  std::vector<Tensor> outs = {
      Tensor::i32({rows, k}, std::vector<int32_t>(rows * k)),
      Tensor::f32({rows, k})};
  mustRun(routerKernel("moe_router", k, norm), ins, outs);
  std::vector<int32_t> wantIdx;
  std::vector<double> wantW;
  refRouter(logits, k, norm == 1, wantIdx, wantW);
  CHECK(outs[0].i == wantIdx);
  for (int64_t i = 0; i < rows * k; ++i)
    CHECK(outs[1].f[i] == Approx(wantW[i]).margin(1e-6));
}

TEST_CASE("moe_dispatch fills slots in row-major order and drops overflow",
          "[kernels][forward][moe]") {
  // E = 3, C = 2. Row-major walk: (0,0)->e0 s0, (0,1)->e1 s0, (1,0)->e0 s1,
  // (1,1)->e2 s0, (2,0)->e0 dropped, (2,1)->e1 s1, (3,0)->e1 dropped,
  // (3,1)->e0 dropped. Slot 1 of expert 2 stays empty.
  Tensor x = Tensor::f32({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor indices = Tensor::i32({4, 2}, {0, 1, 0, 2, 0, 1, 1, 0});
  std::vector<Tensor> ins = {x, indices};
  std::vector<Tensor> outs = {Tensor::f32({6, 2})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be zeroed
  mustRun(slotKernel("moe_dispatch", 3, 2), ins, outs);
  CHECK(outs[0].f == std::vector<float>{1, 2, 3, 4,   // expert 0
                                        1, 2, 5, 6,   // expert 1
                                        3, 4, 0, 0}); // expert 2

  // combine: y[n] = sum of the weighted slots of n's kept assignments; the
  // dropped ones contribute nothing.
  Tensor ebuf = Tensor::f32({6, 2}, {1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60});
  Tensor weights = Tensor::f32({4, 2}, {0.5, 0.25, 1, 2, 4, 8, 16, 32});
  std::vector<Tensor> cins = {ebuf, indices, weights};
  std::vector<Tensor> couts = {Tensor::f32({4, 2})};
  mustRun(slotKernel("moe_combine", 3, 2), cins, couts);
  CHECK(couts[0].f == std::vector<float>{0.5f * 1 + 0.25f * 3,
                                         0.5f * 10 + 0.25f * 30,         //
                                         1 * 2 + 2 * 5, 1 * 20 + 2 * 50, //
                                         8 * 4, 8 * 40,                  //
                                         0, 0});

  // With capacity N nothing is dropped.
  std::vector<Tensor> bigOuts = {Tensor::f32({12, 2})};
  mustRun(slotKernel("moe_dispatch", 3, 4), ins, bigOuts);
  CHECK(bigOuts[0].f == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, //
                                           1, 2, 5, 6, 7, 8, 0, 0, //
                                           3, 4, 0, 0, 0, 0, 0, 0});
}

TEST_CASE("moe_dispatch, moe_combine and their gradients match a "
          "counter-per-expert reference",
          "[kernels][forward][moe]") {
  const int64_t capacity = GENERATE(1, 3, 5, 16);
  INFO("capacity=" << capacity);
  Rng rng(50 + capacity);
  const int64_t rows = 8, k = 2, experts = 4, hidden = 3;
  const int64_t slots = experts * capacity;
  Tensor x = randomF32(rng, {rows, hidden});
  Tensor indices = randomIndices(rng, rows, k, experts);
  Tensor weights = randomF32(rng, {rows, k}, 0.0, 1.0);
  Tensor ebuf = randomF32(rng, {slots, hidden});
  Tensor dy = randomF32(rng, {rows, hidden});
  std::vector<int64_t> slot = refSlots(indices.i, experts, capacity);

  std::vector<Tensor> ins = {x, indices};
  std::vector<Tensor> outs = {Tensor::f32({slots, hidden})};
  mustRun(slotKernel("moe_dispatch", experts, capacity), ins, outs);
  std::vector<float> wantBuf(slots * hidden, 0.0f);
  for (int64_t a = 0; a < rows * k; ++a)
    if (slot[a] >= 0)
      for (int64_t h = 0; h < hidden; ++h)
        wantBuf[slot[a] * hidden + h] = x.f[(a / k) * hidden + h];
  CHECK(outs[0].f == wantBuf);

  ins = {indices, ebuf};
  outs = {Tensor::f32({rows, hidden})};
  mustRun(slotKernel("moe_dispatch_grad", experts, capacity), ins, outs);
  std::vector<double> wantDx(rows * hidden, 0.0);
  for (int64_t a = 0; a < rows * k; ++a)
    if (slot[a] >= 0)
      for (int64_t h = 0; h < hidden; ++h)
        wantDx[(a / k) * hidden + h] += ebuf.f[slot[a] * hidden + h];
  for (int64_t i = 0; i < rows * hidden; ++i)
    CHECK(outs[0].f[i] == Approx(wantDx[i]).margin(1e-6));

  ins = {ebuf, indices, weights};
  outs = {Tensor::f32({rows, hidden})};
  mustRun(slotKernel("moe_combine", experts, capacity), ins, outs);
  std::vector<double> wantY(rows * hidden, 0.0);
  for (int64_t a = 0; a < rows * k; ++a)
    if (slot[a] >= 0)
      for (int64_t h = 0; h < hidden; ++h)
        wantY[(a / k) * hidden + h] +=
            double(weights.f[a]) * ebuf.f[slot[a] * hidden + h];
  for (int64_t i = 0; i < rows * hidden; ++i)
    CHECK(outs[0].f[i] == Approx(wantY[i]).margin(1e-6));

  ins = {ebuf, indices, weights, dy};
  outs = {Tensor::f32({slots, hidden}), Tensor::f32({rows, k})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f);
  std::fill(outs[1].f.begin(), outs[1].f.end(), 9.0f);
  mustRun(slotKernel("moe_combine_grad", experts, capacity), ins, outs);
  std::vector<double> wantDebuf(slots * hidden, 0.0), wantDw(rows * k, 0.0);
  for (int64_t a = 0; a < rows * k; ++a)
    if (slot[a] >= 0)
      for (int64_t h = 0; h < hidden; ++h) {
        wantDebuf[slot[a] * hidden + h] =
            double(weights.f[a]) * dy.f[(a / k) * hidden + h];
        wantDw[a] +=
            double(ebuf.f[slot[a] * hidden + h]) * dy.f[(a / k) * hidden + h];
      }
  for (int64_t i = 0; i < slots * hidden; ++i)
    CHECK(outs[0].f[i] == Approx(wantDebuf[i]).margin(1e-6));
  for (int64_t a = 0; a < rows * k; ++a) {
    CHECK(outs[1].f[a] == Approx(wantDw[a]).margin(1e-6));
    if (slot[a] < 0)
      CHECK(outs[1].f[a] == 0.0f);
  }
}

TEST_CASE("expert_linear multiplies each expert's slots by its weight",
          "[kernels][forward][moe]") {
  Rng rng(60);
  const int64_t experts = 3, capacity = 4, in = 5, out = 2;
  Tensor buf = randomF32(rng, {experts * capacity, in});
  Tensor w = randomF32(rng, {experts, in, out});
  std::vector<Tensor> ins = {buf, w};
  std::vector<Tensor> outs = {Tensor::f32({experts * capacity, out})};
  mustRun(K("expert_linear").i("experts", experts), ins, outs);
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t c = 0; c < capacity; ++c)
      for (int64_t m = 0; m < out; ++m) {
        double want = 0;
        for (int64_t j = 0; j < in; ++j)
          want += double(buf.f[(e * capacity + c) * in + j]) *
                  w.f[(e * in + j) * out + m];
        CHECK(outs[0].f[(e * capacity + c) * out + m] ==
              Approx(want).margin(1e-5));
      }
}

TEST_CASE("moe_aux_loss is E * sum_e f_e P_e", "[kernels][forward][moe]") {
  SECTION("perfectly uniform routing gives 1") {
    // Equal logits: P_e = 1/4. Each expert chosen twice out of N k = 8.
    std::vector<Tensor> ins = {Tensor::f32({4, 4}),
                               Tensor::i32({4, 2}, {0, 1, 2, 3, 3, 0, 1, 2})};
    std::fill(ins[0].f.begin(), ins[0].f.end(), 0.7f);
    std::vector<Tensor> outs = {Tensor::f32({})};
    mustRun(K("moe_aux_loss").i("experts", 4).i("top_k", 2), ins, outs);
    CHECK(outs[0].f[0] == Approx(1.0));
  }
  SECTION("collapsed routing approaches E") {
    std::vector<Tensor> ins = {Tensor::f32({2, 4}, {50, 0, 0, 0, 60, 1, 2, 3}),
                               Tensor::i32({2, 1}, {0, 0})};
    std::vector<Tensor> outs = {Tensor::f32({1})};
    mustRun(K("moe_aux_loss").i("experts", 4).i("top_k", 1), ins, outs);
    CHECK(outs[0].f[0] == Approx(4.0).epsilon(1e-6));
  }
  SECTION("random routing matches a direct evaluation") {
    Rng rng(61);
    const int64_t rows = 7, experts = 5, k = 2;
    Tensor logits = randomF32(rng, {rows, experts}, -2.0, 2.0);
    Tensor indices = randomIndices(rng, rows, k, experts);
    std::vector<Tensor> ins = {logits, indices};
    std::vector<Tensor> outs = {Tensor::f32({})};
    mustRun(K("moe_aux_loss").i("experts", experts).i("top_k", k), ins, outs);
    std::vector<double> f(experts, 0.0), P(experts, 0.0);
    for (int32_t e : indices.i)
      f[e] += 1.0 / (rows * k);
    for (int64_t n = 0; n < rows; ++n) {
      std::vector<double> p =
          refSoftmax(logits.f.data() + n * experts, experts);
      for (int64_t e = 0; e < experts; ++e)
        P[e] += p[e] / rows;
    }
    double want = 0;
    for (int64_t e = 0; e < experts; ++e)
      want += experts * f[e] * P[e];
    CHECK(outs[0].f[0] == Approx(want).epsilon(1e-6));
  }
}

TEST_CASE("router, dispatch, expert_linear and combine compose into a MoE "
          "layer",
          "[kernels][forward][moe]") {
  const int64_t capacity = GENERATE(2, 6);
  INFO("capacity=" << capacity);
  Rng rng(62);
  const int64_t rows = 6, experts = 4, k = 2, hidden = 3, out = 2;
  const int64_t slots = experts * capacity;
  Tensor x = randomF32(rng, {rows, hidden});
  Tensor logits = randomF32(rng, {rows, experts}, -2.0, 2.0);
  Tensor w = randomF32(rng, {experts, hidden, out});

  std::vector<Tensor> ins = {logits};
  std::vector<Tensor> route = {
      Tensor::i32({rows, k}, std::vector<int32_t>(rows * k)),
      Tensor::f32({rows, k})};
  mustRun(routerKernel("moe_router", k, 1), ins, route);
  ins = {x, route[0]};
  std::vector<Tensor> buf = {Tensor::f32({slots, hidden})};
  mustRun(slotKernel("moe_dispatch", experts, capacity), ins, buf);
  ins = {buf[0], w};
  std::vector<Tensor> ebuf = {Tensor::f32({slots, out})};
  mustRun(K("expert_linear").i("experts", experts), ins, ebuf);
  ins = {ebuf[0], route[0], route[1]};
  std::vector<Tensor> y = {Tensor::f32({rows, out})};
  mustRun(slotKernel("moe_combine", experts, capacity), ins, y);

  // Per token: the weighted outputs of its kept experts, directly.
  std::vector<int64_t> slot = refSlots(route[0].i, experts, capacity);
  int64_t dropped = 0;
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t m = 0; m < out; ++m) {
      double want = 0;
      for (int64_t j = 0; j < k; ++j) {
        if (slot[n * k + j] < 0) {
          dropped += m == 0;
          continue;
        }
        int32_t e = route[0].i[n * k + j];
        double dot = 0;
        for (int64_t h = 0; h < hidden; ++h)
          dot += double(x.f[n * hidden + h]) * w.f[(e * hidden + h) * out + m];
        want += route[1].f[n * k + j] * dot;
      }
      CHECK(y[0].f[n * out + m] == Approx(want).margin(1e-5));
    }
  CHECK((dropped > 0) == (capacity < rows));
}

TEST_CASE("moe_router_grad is the gradient of the router weights",
          "[kernels][grad][moe]") {
  const int64_t k = GENERATE(1, 2, 3);
  const int64_t norm = GENERATE(0, 1);
  INFO("top_k=" << k << " norm_topk=" << norm);
  Rng rng(70 + k);
  const int64_t rows = 4, experts = 5;
  Tensor logits = separatedLogits(rng, rows, experts);
  std::vector<float> r = rng.vec(rows * k);
  K forward = routerKernel("moe_router", k, norm);

  std::vector<Tensor> ins = {logits};
  std::vector<Tensor> fwdOuts = {
      Tensor::i32({rows, k}, std::vector<int32_t>(rows * k)),
      Tensor::f32({rows, k})};
  mustRun(forward, ins, fwdOuts);

  ins = {logits, fwdOuts[0], Tensor::f32({rows, k}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, experts})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be overwritten
  mustRun(routerKernel("moe_router_grad", k, norm), ins, outs);
  if (k == 1 && norm == 1) // the weight is the constant 1
    CHECK(outs[0].f == std::vector<float>(rows * experts, 0.0f));
  else
    requireNonZero(outs[0].f);
  for (int64_t n = 0; n < rows; ++n) {
    double rowSum = 0; // softmax gradients sum to 0 over a row
    for (int64_t e = 0; e < experts; ++e)
      rowSum += outs[0].f[n * experts + e];
    CHECK(rowSum == Approx(0.0).margin(1e-6));
  }
  checkGradientOf(forward, {logits}, 0, fwdOuts, 1, r, outs[0].f);
}

TEST_CASE("moe_router_grad defaults to norm_topk = 1", "[kernels][grad][moe]") {
  Rng rng(75);
  Tensor logits = separatedLogits(rng, 3, 4);
  Tensor indices = randomIndices(rng, 3, 2, 4);
  Tensor dw = randomF32(rng, {3, 2});
  std::vector<Tensor> ins = {logits, indices, dw};
  std::vector<Tensor> plain = {Tensor::f32({3, 4})};
  std::vector<Tensor> explicitOut = {Tensor::f32({3, 4})};
  mustRun(routerKernel("moe_router_grad", 2, -1), ins, plain);
  mustRun(routerKernel("moe_router_grad", 2, 1), ins, explicitOut);
  CHECK(plain[0].f == explicitOut[0].f);
}

TEST_CASE("moe_dispatch_grad is the gradient of moe_dispatch",
          "[kernels][grad][moe]") {
  Rng rng(76);
  const int64_t rows = 6, k = 2, experts = 3, capacity = 3, hidden = 4;
  const int64_t slots = experts * capacity; // 9 slots for 12 assignments
  Tensor x = randomF32(rng, {rows, hidden});
  Tensor indices = randomIndices(rng, rows, k, experts);
  std::vector<float> r = rng.vec(slots * hidden);
  K forward = slotKernel("moe_dispatch", experts, capacity);

  std::vector<Tensor> ins = {indices, Tensor::f32({slots, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, hidden})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f);
  mustRun(slotKernel("moe_dispatch_grad", experts, capacity), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, {x, indices}, 0, {slots, hidden}, r, outs[0].f);
}

TEST_CASE("moe_combine_grad is the gradient of moe_combine",
          "[kernels][grad][moe]") {
  Rng rng(77);
  const int64_t rows = 6, k = 2, experts = 4, capacity = 2, hidden = 3;
  const int64_t slots = experts * capacity; // 8 slots for 12 assignments
  Tensor indices = randomIndices(rng, rows, k, experts);
  std::vector<int64_t> slot = refSlots(indices.i, experts, capacity);
  REQUIRE(std::count(slot.begin(), slot.end(), -1) >= 4);
  Tensor ebuf = randomF32(rng, {slots, hidden});
  Tensor weights = randomF32(rng, {rows, k}, 0.0, 1.0);
  std::vector<float> r = rng.vec(rows * hidden);
  K forward = slotKernel("moe_combine", experts, capacity);

  std::vector<Tensor> ins = {ebuf, indices, weights,
                             Tensor::f32({rows, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({slots, hidden}),
                              Tensor::f32({rows, k})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f);
  std::fill(outs[1].f.begin(), outs[1].f.end(), 9.0f);
  mustRun(slotKernel("moe_combine_grad", experts, capacity), ins, outs);
  for (const Tensor &g : outs)
    requireNonZero(g.f);
  for (int64_t a = 0; a < rows * k; ++a)
    if (slot[a] < 0)
      CHECK(outs[1].f[a] == 0.0f);
  checkGradient(forward, {ebuf, indices, weights}, 0, {rows, hidden}, r,
                outs[0].f);
  checkGradient(forward, {ebuf, indices, weights}, 2, {rows, hidden}, r,
                outs[1].f);
}

TEST_CASE("expert_linear gradients", "[kernels][grad][moe]") {
  Rng rng(78);
  const int64_t experts = 3, capacity = 2, in = 4, out = 3;
  const int64_t rows = experts * capacity;
  Tensor buf = randomF32(rng, {rows, in});
  Tensor w = randomF32(rng, {experts, in, out});
  std::vector<float> r = rng.vec(rows * out);
  Tensor dy = Tensor::f32({rows, out}, r);
  K forward = K("expert_linear").i("experts", experts);

  std::vector<Tensor> ins = {dy, w};
  std::vector<Tensor> outs = {Tensor::f32({rows, in})};
  mustRun(K("expert_linear_grad_input").i("experts", experts), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, {buf, w}, 0, {rows, out}, r, outs[0].f);
  // `experts` is optional in the gradients: w's first dimension.
  std::vector<Tensor> noAttr = {Tensor::f32({rows, in})};
  mustRun(K("expert_linear_grad_input"), ins, noAttr);
  CHECK(noAttr[0].f == outs[0].f);

  ins = {buf, dy};
  outs = {Tensor::f32({experts, in, out})};
  mustRun(K("expert_linear_grad_weight").i("experts", experts), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, {buf, w}, 1, {rows, out}, r, outs[0].f);
  noAttr = {Tensor::f32({experts, in, out})};
  mustRun(K("expert_linear_grad_weight"), ins, noAttr);
  CHECK(noAttr[0].f == outs[0].f);
}

TEST_CASE("moe_aux_loss_grad is the gradient of scale * moe_aux_loss",
          "[kernels][grad][moe]") {
  Rng rng(79);
  const int64_t rows = 5, experts = 4, k = 2;
  Tensor logits = randomF32(rng, {rows, experts}, -2.0, 2.0);
  Tensor indices = randomIndices(rng, rows, k, experts);
  const double scale = 2.5;
  K forward = K("moe_aux_loss").i("experts", experts).i("top_k", k);

  std::vector<Tensor> ins = {logits, indices};
  std::vector<Tensor> outs = {Tensor::f32({rows, experts})};
  mustRun(K("moe_aux_loss_grad")
              .i("experts", experts)
              .i("top_k", k)
              .f("scale", scale),
          ins, outs);
  requireNonZero(outs[0].f);
  for (int64_t n = 0; n < rows; ++n) {
    double rowSum = 0;
    for (int64_t e = 0; e < experts; ++e)
      rowSum += outs[0].f[n * experts + e];
    CHECK(rowSum == Approx(0.0).margin(1e-6));
  }
  checkGradient(forward, {logits, indices}, 0, {}, {float(scale)}, outs[0].f);

  // The default scale is 1.
  std::vector<Tensor> unit = {Tensor::f32({rows, experts})};
  mustRun(K("moe_aux_loss_grad").i("experts", experts).i("top_k", k), ins,
          unit);
  for (int64_t i = 0; i < rows * experts; ++i)
    CHECK(unit[0].f[i] * scale == Approx(outs[0].f[i]).margin(1e-7));
}

TEST_CASE("MoE kernels reject bad operands and attributes",
          "[kernels][errors][moe]") {
  Tensor logits = Tensor::f32({2, 4});
  auto routerOuts = [](int64_t rows, int64_t k) {
    return std::vector<Tensor>{
        Tensor::i32({rows, k}, std::vector<int32_t>(rows * k)),
        Tensor::f32({rows, k})};
  };
  CHECK(mustFail(K("moe_router"), {logits}, routerOuts(2, 2)) ==
        "moe_router: missing attribute 'top_k'");
  CHECK(
      mustFail(routerKernel("moe_router", 0, 1), {logits}, routerOuts(2, 0)) ==
      "moe_router: attribute 'top_k' must be positive, got 0");
  CHECK(
      mustFail(routerKernel("moe_router", 5, 1), {logits}, routerOuts(2, 5)) ==
      "moe_router: attribute 'top_k' 5 exceeds the number of experts 4");
  CHECK(
      mustFail(routerKernel("moe_router", 2, 2), {logits}, routerOuts(2, 2)) ==
      "moe_router: attribute 'norm_topk' must be 0 or 1, got 2");
  CHECK(
      mustFail(routerKernel("moe_router", 2, 1), {logits}, routerOuts(2, 3)) ==
      "moe_router: indices has shape [2,3], expected [2,2]");
  CHECK(mustFail(routerKernel("moe_router", 2, 1), {logits},
                 {Tensor::f32({2, 2}), Tensor::f32({2, 2})}) ==
        "moe_router: indices must be i32, got f32");
  mustFail(routerKernel("moe_router", 2, 1), {logits},
           {routerOuts(2, 2)[0], Tensor::f32({2, 3})});
  mustFail(routerKernel("moe_router", 2, 1), {Tensor::f32({8})},
           routerOuts(2, 2));
  mustFail(routerKernel("moe_router", 1, 1), {Tensor::f32({2, 0})},
           routerOuts(2, 1));

  Tensor idx = Tensor::i32({2, 2}, {0, 3, 1, 4});
  CHECK(mustFail(routerKernel("moe_router_grad", 2, 1),
                 {logits, idx, Tensor::f32({2, 2})}, {Tensor::f32({2, 4})}) ==
        "moe_router_grad: indices[3] = 4 is out of range [0, 4)");
  Tensor okIdx = Tensor::i32({2, 2}, {0, 3, 1, 2});
  mustFail(routerKernel("moe_router_grad", 2, 1),
           {logits, okIdx, Tensor::f32({2, 3})}, {Tensor::f32({2, 4})});
  mustFail(routerKernel("moe_router_grad", 2, 1),
           {logits, okIdx, Tensor::f32({2, 2})}, {Tensor::f32({2, 3})});
  mustFail(routerKernel("moe_router_grad", 3, 1),
           {logits, okIdx, Tensor::f32({2, 2})}, {Tensor::f32({2, 4})});

  // Dispatch family: E = 3, C = 2, so slot buffers have 6 rows.
  Tensor x = Tensor::f32({2, 2});
  CHECK(mustFail(K("moe_dispatch").i("experts", 3), {x, okIdx},
                 {Tensor::f32({6, 2})}) ==
        "moe_dispatch: missing attribute 'capacity'");
  CHECK(mustFail(slotKernel("moe_dispatch", 3, 0), {x, okIdx},
                 {Tensor::f32({0, 2})}) ==
        "moe_dispatch: attribute 'capacity' must be positive, got 0");
  CHECK(mustFail(slotKernel("moe_dispatch", 3, 2), {x, okIdx},
                 {Tensor::f32({5, 2})}) ==
        "moe_dispatch: buf has shape [5,2], expected [6,*] (experts 3 * "
        "capacity 2)");
  CHECK(mustFail(slotKernel("moe_dispatch", 3, 2), {x, okIdx},
                 {Tensor::f32({6, 2})}) ==
        "moe_dispatch: indices[1] = 3 is out of range [0, 3)");
  mustFail(slotKernel("moe_dispatch", 3, 2),
           {x, Tensor::i32({2, 2}, {0, -1, 1, 2})}, {Tensor::f32({6, 2})});
  mustFail(slotKernel("moe_dispatch", 4, 2), {Tensor::f32({3, 2}), okIdx},
           {Tensor::f32({8, 2})});
  mustFail(slotKernel("moe_dispatch", 4, 2), {x, Tensor::f32({2, 2})},
           {Tensor::f32({8, 2})});
  mustFail(slotKernel("moe_dispatch", 4, 2),
           {x, Tensor::i32({4}, {0, 1, 2, 3})}, {Tensor::f32({8, 2})});
  CHECK(mustFail(slotKernel("moe_dispatch", int64_t(1) << 40, int64_t(1) << 40),
                 {x, okIdx}, {Tensor::f32({6, 2})}) ==
        "moe_dispatch: attributes 'experts' * 'capacity' overflow");
  mustFail(slotKernel("moe_dispatch_grad", 4, 2), {okIdx, Tensor::f32({8, 2})},
           {Tensor::f32({2, 3})});
  mustFail(slotKernel("moe_dispatch_grad", 4, 2), {okIdx, Tensor::f32({6, 2})},
           {Tensor::f32({2, 2})});

  Tensor ebuf = Tensor::f32({8, 2}), w = Tensor::f32({2, 2});
  CHECK(mustFail(slotKernel("moe_combine", 4, 2),
                 {ebuf, okIdx, Tensor::f32({2, 1})}, {Tensor::f32({2, 2})}) ==
        "moe_combine: weights has shape [2,1], expected [2,2]");
  mustFail(slotKernel("moe_combine", 4, 2), {Tensor::f32({6, 2}), okIdx, w},
           {Tensor::f32({2, 2})});
  mustFail(slotKernel("moe_combine", 4, 2), {ebuf, okIdx, w},
           {Tensor::f32({2, 3})});
  mustFail(slotKernel("moe_combine", 3, 2), {Tensor::f32({6, 2}), okIdx, w},
           {Tensor::f32({2, 2})});
  mustFail(slotKernel("moe_combine_grad", 4, 2),
           {ebuf, okIdx, w, Tensor::f32({2, 2})},
           {Tensor::f32({8, 3}), Tensor::f32({2, 2})});
  mustFail(slotKernel("moe_combine_grad", 4, 2),
           {ebuf, okIdx, w, Tensor::f32({2, 2})},
           {Tensor::f32({8, 2}), Tensor::f32({2, 1})});
  mustFail(slotKernel("moe_combine_grad", 4, 2),
           {ebuf, okIdx, w, Tensor::f32({3, 2})},
           {Tensor::f32({8, 2}), Tensor::f32({2, 2})});

  // expert_linear: buf [E*C,K], w [E,K,M].
  Tensor buf = Tensor::f32({6, 3}), ew = Tensor::f32({2, 3, 4});
  CHECK(mustFail(K("expert_linear"), {buf, ew}, {Tensor::f32({6, 4})}) ==
        "expert_linear: missing attribute 'experts'");
  CHECK(mustFail(K("expert_linear").i("experts", 3), {buf, ew},
                 {Tensor::f32({6, 4})}) ==
        "expert_linear: attribute 'experts' is 3 but w has 2 experts");
  CHECK(mustFail(K("expert_linear").i("experts", 2), {Tensor::f32({5, 3}), ew},
                 {Tensor::f32({5, 4})}) ==
        "expert_linear: buf has shape [5,3], rows not a multiple of experts 2");
  CHECK(mustFail(K("expert_linear").i("experts", 2), {Tensor::f32({6, 2}), ew},
                 {Tensor::f32({6, 4})}) ==
        "expert_linear: w has shape [2,3,4], expected [2,2,*]");
  mustFail(K("expert_linear").i("experts", 2), {buf, Tensor::f32({6, 4})},
           {Tensor::f32({6, 4})});
  mustFail(K("expert_linear").i("experts", 2), {buf, ew},
           {Tensor::f32({6, 3})});
  mustFail(K("expert_linear_grad_input"), {Tensor::f32({6, 3}), ew},
           {Tensor::f32({6, 3})});
  mustFail(K("expert_linear_grad_input").i("experts", 3),
           {Tensor::f32({6, 4}), ew}, {Tensor::f32({6, 3})});
  mustFail(K("expert_linear_grad_input"), {Tensor::f32({6, 4}), ew},
           {Tensor::f32({6, 4})});
  mustFail(K("expert_linear_grad_weight"), {buf, Tensor::f32({5, 4})},
           {Tensor::f32({2, 3, 4})});
  mustFail(K("expert_linear_grad_weight"), {buf, Tensor::f32({6, 4})},
           {Tensor::f32({2, 4, 4})});
  mustFail(K("expert_linear_grad_weight").i("experts", 3),
           {buf, Tensor::f32({6, 4})}, {Tensor::f32({2, 3, 4})});
  mustFail(K("expert_linear_grad_weight"), {buf, Tensor::f32({6, 4})},
           {Tensor::f32({12, 4})});

  // moe_aux_loss: logits [N,E], indices [N,k].
  K aux = K("moe_aux_loss").i("experts", 4).i("top_k", 2);
  CHECK(mustFail(K("moe_aux_loss").i("experts", 5).i("top_k", 2),
                 {logits, okIdx}, {Tensor::f32({})}) ==
        "moe_aux_loss: attribute 'experts' is 5 but logits has 4 columns");
  CHECK(mustFail(K("moe_aux_loss").i("experts", 4).i("top_k", 1),
                 {logits, okIdx}, {Tensor::f32({})}) ==
        "moe_aux_loss: indices has shape [2,2], expected [2,1]");
  mustFail(K("moe_aux_loss").i("experts", 4), {logits, okIdx},
           {Tensor::f32({})});
  mustFail(K("moe_aux_loss").i("experts", 4).i("top_k", 5),
           {logits, Tensor::i32({2, 5}, std::vector<int32_t>(10))},
           {Tensor::f32({})});
  CHECK(mustFail(aux, {Tensor::f32({0, 4}), Tensor::i32({0, 2}, {})},
                 {Tensor::f32({})}) ==
        "moe_aux_loss: logits has shape [0,4], expected at least one row");
  mustFail(aux, {logits, idx}, {Tensor::f32({})});
  mustFail(aux, {logits, okIdx}, {Tensor::f32({2})});
  mustFail(K("moe_aux_loss_grad").i("experts", 4).i("top_k", 2),
           {logits, okIdx}, {Tensor::f32({2, 3})});
  mustFail(K("moe_aux_loss_grad")
               .i("experts", 4)
               .i("top_k", 2)
               .f("scale", std::nan("")),
           {logits, okIdx}, {Tensor::f32({2, 4})});
}

TEST_CASE("MoE kernels handle empty batches and huge expert counts cheaply",
          "[kernels][errors][moe]") {
  // No tokens: every slot is unused.
  std::vector<Tensor> ins = {Tensor::f32({0, 2}), Tensor::i32({0, 2}, {})};
  std::vector<Tensor> outs = {Tensor::f32({4, 2}, {1, 1, 1, 1, 1, 1, 1, 1})};
  mustRun(slotKernel("moe_dispatch", 2, 2), ins, outs);
  CHECK(outs[0].f == std::vector<float>(8, 0.0f));
  ins = {Tensor::f32({0, 3})};
  std::vector<Tensor> route = {Tensor::i32({0, 2}, {}), Tensor::f32({0, 2})};
  mustRun(routerKernel("moe_router", 2, 1), ins, route);

  // Zero slots per expert: the weight gradient is zero.
  ins = {Tensor::f32({0, 3}), Tensor::f32({0, 2})};
  outs = {Tensor::f32({2, 3, 2}, std::vector<float>(12, 5.0f))};
  mustRun(K("expert_linear_grad_weight").i("experts", 2), ins, outs);
  CHECK(outs[0].f == std::vector<float>(12, 0.0f));

  // 2^40 experts with zero-width buffers: no per-expert table or loop.
  const int64_t huge = int64_t(1) << 40;
  ins = {Tensor::f32({2, 0}), Tensor::i32({2, 1}, {7, 7})};
  outs = {Tensor::f32({huge, 0})};
  mustRun(slotKernel("moe_dispatch", huge, 1), ins, outs);
  outs = {Tensor::f32({huge, 0})};
  ins = {Tensor::f32({huge, 0}), Tensor::f32({huge, 0, 0})};
  mustRun(K("expert_linear").i("experts", huge), ins, outs);
}

TEST_CASE("expert parallelism: counts, pack, gather and their inverses move "
          "every member's slots to the member owning the expert",
          "[kernels][moe][ep]") {
  const int64_t members = GENERATE(1, 2, 4);
  const int64_t capacity = GENERATE(1, 3, 8);
  INFO("members=" << members << " capacity=" << capacity);
  const int64_t experts = 4, local = experts / members, rows = 6, k = 2,
                hidden = 3, slots = experts * capacity;
  Rng rng(90 + members * 10 + capacity);
  auto ep = [&](const std::string &op) {
    return slotKernel(op, experts, capacity).i("members", members);
  };
  // Each member dispatches its own tokens, counts and packs them.
  std::vector<Tensor> buf, packed, counts, sends;
  for (int64_t m = 0; m < members; ++m) {
    std::vector<Tensor> in = {randomF32(rng, {rows, hidden}),
                              randomIndices(rng, rows, k, experts)};
    std::vector<Tensor> b = {Tensor::f32({slots, hidden})};
    mustRun(slotKernel("moe_dispatch", experts, capacity), in, b);
    std::vector<Tensor> cin = {in[1]};
    std::vector<Tensor> c = {
        Tensor::i32({members}, std::vector<int32_t>(members)),
        Tensor::i32({experts, 1}, std::vector<int32_t>(experts)),
        Tensor::i32({members}, std::vector<int32_t>(members))};
    mustRun(ep("moe_ep_counts"), cin, c);
    // The counts are the rows dispatch filled: expert e's used slots.
    for (int64_t e = 0; e < experts; ++e) {
      int64_t used = 0;
      for (int64_t s = 0; s < capacity; ++s)
        for (int64_t h = 0; h < hidden; ++h)
          used = b[0].f[(e * capacity + s) * hidden + h] != 0 ? s + 1 : used;
      CHECK(c[1].i[e] == used);
    }
    for (int64_t j = 0; j < members; ++j) {
      int64_t sum = 0;
      for (int64_t e = j * local; e < (j + 1) * local; ++e)
        sum += c[1].i[e];
      CHECK(c[0].i[j] == sum);
      CHECK(c[2].i[j] == local);
    }
    std::vector<Tensor> pin = {b[0], c[1]};
    std::vector<Tensor> p = {Tensor::f32({slots, hidden})};
    mustRun(slotKernel("moe_ep_pack", experts, capacity), pin, p);
    // unpack(pack(x)) restores the dispatch buffer exactly.
    std::vector<Tensor> uin = {p[0], c[1]};
    std::vector<Tensor> u = {Tensor::f32({slots, hidden})};
    mustRun(slotKernel("moe_ep_unpack", experts, capacity), uin, u);
    CHECK(u[0].f == b[0].f);
    buf.push_back(b[0]);
    packed.push_back(p[0]);
    counts.push_back(c[1]);
    sends.push_back(c[0]);
  }
  // The all-to-alls, by hand: member j receives, from each source in order,
  // that source's rows for j's experts and their L counts.
  for (int64_t j = 0; j < members; ++j) {
    Tensor recv = Tensor::f32({slots, hidden});
    std::vector<int32_t> recvCounts;
    int64_t at = 0;
    for (int64_t src = 0; src < members; ++src) {
      int64_t offset = 0;
      for (int64_t d = 0; d < j; ++d)
        offset += sends[src].i[d];
      std::copy_n(packed[src].f.begin() + offset * hidden,
                  sends[src].i[j] * hidden, recv.f.begin() + at * hidden);
      at += sends[src].i[j];
      for (int64_t l = 0; l < local; ++l)
        recvCounts.push_back(counts[src].i[j * local + l]);
    }
    Tensor rc = Tensor::i32({experts, 1}, recvCounts);
    std::vector<Tensor> gin = {recv, rc};
    std::vector<Tensor> g = {Tensor::f32({slots, hidden})};
    mustRun(ep("moe_ep_gather"), gin, g);
    // Local expert l's slots: every source's used rows of expert j*L+l, in
    // source order, then zeros.
    for (int64_t l = 0; l < local; ++l) {
      std::vector<float> want;
      for (int64_t src = 0; src < members; ++src) {
        int64_t e = j * local + l;
        auto first = buf[src].f.begin() + e * capacity * hidden;
        want.insert(want.end(), first, first + counts[src].i[e] * hidden);
      }
      want.resize(members * capacity * hidden, 0.0f);
      auto first = g[0].f.begin() + l * members * capacity * hidden;
      CHECK(std::vector<float>(first, first + want.size()) == want);
    }
    // scatter(gather(recv)) == recv.
    std::vector<Tensor> sin = {g[0], rc};
    std::vector<Tensor> sc = {Tensor::f32({slots, hidden})};
    mustRun(ep("moe_ep_scatter"), sin, sc);
    CHECK(sc[0].f == recv.f);
  }
}

TEST_CASE("expert parallelism kernels reject bad counts and layouts",
          "[kernels][moe][ep]") {
  Tensor x = Tensor::f32({8, 2});
  Tensor over = Tensor::i32({4, 1}, {1, 3, 0, 0});
  CHECK(mustFail(slotKernel("moe_ep_pack", 4, 2), {x, over},
                 {Tensor::f32({8, 2})})
            .find("expert_counts[1] is 3, outside [0, capacity 2]") !=
        std::string::npos);
  Tensor ok = Tensor::i32({4, 1}, {1, 2, 0, 0});
  CHECK(mustFail(slotKernel("moe_ep_gather", 4, 2).i("members", 3), {x, ok},
                 {Tensor::f32({8, 2})})
            .find("'members' 3 does not divide 'experts' 4") !=
        std::string::npos);
  CHECK(mustFail(slotKernel("moe_ep_unpack", 4, 2), {Tensor::f32({6, 2}), ok},
                 {Tensor::f32({8, 2})})
            .find("expected [8,*]") != std::string::npos);
}

// The dense CPU kernels: embedding, positions, linear, elementwise ops,
// tensor- and sequence-parallel layouts, the losses and the state kernels
// (accumulate, zero, AdamW), forward and backward.
#include <cstring>
#include <limits>
#include <tuple>

#include "runtime/kernels/kernels_test_util.h"

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

TEST_CASE("bias_add adds the bias to every row", "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::f32({2, 3}, {1, 2, 3, 4, 5, 6}),
                             Tensor::f32({3}, {10, 20, 30})};
  std::vector<Tensor> outs = {Tensor::f32({2, 3})};
  mustRun(K("bias_add"), ins, outs);
  CHECK(outs[0].f == std::vector<float>{11, 22, 33, 14, 25, 36});
  // Its bias gradient is bias_grad (column sums of dy), checked against
  // finite differences of bias_add.
  Rng rng(31);
  std::vector<Tensor> fwdIns = {randomF32(rng, {4, 5}, -1.0, 1.0),
                                randomF32(rng, {5}, -1.0, 1.0)};
  Tensor dy = randomF32(rng, {4, 5}, -1.0, 1.0);
  std::vector<Tensor> db = {Tensor::f32({5})};
  std::vector<Tensor> dyIn = {dy};
  mustRun(K("bias_grad"), dyIn, db);
  requireNonZero(db[0].f);
  checkGradient(K("bias_add"), fwdIns, 1, {4, 5}, dy.f, db[0].f);
  // And its input gradient is dy itself.
  checkGradient(K("bias_add"), fwdIns, 0, {4, 5}, dy.f, dy.f);
}

TEST_CASE("sp_split keeps the context's member's rows", "[kernels][forward]") {
  // 4 rows of 2 over 2 members: member 1 keeps rows 2 and 3.
  std::vector<Tensor> ins = {Tensor::f32({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7})};
  std::vector<Tensor> outs = {Tensor::f32({2, 2})};
  KernelContext ctx;
  ctx.tensorMember = 1;
  REQUIRE(run(K("sp_split").i("members", 2), ins, outs, ctx).isOk());
  CHECK(outs[0].f == std::vector<float>{4, 5, 6, 7});
  ctx.tensorMember = 0;
  REQUIRE(run(K("sp_split").i("members", 2), ins, outs, ctx).isOk());
  CHECK(outs[0].f == std::vector<float>{0, 1, 2, 3});
  // Errors: members that do not divide the rows, a member out of range.
  std::vector<Tensor> three = {Tensor::f32({3, 2})};
  CHECK(run(K("sp_split").i("members", 2), three, outs, ctx)
            .message()
            .find("must be at least 2 and divide the 3 rows") !=
        std::string::npos);
  ctx.tensorMember = 2;
  CHECK(run(K("sp_split").i("members", 2), ins, outs, ctx)
            .message()
            .find("tensor-parallel member 2 is not one of 2") !=
        std::string::npos);
}

TEST_CASE("columns and columns_grad copy consecutive columns",
          "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::f32({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7})};
  std::vector<Tensor> outs = {Tensor::f32({2, 2})};
  mustRun(K("columns").i("start", 1), ins, outs);
  CHECK(outs[0].f == std::vector<float>{1, 2, 5, 6});
  // The gradient puts them back among zeros (overwriting the output).
  std::vector<Tensor> wide = {Tensor::f32({2, 4}, std::vector<float>(8, 9))};
  mustRun(K("columns_grad").i("start", 1), outs, wide);
  CHECK(wide[0].f == std::vector<float>{0, 1, 2, 0, 0, 5, 6, 0});
  // Errors: columns past the end, rows that differ, no start.
  CHECK(run(K("columns").i("start", 3), ins, outs)
            .message()
            .find("columns [3, 5) are not columns of a matrix of 4") !=
        std::string::npos);
  std::vector<Tensor> threeRows = {Tensor::f32({3, 2})};
  CHECK(run(K("columns").i("start", 0), ins, threeRows)
            .message()
            .find("must have the same rows") != std::string::npos);
  CHECK(run(K("columns"), ins, outs).message().find("start") !=
        std::string::npos);
}

TEST_CASE("tp_kv_assemble gives each member its key/value head whole",
          "[kernels][forward]") {
  // T = 4 members, K = 2 key/value heads of hd = 2: members 0, 1 share head
  // 0, members 2, 3 head 1; each holds one column (p = 1) of its head's k
  // and of its v, after q = 2 query columns. Two rows (h = 2).
  const int64_t members = 4, rows = 2;
  // Gathered pieces [members * rows, 2]: member j's row i is
  // [k = 10 j + i, v = 100 + 10 j + i].
  std::vector<float> pieces;
  for (int64_t j = 0; j < members; ++j)
    for (int64_t i = 0; i < rows; ++i)
      pieces.insert(pieces.end(), {float(10 * j + i), float(100 + 10 * j + i)});
  for (int64_t m = 0; m < members; ++m) {
    KernelContext ctx;
    ctx.tensorMember = m;
    // The member's own weight: q columns [-1, -2] (row 0), [-3, -4] (row
    // 1), then its pieces.
    std::vector<Tensor> ins = {
        Tensor::f32({rows, 4},
                    {-1, -2, pieces[(m * rows) * 2], pieces[(m * rows) * 2 + 1],
                     -3, -4, pieces[(m * rows + 1) * 2],
                     pieces[(m * rows + 1) * 2 + 1]}),
        Tensor::f32({members * rows, 2}, pieces)};
    std::vector<Tensor> outs = {Tensor::f32({rows, 6})};
    K k("tp_kv_assemble");
    k.i("members", members).i("query", 2);
    REQUIRE(run(k, ins, outs, ctx).isOk());
    const float a = float(10 * (m / 2 * 2)), b = a + 10;
    CHECK(outs[0].f == std::vector<float>{-1, -2, a, b, 100 + a, 100 + b, -3,
                                          -4, a + 1, b + 1, 101 + a, 101 + b});
    // Its gradient is the adjoint on the pieces: <assemble(w, P), dy> =
    // <w's query columns, dy's> + <P, assemble_grad(dy)>, exact on integers.
    Rng rng(40 + m);
    std::vector<float> dy(rows * 6);
    for (float &x : dy)
      x = float(int(rng.uniform(-8, 8)));
    std::vector<Tensor> dyIn = {Tensor::f32({rows, 6}, dy)};
    std::vector<Tensor> dp = {
        Tensor::f32({members * rows, 2}, std::vector<float>(16, 7))};
    K g("tp_kv_assemble_grad");
    g.i("members", members).i("query", 2);
    REQUIRE(run(g, dyIn, dp, ctx).isOk());
    double lhs = 0, rhs = 0;
    for (size_t e = 0; e < dy.size(); ++e)
      lhs += double(outs[0].f[e]) * dy[e];
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < 2; ++j)
        rhs += double(ins[0].f[i * 4 + j]) * dy[i * 6 + j];
    for (size_t e = 0; e < pieces.size(); ++e)
      rhs += double(pieces[e]) * dp[0].f[e];
    CHECK(lhs == rhs);
    // Rows of members outside the head's group are zero.
    for (int64_t j = 0; j < members; ++j)
      if (j / 2 != m / 2)
        for (int64_t e = 0; e < rows * 2; ++e)
          CHECK(dp[0].f[j * rows * 2 + e] == 0);
  }
  // Errors: pieces of the wrong rows, an assembled width that is not a
  // multiple of the pieces, a member out of range.
  KernelContext ctx;
  K k("tp_kv_assemble");
  k.i("members", members).i("query", 2);
  std::vector<Tensor> w = {Tensor::f32({rows, 4}), Tensor::f32({6, 2})};
  std::vector<Tensor> y = {Tensor::f32({rows, 6})};
  CHECK(run(k, w, y, ctx).message().find("the pieces must be") !=
        std::string::npos);
  w[1] = Tensor::f32({members * rows, 2});
  std::vector<Tensor> odd = {Tensor::f32({rows, 5})};
  CHECK(run(k, w, odd, ctx)
            .message()
            .find("key/value columns must be r "
                  "times") != std::string::npos);
  ctx.tensorMember = 4;
  CHECK(run(k, w, y, ctx)
            .message()
            .find("tensor-parallel member 4 is not "
                  "one of 4") != std::string::npos);
}

TEST_CASE("swiglu multiplies silu(gate) by up", "[kernels][forward]") {
  // F = 3; rows are [gate(3) | up(3)].
  std::vector<Tensor> ins = {Tensor::f32({2, 6}, {0, 1, -2, 5, 2, 3, //
                                                  4, -30, 30, 1, 1, -0.5f})};
  std::vector<Tensor> outs = {Tensor::f32({2, 3})};
  mustRun(K("swiglu"), ins, outs);
  auto silu = [](double g) { return g / (1.0 + std::exp(-g)); };
  CHECK(outs[0].f[0] == 0.0f);
  CHECK(outs[0].f[1] == Approx(0.7310586 * 2).margin(1e-6));  // silu(1) * 2
  CHECK(outs[0].f[2] == Approx(-0.2384058 * 3).margin(1e-6)); // silu(-2) * 3
  CHECK(outs[0].f[3] == Approx(silu(4)));
  CHECK(outs[0].f[4] == Approx(silu(-30)).margin(1e-10)); // ~ -2.8e-12
  CHECK(outs[0].f[5] == Approx(-15.0));                   // silu(30) ~ 30
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

TEST_CASE("position_add under context parallelism adds global positions",
          "[kernels][forward][grad]") {
  // Members m of cp hold chunks m and 2 cp - 1 - m of each sequence: each
  // member's rows equal the whole sequence's at those positions, and the
  // members' position gradients sum to the whole one.
  const int64_t cp = GENERATE(2, 4);
  Rng rng(23);
  const int64_t seq = 4 * cp, batch = 2, hidden = 3, positions = seq + 2;
  const int64_t local = seq / cp, chunk = seq / (2 * cp);
  Tensor x = randomF32(rng, {batch * seq, hidden});
  Tensor pos = randomF32(rng, {positions, hidden});
  Tensor dy = randomF32(rng, {batch * seq, hidden});
  std::vector<Tensor> ins = {x, pos};
  std::vector<Tensor> whole = {Tensor::f32({batch * seq, hidden})};
  mustRun(K("position_add").i("seq", seq), ins, whole);
  std::vector<Tensor> dyIn = {dy};
  std::vector<Tensor> wholeGrad = {Tensor::f32({positions, hidden})};
  mustRun(K("position_add_grad").i("seq", seq), dyIn, wholeGrad);
  std::vector<double> sum(positions * hidden, 0.0);
  for (int64_t m = 0; m < cp; ++m) {
    auto row = [&](int64_t r) {
      int64_t b = r / local, t = r % local;
      return b * seq +
             (t < chunk ? m * chunk + t : (2 * cp - 1 - m) * chunk + t - chunk);
    };
    Tensor xm = Tensor::f32({batch * local, hidden});
    Tensor dym = Tensor::f32({batch * local, hidden});
    for (int64_t r = 0; r < batch * local; ++r)
      for (int64_t j = 0; j < hidden; ++j) {
        xm.f[r * hidden + j] = x.f[row(r) * hidden + j];
        dym.f[r * hidden + j] = dy.f[row(r) * hidden + j];
      }
    KernelContext ctx;
    ctx.contextMember = m;
    std::vector<Tensor> in = {xm, pos};
    std::vector<Tensor> out = {Tensor::f32({batch * local, hidden})};
    REQUIRE(
        run(K("position_add").i("seq", seq).i("cp", cp), in, out, ctx).isOk());
    for (int64_t r = 0; r < batch * local; ++r)
      for (int64_t j = 0; j < hidden; ++j)
        CHECK(out[0].f[r * hidden + j] == whole[0].f[row(r) * hidden + j]);
    std::vector<Tensor> gin = {dym};
    std::vector<Tensor> gout = {Tensor::f32({positions, hidden})};
    std::fill(gout[0].f.begin(), gout[0].f.end(), 9.0f);
    REQUIRE(
        run(K("position_add_grad").i("seq", seq).i("cp", cp), gin, gout, ctx)
            .isOk());
    for (int64_t i = 0; i < positions * hidden; ++i)
      sum[i] += gout[0].f[i];
  }
  // Each position is one member's: its sum is that member's, exactly.
  for (int64_t i = 0; i < positions * hidden; ++i)
    CHECK(float(sum[i]) == wholeGrad[0].f[i]);
  KernelContext outside;
  outside.contextMember = cp;
  std::vector<Tensor> in = {Tensor::f32({local, hidden}), pos};
  std::vector<Tensor> out = {Tensor::f32({local, hidden})};
  Status s = run(K("position_add").i("seq", seq).i("cp", cp), in, out, outside);
  CHECK(s.message().find("the context member " + std::to_string(cp) +
                         " is not one of " + std::to_string(cp)) !=
        std::string::npos);
  mustFail(K("position_add").i("seq", 6).i("cp", 2),
           {Tensor::f32({3, hidden}), Tensor::f32({6, hidden})},
           {Tensor::f32({3, hidden})});
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

  const std::vector<float> dw = outs[0].f;

  if (withBias) {
    ins = {dy};
    outs = {Tensor::f32({out})};
    mustRun(K("bias_grad"), ins, outs);
    requireNonZero(outs[0].f);
    checkGradient(forward, fwdIns, 2, {rows, out}, r, outs[0].f);
    const std::vector<float> db = outs[0].f;

    // Both in one call: linear_grad_weight's and bias_grad's bits.
    ins = {x, dy};
    outs = {Tensor::f32(wShape), Tensor::f32({out})};
    mustRun(K("linear_grad_weight_bias").i("transpose_w", transposeW), ins,
            outs);
    CHECK(std::memcmp(outs[0].f.data(), dw.data(), dw.size() * 4) == 0);
    CHECK(std::memcmp(outs[1].f.data(), db.data(), db.size() * 4) == 0);
    // Its db must match the weight gradient's layout's bias size.
    std::string error =
        mustFail(K("linear_grad_weight_bias").i("transpose_w", transposeW), ins,
                 {Tensor::f32(wShape), Tensor::f32({in + out})});
    CHECK(error.find("db has shape") != std::string::npos);
  }
}

// The compiler's GELU fusions: linear_gelu is linear then gelu, and
// linear_grad_input_gelu linear_grad_input then gelu_grad, bit for bit; in
// mixed precision with the executor's rounding of linear's and
// linear_grad_input's outputs in between (the fused kernels round there
// themselves).
TEST_CASE("linear_gelu and linear_grad_input_gelu are the unfused kernels, "
          "bit for bit",
          "[kernels][forward][grad]") {
  const int64_t transposeW = GENERATE(0, 1);
  const bool withBias = GENERATE(false, true);
  const bool lowPrecision = GENERATE(false, true);
  INFO("transpose_w=" << transposeW << " bias=" << withBias
                      << " lowPrecision=" << lowPrecision);
  Rng rng(21 + transposeW + 2 * withBias);
  const int64_t rows = 37, in = 19, out = 23;
  std::vector<int64_t> wShape = transposeW ? std::vector<int64_t>{out, in}
                                           : std::vector<int64_t>{in, out};
  auto bf16 = [&](Tensor t) {
    if (lowPrecision) // operands hold bf16 values (the executor's rounding)
      for (float &v : t.f)
        v = roundToBf16(v);
    return t;
  };
  Tensor x = bf16(randomF32(rng, {rows, in}, -2.0, 2.0));
  Tensor w = bf16(randomF32(rng, wShape, -1.0, 1.0));
  std::vector<Tensor> ins = {x, w};
  if (withBias)
    ins.push_back(bf16(randomF32(rng, {out})));
  KernelContext ctx;
  ctx.lowPrecision = lowPrecision;
  auto exec = [&](const K &k, std::vector<Tensor> kIns,
                  std::vector<Tensor> &kOuts) {
    REQUIRE(run(k, kIns, kOuts, ctx).isOk());
  };
  auto rounded = [&](Tensor t) { return lowPrecision ? bf16(t) : t; };

  std::vector<Tensor> h = {Tensor::f32({rows, out})}, y = {h[0]},
                      fused = {h[0], h[0]};
  exec(K("linear").i("transpose_w", transposeW), ins, h);
  h[0] = rounded(h[0]);
  exec(K("gelu"), {h[0]}, y);
  exec(K("linear_gelu").i("transpose_w", transposeW), ins, fused);
  requireNonZero(y[0].f);
  CHECK(std::memcmp(fused[0].f.data(), h[0].f.data(), h[0].f.size() * 4) == 0);
  CHECK(std::memcmp(fused[1].f.data(), y[0].f.data(), y[0].f.size() * 4) == 0);

  // Backward through a layer of `in` outputs: dh = gelu'(h) * (dy w^T).
  Tensor dy = bf16(randomF32(rng, {rows, out}));
  Tensor hIn = bf16(randomF32(rng, {rows, in}, -3.0, 3.0));
  std::vector<Tensor> da = {Tensor::f32({rows, in})}, dh = {da[0]},
                      fusedDh = {da[0]};
  exec(K("linear_grad_input").i("transpose_w", transposeW), {dy, w}, da);
  da[0] = rounded(da[0]);
  exec(K("gelu_grad"), {hIn, da[0]}, dh);
  exec(K("linear_grad_input_gelu").i("transpose_w", transposeW), {dy, w, hIn},
       fusedDh);
  requireNonZero(dh[0].f);
  CHECK(std::memcmp(fusedDh[0].f.data(), dh[0].f.data(), dh[0].f.size() * 4) ==
        0);

  // Their operands: y of h's shape, h of dh's.
  std::string error =
      mustFail(K("linear_gelu").i("transpose_w", transposeW), ins,
               {Tensor::f32({rows, out}), Tensor::f32({rows, out + 1})});
  CHECK_THAT(error, Catch::Contains("y has shape"));
  error = mustFail(K("linear_gelu").i("transpose_w", transposeW), ins,
                   {Tensor::f32({rows, out})});
  CHECK_THAT(error, Catch::Contains("2 outputs"));
  error =
      mustFail(K("linear_grad_input_gelu").i("transpose_w", transposeW),
               {dy, w, Tensor::f32({rows, in + 1})}, {Tensor::f32({rows, in})});
  CHECK_THAT(error, Catch::Contains("h has shape"));
  error = mustFail(K("linear_grad_input_gelu").i("transpose_w", transposeW),
                   {dy, w}, {Tensor::f32({rows, in})});
  CHECK_THAT(error, Catch::Contains("3 inputs"));
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

/// Targets [rows] spread over the vocabulary ((n * 7919) % vocab).
Tensor spreadTargets(int64_t rows, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t n = 0; n < rows; ++n)
    ids[n] = static_cast<int32_t>((n * 7919) % vocab);
  return Tensor::i32({rows}, ids);
}

TEST_CASE("cross_entropy_fused is cross_entropy and cross_entropy_grad, bit "
          "for bit",
          "[kernels][forward][grad]") {
  // Rows of GPT-2's vocabulary (several threads' chunks) and a few small
  // ones, logits spread widely; the fused classifier shares the two
  // kernels' row loop, so its outputs are theirs exactly.
  for (auto [rows, vocab] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {3, 7}, {40, 129}, {9, 50257}}) {
    INFO(rows << "x" << vocab);
    Rng rng(static_cast<uint64_t>(rows * 7 + vocab));
    Tensor logits = randomF32(rng, {rows, vocab}, -20.0, 20.0);
    Tensor targets = spreadTargets(rows, vocab);
    std::vector<Tensor> ins = {logits, targets};
    std::vector<Tensor> loss = {Tensor::f32({})},
                        grad = {Tensor::f32({rows, vocab})},
                        fused = {Tensor::f32({}), Tensor::f32({rows, vocab})};
    mustRun(K("cross_entropy"), ins, loss);
    mustRun(K("cross_entropy_grad").f("scale", 0.125), ins, grad);
    mustRun(K("cross_entropy_fused").f("scale", 0.125), ins, fused);
    if (vocab > 1) // one class: softmax - onehot is 0
      requireNonZero(grad[0].f);
    CHECK(std::memcmp(fused[0].f.data(), loss[0].f.data(), sizeof(float)) == 0);
    CHECK(std::memcmp(fused[1].f.data(), grad[0].f.data(),
                      grad[0].f.size() * sizeof(float)) == 0);
  }
  // Its errors: a missing gradient output, a target out of range.
  std::vector<Tensor> ins = {Tensor::f32({2, 3}), Tensor::i32({2}, {0, 3})};
  std::vector<Tensor> outs = {Tensor::f32({}), Tensor::f32({2, 3})};
  Status st = run(K("cross_entropy_fused"), ins, outs);
  REQUIRE(!st);
  CHECK_THAT(st.message(), Catch::Contains("targets"));
  outs.pop_back();
  ins[1].i[1] = 0;
  st = run(K("cross_entropy_fused"), ins, outs);
  REQUIRE(!st);
  CHECK_THAT(st.message(), Catch::Contains("2 outputs"));
}

// ---------------------------------------------------------------------------
// The compiler's vocabulary padding (docs/kernels.md, "Padded vocabulary"):
// with `valid_cols` V, a [rows, V] operand of the vocabulary dimension may be
// stored [rows, W], W >= V.

/// t [rows, cols] with `width` columns per row, the others `fill`.
Tensor padded(const Tensor &t, int64_t rows, int64_t cols, int64_t width,
              float fill) {
  Tensor out = Tensor::f32({rows, width});
  out.f.assign(static_cast<size_t>(rows * width), fill);
  for (int64_t n = 0; n < rows; ++n)
    std::copy_n(t.f.data() + n * cols, cols, out.f.data() + n * width);
  return out;
}

/// Whether padded `p` [rows, width] holds dense `t`'s bits in its first
/// cols columns and `fill`'s bits in the others.
bool samePadded(const Tensor &p, const Tensor &t, int64_t rows, int64_t cols,
                int64_t width, float fill) {
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t j = 0; j < width; ++j) {
      float want = j < cols ? t.f[n * cols + j] : fill;
      if (std::memcmp(&p.f[n * width + j], &want, sizeof(float)) != 0)
        return false;
    }
  return true;
}

TEST_CASE("padded logits and gradients (valid_cols) give the dense kernels' "
          "bits and leave the padding alone",
          "[kernels][forward][grad]") {
  // Padding read as a NaN would poison every output it reached; the
  // outputs' padding starts as a sentinel that must survive.
  const float nan = std::numeric_limits<float>::quiet_NaN(), sentinel = 77.0f;
  for (auto [rows, in, vocab, width] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {5, 7, 13, 16}, {1, 3, 1, 64}, {9, 24, 100, 128}}) {
    INFO(rows << "x" << in << " vocab " << vocab << " padded to " << width);
    Rng rng(static_cast<uint64_t>(rows * 1000 + vocab));
    Tensor x = randomF32(rng, {rows, in});
    Tensor dy = randomF32(rng, {rows, vocab});
    Tensor dyPadded = padded(dy, rows, vocab, width, nan);
    for (int tw : {0, 1}) {
      INFO("transpose_w " << tw);
      std::vector<int64_t> wShape = tw ? std::vector<int64_t>{vocab, in}
                                       : std::vector<int64_t>{in, vocab};
      Tensor w = randomF32(rng, wShape);
      // linear: y written in the valid columns only.
      std::vector<Tensor> ins = {x, w}, dense = {Tensor::f32({rows, vocab})};
      std::vector<Tensor> pad = {
          padded(dense[0], rows, vocab, width, sentinel)};
      mustRun(K("linear").i("transpose_w", tw), ins, dense);
      mustRun(K("linear").i("transpose_w", tw).i("valid_cols", vocab), ins,
              pad);
      CHECK(samePadded(pad[0], dense[0], rows, vocab, width, sentinel));
      // linear_grad_input: dy read in the valid columns only.
      std::vector<Tensor> gIns = {dy, w}, gPadIns = {dyPadded, w};
      std::vector<Tensor> dx = {Tensor::f32({rows, in})}, dxPad = dx;
      mustRun(K("linear_grad_input").i("transpose_w", tw), gIns, dx);
      mustRun(
          K("linear_grad_input").i("transpose_w", tw).i("valid_cols", vocab),
          gPadIns, dxPad);
      CHECK(dx[0].f == dxPad[0].f);
      // linear_grad_weight, overwriting and accumulating.
      for (int acc : {0, 1}) {
        std::vector<Tensor> wIns = {x, dy}, wPadIns = {x, dyPadded};
        std::vector<Tensor> dw = {randomF32(rng, wShape)}, dwPad = dw;
        mustRun(
            K("linear_grad_weight").i("transpose_w", tw).i("accumulate", acc),
            wIns, dw);
        mustRun(K("linear_grad_weight")
                    .i("transpose_w", tw)
                    .i("accumulate", acc)
                    .i("valid_cols", vocab),
                wPadIns, dwPad);
        CHECK(std::memcmp(dw[0].f.data(), dwPad[0].f.data(),
                          dw[0].f.size() * sizeof(float)) == 0);
      }
    }
    // The losses: logits padded or not, dlogits padded or not.
    Tensor logits = randomF32(rng, {rows, vocab}, -20.0, 20.0);
    Tensor targets = spreadTargets(rows, vocab);
    std::vector<Tensor> ins = {logits, targets};
    std::vector<Tensor> fused = {Tensor::f32({}), Tensor::f32({rows, vocab})};
    mustRun(K("cross_entropy_fused").f("scale", 0.5), ins, fused);
    for (bool padLogits : {false, true})
      for (bool padGrad : {false, true}) {
        INFO("logits padded " << padLogits << ", dlogits padded " << padGrad);
        std::vector<Tensor> pIns = {
            padLogits ? padded(logits, rows, vocab, width, nan) : logits,
            targets};
        Tensor dlogits = padGrad
                             ? padded(fused[1], rows, vocab, width, sentinel)
                             : Tensor::f32({rows, vocab});
        auto sameGrad = [&](const Tensor &got) {
          return padGrad
                     ? samePadded(got, fused[1], rows, vocab, width, sentinel)
                     : got.f == fused[1].f;
        };
        std::vector<Tensor> pFused = {Tensor::f32({}), dlogits};
        mustRun(K("cross_entropy_fused").f("scale", 0.5).i("valid_cols", vocab),
                pIns, pFused);
        CHECK(std::memcmp(pFused[0].f.data(), fused[0].f.data(),
                          sizeof(float)) == 0);
        CHECK(sameGrad(pFused[1]));
        std::vector<Tensor> pGrad = {dlogits};
        mustRun(K("cross_entropy_grad").f("scale", 0.5).i("valid_cols", vocab),
                pIns, pGrad);
        CHECK(sameGrad(pGrad[0]));
        std::vector<Tensor> pLoss = {Tensor::f32({})};
        mustRun(K("cross_entropy").i("valid_cols", vocab), pIns, pLoss);
        CHECK(std::memcmp(pLoss[0].f.data(), fused[0].f.data(),
                          sizeof(float)) == 0);
      }
  }
}

TEST_CASE("valid_cols is checked against the operands and refused where a "
          "kernel has no padded form",
          "[kernels][forward][grad]") {
  Tensor x = Tensor::f32({2, 3}), w = Tensor::f32({3, 5});
  CHECK_THAT(
      mustFail(K("linear").i("valid_cols", 9), {x, w}, {Tensor::f32({2, 8})}),
      Catch::Contains("y has shape [2,8], fewer columns than "
                      "valid_cols=9"));
  CHECK_THAT(
      mustFail(K("linear").i("valid_cols", 4), {x, w}, {Tensor::f32({2, 8})}),
      Catch::Contains("y has shape [2,8] with valid_cols=4, expected "
                      "[2,5] valid columns"));
  CHECK_THAT(
      mustFail(K("linear").i("valid_cols", 0), {x, w}, {Tensor::f32({2, 8})}),
      Catch::Contains("valid_cols"));
  CHECK_THAT(mustFail(K("linear").i("valid_cols", 5), {x, w, Tensor::f32({5})},
                      {Tensor::f32({2, 8})}),
             Catch::Contains("valid_cols (a padded y) is only for linear, "
                             "linear_grad_input and linear_grad_weight "
                             "without a bias"));
  CHECK_THAT(mustFail(K("linear_gelu").i("valid_cols", 5), {x, w},
                      {Tensor::f32({2, 8}), Tensor::f32({2, 8})}),
             Catch::Contains("valid_cols (a padded h)"));
  CHECK_THAT(mustFail(K("linear_grad_weight_bias").i("valid_cols", 5),
                      {x, Tensor::f32({2, 8})},
                      {Tensor::f32({3, 5}), Tensor::f32({5})}),
             Catch::Contains("valid_cols (a padded dy)"));
  CHECK_THAT(mustFail(K("linear_grad_input_gelu").i("valid_cols", 5),
                      {Tensor::f32({2, 8}), w, x}, {x}),
             Catch::Contains("valid_cols (a padded dy)"));
  CHECK_THAT(mustFail(K("linear_grad_input").i("valid_cols", 4),
                      {Tensor::f32({2, 8}), w}, {x}),
             Catch::Contains("w has shape [3,5], expected [*,4]"));
  Tensor targets = Tensor::i32({2}, {0, 1});
  CHECK_THAT(mustFail(K("cross_entropy_grad").i("valid_cols", 6),
                      {Tensor::f32({2, 8}), targets}, {Tensor::f32({2, 5})}),
             Catch::Contains("dlogits has shape [2,5], fewer columns than "
                             "valid_cols=6"));
  CHECK_THAT(mustFail(K("cross_entropy_fused").i("valid_cols", 6),
                      {Tensor::f32({2, 5}), targets},
                      {Tensor::f32({}), Tensor::f32({2, 8})}),
             Catch::Contains("logits has shape [2,5], fewer columns than "
                             "valid_cols=6"));
  // A target in the padding is out of the vocabulary.
  CHECK_THAT(mustFail(K("cross_entropy").i("valid_cols", 5),
                      {Tensor::f32({2, 8}), Tensor::i32({2}, {0, 6})},
                      {Tensor::f32({})}),
             Catch::Contains("targets"));
}

// ---------------------------------------------------------------------------
// Vocabulary parallelism (docs/tensor-parallel.md §5c): T members each hold
// V / T columns of the logits (rows of the embedding table); the sum of
// their vocab_ce_stats gives every member the whole loss, and each member's
// gradient columns are those of cross_entropy_grad on the whole logits.

/// Columns [first, first + count) of a row-major [rows, cols] tensor.
Tensor columns(const Tensor &t, int64_t rows, int64_t cols, int64_t first,
               int64_t count) {
  Tensor out = Tensor::f32({rows, count});
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t j = 0; j < count; ++j)
      out.f[n * count + j] = t.f[n * cols + first + j];
  return out;
}

TEST_CASE("vocabulary-parallel cross entropy equals cross_entropy on the "
          "whole logits",
          "[kernels][forward][grad]") {
  for (int64_t members : {2, 3, 4}) {
    INFO("members " << members);
    Rng rng(40 + members);
    const int64_t rows = 6, local = 5, vocab = members * local;
    // Logits spread widely, so that the members' maxima differ by far
    // (exponents down to ~-60) and the rescaling matters.
    Tensor logits = randomF32(rng, {rows, vocab}, -30.0, 30.0);
    std::vector<int32_t> ids;
    for (int64_t n = 0; n < rows; ++n)
      ids.push_back(static_cast<int32_t>((n * 7 + 3) % vocab));
    Tensor targets = Tensor::i32({2, 3}, ids);
    std::vector<Tensor> wholeIns = {logits, targets};
    std::vector<Tensor> wholeLoss = {Tensor::f32({})};
    std::vector<Tensor> wholeGrad = {Tensor::f32({rows, vocab})};
    const double scale = 0.75;
    mustRun(K("cross_entropy"), wholeIns, wholeLoss);
    mustRun(K("cross_entropy_grad").f("scale", scale), wholeIns, wholeGrad);

    // Each member's statistics, summed: the all-reduce.
    const int64_t width = 4 * members + 1;
    Tensor stats = Tensor::f32({rows, width});
    std::vector<Tensor> parts;
    for (int64_t m = 0; m < members; ++m) {
      KernelContext ctx;
      ctx.tensorMember = m;
      std::vector<Tensor> ins = {columns(logits, rows, vocab, m * local, local),
                                 targets};
      std::vector<Tensor> outs = {Tensor::f32({rows, width})};
      std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // overwritten
      REQUIRE(run(K("vocab_ce_stats").i("members", members), ins, outs, ctx)
                  .isOk());
      for (int64_t n = 0; n < rows; ++n)
        for (int64_t j = 0; j < width; ++j) {
          bool own = j == m || j == members + m || j == 2 * members + m ||
                     j == 3 * members + m || j == 4 * members;
          if (!own)
            CHECK(outs[0].f[n * width + j] == 0.0f);
          stats.f[n * width + j] += outs[0].f[n * width + j];
        }
      parts.push_back(ins[0]);
    }
    for (int64_t n = 0; n < rows; ++n) // the target's logit, exactly
      CHECK(stats.f[n * width + 4 * members] ==
            logits.f[n * vocab + targets.i[n]]);
    for (int64_t m = 0; m < members; ++m) {
      KernelContext ctx;
      ctx.tensorMember = m;
      std::vector<Tensor> ins = {stats, parts[m], targets};
      std::vector<Tensor> loss = {Tensor::f32({})};
      REQUIRE(
          run(K("vocab_cross_entropy").i("members", members), ins, loss, ctx)
              .isOk());
      // The same log-sum-exp, regrouped by member: float round-off of the
      // members' sums (their float storage, 2^-24 relative).
      CHECK(loss[0].f[0] == Approx(wholeLoss[0].f[0]).epsilon(1e-6));
      std::vector<Tensor> grad = {Tensor::f32({rows, local})};
      REQUIRE(run(K("vocab_cross_entropy_grad")
                      .i("members", members)
                      .f("scale", scale),
                  ins, grad, ctx)
                  .isOk());
      Tensor want = columns(wholeGrad[0], rows, vocab, m * local, local);
      for (size_t i = 0; i < want.f.size(); ++i)
        CHECK(grad[0].f[i] == Approx(want.f[i]).epsilon(1e-5).margin(1e-9));
    }
  }
}

TEST_CASE("vocabulary-parallel kernels reject bad members and targets",
          "[kernels][forward]") {
  KernelContext ctx;
  ctx.tensorMember = 2;
  std::vector<Tensor> ins = {Tensor::f32({2, 3}), Tensor::i32({1, 2}, {0, 1})};
  std::vector<Tensor> outs = {Tensor::f32({2, 9})};
  CHECK(run(K("vocab_ce_stats").i("members", 2), ins, outs, ctx)
            .message()
            .find("tensor-parallel member 2 is not one of 2") !=
        std::string::npos);
  CHECK(mustFail(K("vocab_ce_stats"), ins, outs).find("members") !=
        std::string::npos);
  CHECK(mustFail(K("vocab_ce_stats").i("members", 1), ins, outs)
            .find("members 1 must be at least 2") != std::string::npos);
  // [2, 5] is not [rows, 4 members + 1].
  CHECK(
      mustFail(K("vocab_ce_stats").i("members", 2), ins, {Tensor::f32({2, 5})})
          .find("stats") != std::string::npos);
  // Targets are global ids: below members * local vocabulary (6).
  std::vector<Tensor> bad = {Tensor::f32({2, 3}), Tensor::i32({1, 2}, {0, 6})};
  CHECK(mustFail(K("vocab_ce_stats").i("members", 2), bad, outs)
            .find("targets") != std::string::npos);
  std::vector<Tensor> lossIns = {Tensor::f32({2, 9}), Tensor::f32({2, 3}),
                                 Tensor::i32({1, 2}, {0, 6})};
  CHECK(mustFail(K("vocab_cross_entropy").i("members", 2), lossIns,
                 {Tensor::f32({})})
            .find("targets") != std::string::npos);
  lossIns[2] = Tensor::i32({1, 2}, {0, 5});
  CHECK(mustFail(K("vocab_cross_entropy_grad").i("members", 2), lossIns,
                 {Tensor::f32({2, 4})})
            .find("dlogits") != std::string::npos);
}

TEST_CASE("vocabulary-parallel embedding: the members' rows sum to the "
          "whole lookup, and their gradients are its rows",
          "[kernels][forward][grad]") {
  Rng rng(44);
  const int64_t members = 3, local = 4, vocab = members * local, hidden = 5;
  Tensor ids = Tensor::i32({2, 4}, {0, 11, 4, 4, 7, 3, 8, 11});
  Tensor table = randomF32(rng, {vocab, hidden});
  Tensor dy = randomF32(rng, {8, hidden});
  std::vector<Tensor> wholeIns = {ids, table};
  std::vector<Tensor> whole = {Tensor::f32({8, hidden})};
  mustRun(K("embedding"), wholeIns, whole);
  std::vector<Tensor> gradIns = {ids, dy};
  std::vector<Tensor> wholeGrad = {Tensor::f32({vocab, hidden})};
  mustRun(K("embedding_grad").i("vocab", vocab), gradIns, wholeGrad);

  std::vector<float> sum(8 * hidden, 0.0f);
  for (int64_t m = 0; m < members; ++m) {
    KernelContext ctx;
    ctx.tensorMember = m;
    Tensor rows = Tensor::f32({local, hidden});
    std::copy_n(table.f.begin() + m * local * hidden, local * hidden,
                rows.f.begin());
    std::vector<Tensor> ins = {ids, rows};
    std::vector<Tensor> outs = {Tensor::f32({8, hidden})};
    std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // overwritten
    REQUIRE(run(K("embedding").i("members", members), ins, outs, ctx).isOk());
    for (size_t i = 0; i < sum.size(); ++i)
      sum[i] += outs[0].f[i]; // one non-zero term: exact
    std::vector<Tensor> grad = {Tensor::f32({local, hidden})};
    REQUIRE(run(K("embedding_grad").i("vocab", local).i("members", members),
                gradIns, grad, ctx)
                .isOk());
    CHECK(std::equal(grad[0].f.begin(), grad[0].f.end(),
                     wholeGrad[0].f.begin() + m * local * hidden));
  }
  CHECK(sum == whole[0].f);
  // An id of the global vocabulary's range only.
  KernelContext ctx;
  std::vector<Tensor> bad = {Tensor::i32({1, 1}, {12}),
                             Tensor::f32({local, hidden})};
  std::vector<Tensor> outs = {Tensor::f32({1, hidden})};
  CHECK(run(K("embedding").i("members", members), bad, outs, ctx)
            .message()
            .find("ids") != std::string::npos);
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

TEST_CASE("adamw scales its gradient by the clip factor, and updates "
          "nothing where it is not finite",
          "[kernels][state]") {
  // CLIP_GRADS' factor (KernelContext::clipFactor) is NaN after a
  // non-finite norm: the diverged step leaves parameters and moments as
  // they are. A finite factor multiplies each gradient (a float product):
  // bit for bit the update of the gradient scaled first, as a separate
  // clipping pass did.
  for (float factor :
       {std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::infinity(), 0.5f, 0.37f, 1.0f}) {
    INFO("factor " << factor);
    std::vector<Tensor> ins = {Tensor::f32({3}, {0.3f, -2.0f, 0.0f})};
    std::vector<Tensor> outs = {Tensor::f32({3}, {1, 1, 1}),
                                Tensor::f32({3}, {0.1f, 0.2f, 0.3f}),
                                Tensor::f32({3}, {0.4f, 0.5f, 0.6f})};
    std::vector<Tensor> plain = outs, scaledIns = ins;
    for (float &g : scaledIns[0].f)
      g *= factor;
    KernelContext ctx, none;
    ctx.clipFactor = &factor;
    REQUIRE(run(K("adamw").f("lr", 0.01), ins, outs, ctx).isOk());
    if (std::isfinite(factor)) {
      REQUIRE(run(K("adamw").f("lr", 0.01), scaledIns, plain, none).isOk());
      for (size_t o = 0; o < outs.size(); ++o)
        CHECK(std::memcmp(outs[o].f.data(), plain[o].f.data(),
                          plain[o].f.size() * sizeof(float)) == 0);
      // Not the update of the unscaled gradient (the factor is read).
      if (factor != 1.0f) {
        std::vector<Tensor> unscaled = {Tensor::f32({3}, {1, 1, 1}),
                                        Tensor::f32({3}, {0.1f, 0.2f, 0.3f}),
                                        Tensor::f32({3}, {0.4f, 0.5f, 0.6f})};
        REQUIRE(run(K("adamw").f("lr", 0.01), ins, unscaled, none).isOk());
        CHECK(unscaled[1].f != outs[1].f);
      }
    } else {
      CHECK(outs[0].f == std::vector<float>{1, 1, 1});
      CHECK(outs[1].f == std::vector<float>{0.1f, 0.2f, 0.3f});
      CHECK(outs[2].f == std::vector<float>{0.4f, 0.5f, 0.6f});
    }
  }
}

// ---------------------------------------------------------------------------
// Error paths: every bad input is a Status, never a crash.

// Packed bf16 operands (a mixed-precision step buffer or parameter copy as
// stored) are taken only by a GEMM's inputs, and only in mixed precision
// (gpu_kernels_test runs every such input against its fp32 values);
// anywhere else they are refused, naming the operand.
TEST_CASE("packed bf16 operands are refused where a kernel reads fp32",
          "[kernels][forward][grad]") {
  std::vector<uint16_t> packed(64, 0x3f80); // 1.0
  std::vector<float> x(6, 1.0f), w(15, 1.0f), y(10), db(5), dw(15),
      gamma(3, 1.0f);
  auto f32 = [](std::vector<float> &v, std::vector<int64_t> shape) {
    return TensorRef{plan::F32, std::move(shape), v.data()};
  };
  auto bf16 = [&](std::vector<int64_t> shape) {
    return TensorRef{plan::BF16, std::move(shape), packed.data()};
  };
  auto fails = [](const plan::Kernel &kernel, std::vector<TensorRef> ins,
                  std::vector<TensorRef> outs, bool lowPrecision) {
    KernelContext ctx;
    ctx.lowPrecision = lowPrecision;
    Status s = runKernel(kernel, ins, outs, ctx);
    REQUIRE_FALSE(s.isOk());
    return s.message();
  };
  // Outside mixed precision, even where a GEMM would read it.
  CHECK_THAT(fails(K("linear"), {bf16({2, 3}), f32(w, {3, 5})},
                   {f32(y, {2, 5})}, false),
             Catch::Contains("linear: x must be f32, got bf16"));
  // A norm's input outside mixed precision, its weight, bias_grad's dy, an
  // elementwise kernel's input.
  CHECK_THAT(fails(K("rms_norm"), {bf16({2, 3}), f32(gamma, {3})},
                   {f32(y, {2, 3})}, false),
             Catch::Contains("rms_norm: x must be f32, got bf16"));
  CHECK_THAT(
      fails(K("rms_norm"), {f32(x, {2, 3}), bf16({3})}, {f32(y, {2, 3})}, true),
      Catch::Contains("rms_norm: gamma must be f32, got bf16"));
  CHECK_THAT(fails(K("bias_grad"), {bf16({2, 5})}, {f32(db, {5})}, true),
             Catch::Contains("bias_grad: dy must be f32, got bf16"));
  CHECK_THAT(fails(K("linear_grad_weight_bias"), {f32(x, {2, 3}), bf16({2, 5})},
                   {f32(dw, {3, 5}), f32(db, {5})}, false),
             Catch::Contains("dy must be f32, got bf16"));
  CHECK_THAT(fails(K("bias_add"), {bf16({2, 5}), f32(db, {5})},
                   {f32(y, {2, 5})}, true),
             Catch::Contains("x must be f32, got bf16"));
  // Where a GEMM reads it (x, and w: a packed bf16 parameter copy), in
  // mixed precision: the values of the fp32 run.
  KernelContext ctx;
  ctx.lowPrecision = true;
  std::vector<float> packedOut(10), packedW(10), plainOut(10);
  REQUIRE(runKernel(K("linear"), {bf16({2, 3}), f32(w, {3, 5})},
                    {f32(packedOut, {2, 5})}, ctx));
  REQUIRE(runKernel(K("linear"), {f32(x, {2, 3}), bf16({3, 5})},
                    {f32(packedW, {2, 5})}, ctx));
  REQUIRE(runKernel(K("linear"), {f32(x, {2, 3}), f32(w, {3, 5})},
                    {f32(plainOut, {2, 5})}, ctx));
  CHECK(packedOut == plainOut);
  CHECK(packedW == plainOut);
  CHECK(plainOut[0] == 3.0f);
  // The weight gradient's dy, whose column sums (the bias gradient) read
  // it packed too.
  std::vector<float> ones(10, 1.0f), dwPacked(15), dbPacked(5);
  REQUIRE(runKernel(K("linear_grad_weight_bias"),
                    {f32(x, {2, 3}), bf16({2, 5})},
                    {f32(dwPacked, {3, 5}), f32(dbPacked, {5})}, ctx));
  REQUIRE(runKernel(K("linear_grad_weight_bias"),
                    {f32(x, {2, 3}), f32(ones, {2, 5})},
                    {f32(dw, {3, 5}), f32(db, {5})}, ctx));
  CHECK(dwPacked == dw);
  CHECK(dbPacked == db);
  CHECK(db[0] == 2.0f);
}

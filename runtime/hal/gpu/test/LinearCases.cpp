// Cases of the linear and loss GPU kernels (KernelCases.h): linear and its
// gradients (transpose_w 0 and 1, with and without bias, fp32 and bf16;
// the weight and bias gradients in one call; with GELU fused),
// bias_grad, cross_entropy, its gradient and both fused, loss_accumulate.
#include <array>
#include <cmath>
#include <tuple>

#include "runtime/hal/gpu/test/KernelCases.h"

namespace piper::runtime::hal::testing {
namespace {

std::string dims(std::initializer_list<int64_t> ds) {
  std::string s;
  for (int64_t d : ds)
    s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

// bf16-exact values (small multiples of 1/8): with lowPrecision the GEMMs
// read their operands as bf16 (the executor rounds them first), and every
// product and partial sum of these is exact in fp32, whatever the order.
const std::vector<double> kBf16X = {0.125, -0.5, 0.75,  -0.25,
                                    0.375, 1.0,  -0.875};
const std::vector<double> kBf16W = {0.25, -0.125, 0.5, -0.75, 0.625};
const std::vector<double> kBf16B = {0.5, -0.25, 0.125};

void linearCases(std::vector<KernelCase> &out) {
  // rows, in, out: one element, odd sizes, an empty inner dimension (the
  // GEMM's k = 0: y is the bias or zeros), no rows, and a larger one.
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 1, 1}, {5, 7, 3}, {33, 17, 65}, {4, 0, 3}, {0, 5, 6}, {128, 96, 160}};
  for (auto [rows, in, outDim] : shapes) {
    for (int transposeW : {0, 1}) {
      std::vector<int64_t> wShape = transposeW
                                        ? std::vector<int64_t>{outDim, in}
                                        : std::vector<int64_t>{in, outDim};
      std::string s = dims({rows, in, outDim}) + " transpose_w " +
                      std::to_string(transposeW);
      std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
          {"transpose_w", intAttr(transposeW)}};
      // w ~ N(0, 1/in) keeps the products' sums O(1). The GEMMs sum in
      // another order than the CPU's OpenBLAS (cuBLASLt on a GPU), so an
      // output near 0 carries an absolute error of about sqrt(in) * 6e-8:
      // atol 1e-5.
      double ws = 1.0 / std::sqrt(double(in > 0 ? in : 1));
      for (bool bf16 : {false, true}) {
        std::string p = bf16 ? " bf16" : "";
        Operand x =
            bf16 ? given(plan::F32, {rows, in}, kBf16X) : f32({rows, in});
        Operand w = bf16 ? given(plan::F32, wShape, kBf16W) : f32(wShape, ws);
        Operand dy = bf16 ? given(plan::F32, {rows, outDim}, kBf16B)
                          : f32({rows, outDim});
        Operand b = bf16 ? given(plan::F32, {outDim}, kBf16B) : f32({outDim});
        std::vector<KernelCase> cs = {
            {"linear " + s + p, "linear", attrs, {x, w}, {f32({rows, outDim})}},
            {"linear bias " + s + p,
             "linear",
             attrs,
             {x, w, b},
             {f32({rows, outDim})}},
            {"linear_grad_input " + s + p,
             "linear_grad_input",
             attrs,
             {dy, w},
             {f32({rows, in})}},
            {"linear_grad_weight " + s + p,
             "linear_grad_weight",
             attrs,
             {x, dy},
             {f32(wShape)}},
            // db: bias_grad's column sums in double, the same bits.
            {"linear_grad_weight_bias " + s + p,
             "linear_grad_weight_bias",
             attrs,
             {x, dy},
             {f32(wShape), f32({outDim})}},
        };
        // The weight gradient added to its output (`accumulate`, the
        // compiler's fusion with the gradient accumulator's add). In fp32
        // the output starts random: the sum is checked. In bf16 the CPU and
        // the emulation round dw to bf16 before adding it, CUDA adds the
        // fp32 product (Context::accumulatesInGemm): from a zero output the
        // two differ by at most half a bf16 ulp of dw, 2^-9 |dw|, so rtol
        // 2^-8 bounds it on a GPU, and the emulation must match the CPU
        // within the fp32 GEMM's atol.
        auto accumulated = [&](KernelCase c) {
          c.name += " accumulate";
          c.attrs.push_back({"accumulate", intAttr(1)});
          if (bf16) {
            c.outputs[0] = zeros(wShape);
            c.rtol = 1.0 / 256;
          }
          return c;
        };
        cs.push_back(accumulated(cs[3]));
        cs.push_back(accumulated(cs[4]));
        // GELU fused with the GEMM (the compiler's linear + gelu and
        // linear_grad_input + gelu_grad). h: bf16 values in bf16, as the
        // executor's rounding leaves the forward's h.
        Operand h =
            bf16 ? given(plan::F32, {rows, in}, kBf16W) : f32({rows, in});
        std::vector<KernelCase> gelu = {
            {"linear_gelu " + s + p,
             "linear_gelu",
             attrs,
             {x, w},
             {f32({rows, outDim}), f32({rows, outDim})}},
            {"linear_gelu bias " + s + p,
             "linear_gelu",
             attrs,
             {x, w, b},
             {f32({rows, outDim}), f32({rows, outDim})}},
            {"linear_grad_input_gelu " + s + p,
             "linear_grad_input_gelu",
             attrs,
             {dy, w, h},
             {f32({rows, in})}},
        };
        // In bf16 the GPU's linear (linear_grad_input) stores y (dx)
        // rounded to bf16 itself (KernelEntry::roundsOutputs), the CPU's
        // the fp32 product, which
        // the executor rounds after it: they differ by at most half a bf16
        // ulp, at most 2^-8 |y| (8 significant bits; the products are
        // exact).
        auto roundedY = [&](KernelCase &c) {
          if (bf16 && (c.op == "linear" || c.op == "linear_grad_input"))
            c.rtol = 1.0 / 256;
        };
        for (KernelCase &c : cs) {
          c.atol = 1e-5;
          c.lowPrecision = bf16;
          roundedY(c);
          out.push_back(c);
        }
        // Bounds. fp32: the product's atol 1e-5 times |gelu'| <= 1.13,
        // plus gelu's own 1e-6 between the two backends: atol 2e-5. bf16:
        // the CPU and the emulation apply GELU to the product rounded to
        // bf16 (the unfused bits), CUDA's epilogue to the fp32 product
        // (docs/kernels.md); the products here are exact, so those two
        // inputs differ by at most 2^-9 of the product. Backward, dh =
        // gelu'(h) * product: relative 2^-9 / (1 - 2^-9) < 2^-8. Forward,
        // h itself differs by 2^-9 |h|, and y = gelu(h) by |gelu'| 2^-9 |h|:
        // for h >= 0, |gelu'| <= 1.13 and |y| >= |h| / 2 (2.26 2^-9 |y|);
        // on [-0.75, 0), |gelu'| <= 0.5 and |y| >= 0.23 |h| (2.2 2^-9 |y|);
        // below -0.75, |h gelu'(h)| <= 0.198 (an absolute 0.198 2^-9):
        // rtol 2^-7 and atol 2^-11 (> 0.198 2^-9) bound it.
        // The vocabulary padding (valid_cols = out): y, or dy, stored
        // with rows of a multiple of 64 (never a multiple already here).
        // Neither backend reads or writes the padding, whose contents
        // (random, as the outputs' initial ones) must come back as they
        // went in; the valid columns as the dense cases'.
        const int64_t width = (outDim / 64 + 1) * 64;
        Operand dyPadded =
            bf16 ? given(plan::F32, {rows, width}, kBf16B) : f32({rows, width});
        auto validCols = [&](KernelCase c) {
          c.name += " padded to " + std::to_string(width);
          c.attrs.push_back({"valid_cols", intAttr(outDim)});
          c.atol = 1e-5;
          c.lowPrecision = bf16;
          roundedY(c);
          return c;
        };
        out.push_back(validCols({"linear " + s + p,
                                 "linear",
                                 attrs,
                                 {x, w},
                                 {f32({rows, width})}}));
        out.push_back(validCols({"linear_grad_input " + s + p,
                                 "linear_grad_input",
                                 attrs,
                                 {dyPadded, w},
                                 {f32({rows, in})}}));
        KernelCase gradWeight = validCols({"linear_grad_weight " + s + p,
                                           "linear_grad_weight",
                                           attrs,
                                           {x, dyPadded},
                                           {f32(wShape)}});
        out.push_back(gradWeight);
        out.push_back(accumulated(gradWeight));
        for (KernelCase &c : gelu) {
          bool forward = c.op == "linear_gelu";
          c.atol = bf16 ? (forward ? 1.0 / 2048 : 1e-5) : 2e-5;
          c.rtol = bf16 ? (forward ? 1.0 / 128 : 1.0 / 256) : 1e-5;
          c.lowPrecision = bf16;
          out.push_back(c);
        }
      }
    }
  }
  // A flag other than 0 or 1.
  KernelCase badFlag{"linear_grad_weight accumulate 2",
                     "linear_grad_weight",
                     {{"accumulate", intAttr(2)}},
                     {f32({3, 4}), f32({3, 5})},
                     {f32({4, 5})}};
  badFlag.rejects = "attribute 'accumulate' must be 0 or 1, got 2";
  out.push_back(badFlag);
  // Without the attribute (transpose_w defaults to 0).
  KernelCase plain{"linear default transpose_w",
                   "linear",
                   {},
                   {f32({9, 11}), f32({11, 13}, 0.3), f32({13})},
                   {zeros({9, 13})}};
  plain.atol = 1e-5;
  out.push_back(plain);

  // bias_add: one element, odd sizes, more rows than a grid stride.
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {7, 13}, {1000, 257}, {0, 5}})
    out.push_back({"bias_add " + dims({rows, cols}),
                   "bias_add",
                   {},
                   {f32({rows, cols}), f32({cols})},
                   {zeros({rows, cols})}});
  // sp_split: each member's rows, of one row and of many.
  for (auto [rows, cols, members] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 3, 2},
                                                          {1000, 257, 4}})
    for (int64_t m = 0; m < members; ++m) {
      KernelCase c{"sp_split " + dims({rows, cols}) + " member " +
                       std::to_string(m) + " of " + std::to_string(members),
                   "sp_split",
                   {{"members", intAttr(members)}},
                   {f32({rows, cols})},
                   {zeros({rows / members, cols})}};
      c.tensorMember = m;
      out.push_back(c);
    }
  // columns and columns_grad: from the start, in the middle, to the end.
  for (auto [rows, wide, start, narrow] : std::vector<std::array<int64_t, 4>>{
           {3, 5, 0, 2}, {7, 13, 4, 6}, {300, 257, 129, 128}}) {
    std::string at = dims({rows, wide}) + " [" + std::to_string(start) + ", " +
                     std::to_string(start + narrow) + ")";
    out.push_back({"columns " + at,
                   "columns",
                   {{"start", intAttr(start)}},
                   {f32({rows, wide})},
                   {zeros({rows, narrow})}});
    out.push_back({"columns_grad " + at,
                   "columns_grad",
                   {{"start", intAttr(start)}},
                   {f32({rows, narrow})},
                   {f32({rows, wide})}});
  }
  // tp_kv_assemble and its gradient: rows, query, piece, share (members
  // per key/value head), members; every member.
  for (auto [rows, query, piece, share, members] :
       std::vector<std::array<int64_t, 5>>{{3, 4, 1, 2, 2},
                                           {5, 8, 2, 2, 4},
                                           {7, 6, 3, 4, 4},
                                           {64, 96, 16, 2, 8}})
    for (int64_t m = 0; m < members; ++m) {
      std::string at = "rows " + std::to_string(rows) + " query " +
                       std::to_string(query) + " piece " +
                       std::to_string(piece) + " share " +
                       std::to_string(share) + " member " + std::to_string(m) +
                       " of " + std::to_string(members);
      const int64_t cols = query + 2 * share * piece;
      KernelCase c{
          "tp_kv_assemble " + at,
          "tp_kv_assemble",
          {{"members", intAttr(members)}, {"query", intAttr(query)}},
          {f32({rows, query + 2 * piece}), f32({members * rows, 2 * piece})},
          {zeros({rows, cols})}};
      c.tensorMember = m;
      out.push_back(c);
      KernelCase g{"tp_kv_assemble_grad " + at,
                   "tp_kv_assemble_grad",
                   {{"members", intAttr(members)}, {"query", intAttr(query)}},
                   {f32({rows, cols})},
                   {f32({members * rows, 2 * piece})}};
      g.tensorMember = m;
      out.push_back(g);
    }
  // bias_grad: one chunk of rows, several with a partial last one
  // (kColumnChunkRows = 64), no rows (db = 0), one column.
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {7, 13}, {64, 5}, {65, 33}, {1000, 257}, {0, 5}, {300, 1}})
    out.push_back({"bias_grad " + dims({rows, cols}),
                   "bias_grad",
                   {},
                   {f32({rows, cols})},
                   {f32({cols})}});
}

void lossCases(std::vector<KernelCase> &out) {
  // rows (targets as [B,S] when given), vocab, logit scale: one class, odd
  // vocabularies around a warp's 32 lanes, GPT-2's 50257, and logits spread
  // widely (scale 20: exponents down to ~-150, whose exponentials are 0).
  struct Shape {
    std::vector<int64_t> targets;
    int64_t vocab;
    double scale;
  };
  const std::vector<Shape> shapes = {
      {{1}, 1, 1},      {{1}, 7, 1},        {{5}, 3, 1},
      {{7}, 31, 1},     {{3, 11}, 33, 2},   {{64}, 1000, 1},
      {{300}, 129, 20}, {{2, 4}, 50257, 1}, {{3}, 50257, 20}};
  for (const Shape &sh : shapes) {
    int64_t rows = 1;
    for (int64_t d : sh.targets)
      rows *= d;
    std::string s = dims({rows, sh.vocab}) + " scale " +
                    std::to_string(int(sh.scale)) +
                    (sh.targets.size() == 2 ? " [B,S]" : "");
    Operand logits = f32({rows, sh.vocab}, sh.scale);
    Operand targets = tokens(sh.targets, sh.vocab);
    out.push_back({"cross_entropy " + s,
                   "cross_entropy",
                   {},
                   {logits, targets},
                   {f32({})}});
    out.push_back({"cross_entropy_grad " + s,
                   "cross_entropy_grad",
                   {},
                   {logits, targets},
                   {f32({rows, sh.vocab})}});
    out.push_back({"cross_entropy_grad scale 0.25 " + s,
                   "cross_entropy_grad",
                   {{"scale", floatAttr(0.25)}},
                   {logits, targets},
                   {f32({rows, sh.vocab})}});
    out.push_back({"cross_entropy_fused scale 0.25 " + s,
                   "cross_entropy_fused",
                   {{"scale", floatAttr(0.25)}},
                   {logits, targets},
                   {f32({}), f32({rows, sh.vocab})}});
    // The vocabulary padding (valid_cols): the logits, dlogits or both
    // stored with rows of a multiple of 64 (one more 64 where the
    // vocabulary is one already); the padding neither read nor written.
    const int64_t width = (sh.vocab / 64 + 1) * 64;
    std::vector<std::pair<std::string, plan::AttrValue>> padded = {
        {"scale", floatAttr(0.25)}, {"valid_cols", intAttr(sh.vocab)}};
    Operand logitsPadded = f32({rows, width}, sh.scale);
    std::string w = " padded to " + std::to_string(width);
    out.push_back({"cross_entropy " + s + w,
                   "cross_entropy",
                   padded,
                   {logitsPadded, targets},
                   {f32({})}});
    out.push_back({"cross_entropy_grad " + s + w,
                   "cross_entropy_grad",
                   padded,
                   {logitsPadded, targets},
                   {f32({rows, width})}});
    out.push_back({"cross_entropy_fused " + s + w + ", dlogits not",
                   "cross_entropy_fused",
                   padded,
                   {logitsPadded, targets},
                   {f32({}), f32({rows, sh.vocab})}});
    out.push_back({"cross_entropy_fused " + s + ", dlogits" + w,
                   "cross_entropy_fused",
                   padded,
                   {logits, targets},
                   {f32({}), f32({rows, width})}});
  }
  // A [1]-shaped loss output, and a gradient scale above 1.
  out.push_back({"cross_entropy loss [1]",
                 "cross_entropy",
                 {},
                 {f32({6, 40}), tokens({6}, 40)},
                 {f32({1})}});
  out.push_back({"cross_entropy_grad scale 3",
                 "cross_entropy_grad",
                 {{"scale", floatAttr(3)}},
                 {f32({6, 40}), tokens({6}, 40)},
                 {f32({6, 40})}});
  out.push_back({"cross_entropy_fused loss [1], no scale",
                 "cross_entropy_fused",
                 {},
                 {f32({6, 40}), tokens({6}, 40)},
                 {f32({1}), f32({6, 40})}});

  // Vocabulary parallelism: each member of 2 and 4 on its columns (local
  // vocabularies around a warp's 32 lanes and larger; the targets global
  // ids, some on this member), logits spread widely (scale 20); the loss
  // and gradient from valid summed statistics (maxima, positive sums, a
  // target logit).
  for (auto [rows, local, members, scale] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, double>>{
           {5, 3, 2, 1}, {7, 33, 2, 20}, {64, 250, 4, 1}, {3, 12565, 4, 20}})
    for (int64_t m = 0; m < members; ++m) {
      std::string s = dims({rows, local}) + " member " + std::to_string(m) +
                      " of " + std::to_string(members) + " scale " +
                      std::to_string(int(scale));
      // Maxima, then each sum as hi, mid and lo terms, then the target.
      const int64_t width = 4 * members + 1;
      std::vector<double> stats;
      for (int64_t j = 0; j < width; ++j)
        stats.push_back(j < members       ? 0.5 * double(j) - 1.0
                        : j < 2 * members ? 1.0 + double(j)
                        : j < 3 * members ? 0.0078125
                        : j < 4 * members ? -3e-5
                                          : -0.75);
      Operand logits = f32({rows, local}, scale);
      Operand targets = tokens({rows}, local * members);
      Operand summed = given(plan::F32, {rows, width}, stats);
      std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
          {"members", intAttr(members)}};
      std::vector<KernelCase> cs = {
          {"vocab_ce_stats " + s,
           "vocab_ce_stats",
           attrs,
           {logits, targets},
           {f32({rows, width})}},
          {"vocab_cross_entropy " + s,
           "vocab_cross_entropy",
           attrs,
           {summed, logits, targets},
           {f32({})}},
          {"vocab_cross_entropy_grad scale 0.25 " + s,
           "vocab_cross_entropy_grad",
           attrs,
           {summed, logits, targets},
           {f32({rows, local})}},
      };
      cs.back().attrs.push_back({"scale", floatAttr(0.25)});
      // The exponential sum s <= local differs by the exps' few ulp and
      // the summation order; its mid and lo terms carry that difference
      // (absolute, s's rounding): atol 1e-6 s. Maxima and the target's
      // logit are copies, equal.
      cs.front().atol = 1e-6 * double(local);
      for (KernelCase &c : cs) {
        c.tensorMember = m;
        out.push_back(c);
      }
    }
  // A member outside the group: both devices reject it alike.
  KernelCase outside{"vocab_ce_stats member 2 of 2",
                     "vocab_ce_stats",
                     {{"members", intAttr(2)}},
                     {f32({3, 4}), tokens({3}, 8)},
                     {f32({3, 9})}};
  outside.tensorMember = 2;
  outside.rejects = "tensor-parallel member 2 is not one of 2";
  out.push_back(outside);

  for (auto [shape, scale] :
       std::vector<std::pair<std::vector<int64_t>, double>>{
           {{}, 1.0}, {{1}, 0.25}, {{}, -3.0}}) {
    KernelCase c{"loss_accumulate scale " + std::to_string(scale) +
                     (shape.empty() ? " []" : " [1]"),
                 "loss_accumulate",
                 {},
                 {f32(shape, 5)},
                 {}};
    if (scale != 1.0)
      c.attrs.push_back({"scale", floatAttr(scale)});
    c.checksLoss = true;
    out.push_back(c);
  }
}

std::vector<KernelCase> cases() {
  std::vector<KernelCase> out;
  linearCases(out);
  lossCases(out);
  return out;
}

RegisterCases registered(cases());

} // namespace
} // namespace piper::runtime::hal::testing

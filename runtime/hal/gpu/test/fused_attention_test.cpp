// The attention kernels' fused path (cuDNN's on CUDA) on the emulation,
// where the emulated device's host model of the fused attention
// (host/HostFusedAttention.h) stands in for cuDNN: the conversions around it
// (q and k rotated and packed to bf16, dq and dk rotated back), the path's
// wiring (one workspace block, the forward run again for the backward), and
// the model's results against the SIMT kernels, with bounds derived from
// where the fused path rounds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/hal/gpu/AttentionLaunch.h"
#include "runtime/hal/gpu/ElementwiseMath.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"
#include "runtime/hal/gpu/host/HostFusedAttention.h"
#include "runtime/hal/gpu/test/KernelCases.h"
#include "runtime/kernels/Rope.h"

using namespace piper;
using namespace piper::runtime;
using namespace piper::runtime::hal;
namespace g = piper::runtime::hal::PIPER_GPU_NS;

namespace {

g::AttentionShape shapeOf(int64_t batch, int64_t seq, int64_t heads,
                          int64_t kvHeads, int64_t hd, double theta) {
  g::AttentionShape s;
  s.batch = batch;
  s.seq = seq;
  s.heads = heads;
  s.kvHeads = kvHeads;
  s.headDim = hd;
  s.qCols = heads * hd;
  s.kvCols = kvHeads * hd;
  s.cols = s.qCols + 2 * s.kvCols;
  s.ropeTheta = theta;
  s.scale = static_cast<float>(1.0 / std::sqrt(double(hd)));
  return s;
}

/// A host workspace for launchers run directly.
class VectorWorkspace final : public g::Workspace {
public:
  Status reserve(size_t bytes, void *&ptr) override {
    block.resize((bytes + 7) / 8);
    ptr = block.data();
    return Status::ok();
  }
  std::vector<double> block;
};

std::vector<float> normal(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> out(n);
  for (float &x : out)
    x = dist(rng);
  return out;
}

/// (x1, x2) rotated by t * freq (inverse: by its negative), in double.
void rotate(float x1, float x2, int64_t t, double freq, bool inverse, float &o1,
            float &o2) {
  double c = std::cos(double(t) * freq), s = std::sin(double(t) * freq);
  if (inverse)
    s = -s;
  o1 = static_cast<float>(double(x1) * c - double(x2) * s);
  o2 = static_cast<float>(double(x2) * c + double(x1) * s);
}

} // namespace

TEST_CASE("the fused path packs q, k rotated and v to bf16 in qkv's layout, "
          "and rotates dq, dk back") {
  // batch, seq, heads, kv heads, head dim, rope theta.
  struct Config {
    int64_t b, t, h, kv, hd;
    double theta;
  };
  for (Config cfg : {Config{2, 5, 4, 2, 8, 10000.0}, Config{1, 7, 2, 2, 6, 0.0},
                     Config{1, 3, 3, 1, 4, 500000.0}}) {
    g::AttentionShape s =
        shapeOf(cfg.b, cfg.t, cfg.h, cfg.kv, cfg.hd, cfg.theta);
    INFO("b" << cfg.b << " t" << cfg.t << " h" << cfg.h << "/" << cfg.kv
             << " hd" << cfg.hd << " theta " << cfg.theta);
    const size_t n = size_t(s.rows() * s.cols);
    std::vector<float> qkv = normal(n, 1);
    std::vector<uint16_t> packed(n, 0xFFFF);
    std::vector<char> table(g::attentionRopeTableBytes(s) + 1);
    g::Context ctx;
    REQUIRE(g::launchAttentionPackBf16(ctx, s, qkv.data(), packed.data(),
                                       table.data()));
    std::vector<uint16_t> grad16(n);
    for (size_t e = 0; e < n; ++e)
      grad16[e] = g::toBf16(qkv[(e * 7) % n] * 0.5f);
    std::vector<float> grad(n, NAN);
    REQUIRE(g::launchAttentionUnpackGradBf16(ctx, s, grad16.data(), grad.data(),
                                             table.data()));
    int mismatches = 0;
    const int64_t half = cfg.hd / 2, rotatedCols = s.qCols + s.kvCols;
    for (int64_t r = 0; r < s.rows(); ++r)
      for (int64_t c = 0; c < s.cols; ++c) {
        const size_t e = size_t(r * s.cols + c);
        float wantPacked, wantGrad;
        if (c >= rotatedCols || cfg.theta == 0) {
          wantPacked = qkv[e];
          wantGrad = g::fromBf16(grad16[e]);
        } else {
          // The column's pair: (c, c + half) or (c - half, c) of its head.
          int64_t inHead = c % cfg.hd, i = inHead % half;
          size_t first = e - size_t(inHead >= half ? half : 0);
          double freq = ropeFrequency(cfg.theta, cfg.hd, i, RopeScaling{});
          float o1, o2, d1, d2;
          int64_t t = r % cfg.t;
          rotate(qkv[first], qkv[first + half], t, freq, false, o1, o2);
          rotate(g::fromBf16(grad16[first]), g::fromBf16(grad16[first + half]),
                 t, freq, true, d1, d2);
          wantPacked = inHead >= half ? o2 : o1;
          wantGrad = inHead >= half ? d2 : d1;
        }
        if (packed[e] != g::toBf16(wantPacked) ||
            !(std::fabs(grad[e] - wantGrad) <= 1e-6f * std::fabs(wantGrad)))
          ++mismatches;
      }
    CHECK(mismatches == 0);
  }
}

namespace {

/// bf16-exact operand values (|x| <= 0.75), repeated to fill; 7 and 5 do
/// not divide the shapes' sizes, so rows and heads differ.
const std::vector<double> kQkv = {0.5,   -0.25,  0.75, -0.125,
                                  0.375, -0.625, 0.25};
const std::vector<double> kDy = {0.25, -0.5, 0.125, 0.375, -0.75};
constexpr double kBf16Unit = 1.0 / 256; // 2^-8: bf16's rounding, relative

/// The attention (or attention_grad) case of that shape. The backward's y
/// and lse are the forward's on `forwardOn` (the fused path reads them; the
/// SIMT kernels recompute the softmax).
testing::KernelCase attentionCase(bool grad, int64_t b, int64_t t, int64_t h,
                                  int64_t kv, int64_t hd,
                                  Device *forwardOn = nullptr) {
  testing::KernelCase c;
  int64_t rows = b * t, cols = (h + 2 * kv) * hd;
  c.name = std::string(grad ? "attention_grad" : "attention") + " b" +
           std::to_string(b) + " t" + std::to_string(t) + " h" +
           std::to_string(h) + "/" + std::to_string(kv) + " hd" +
           std::to_string(hd);
  c.op = grad ? "attention_grad" : "attention";
  c.attrs = {{"heads", testing::intAttr(h)},
             {"kv_heads", testing::intAttr(kv)},
             {"seq", testing::intAttr(t)}};
  c.inputs = {testing::given(plan::F32, {rows, cols}, kQkv)};
  if (grad) {
    testing::KernelCase forward = attentionCase(false, b, t, h, kv, hd);
    std::vector<std::vector<uint32_t>> words;
    REQUIRE(forwardOn);
    REQUIRE(testing::runOutputsFrom(forward, *forwardOn, 0, words) == "");
    REQUIRE(words.size() == 2);
    for (size_t o = 0; o < 2; ++o) {
      std::vector<double> values;
      for (uint32_t w : words[o]) {
        float f;
        std::memcpy(&f, &w, sizeof f);
        values.push_back(f);
      }
      c.inputs.push_back(testing::given(plan::F32,
                                        o == 0
                                            ? std::vector<int64_t>{rows, h * hd}
                                            : std::vector<int64_t>{rows, 2 * h},
                                        values));
    }
    c.inputs.push_back(testing::given(plan::F32, {rows, h * hd}, kDy));
    c.outputs = {testing::zeros({rows, cols})};
  } else {
    c.outputs = {testing::zeros({rows, h * hd}), testing::lsePairs(rows, h)};
  }
  c.lowPrecision = true;
  // The operands are bf16 values and there is no rotation, so the fused
  // path packs them exactly. The model computes in double and rounds its
  // outputs to bf16 (at most 2^-8 of the exact value); the SIMT kernels
  // hold 1e-5 relative + 1e-6 of it (their fp32 cases). Hence
  // |fused - simt| <= (2^-8 + 2e-5) |simt| + 2e-6.
  c.rtol = kBf16Unit + 2e-5;
  c.atol = 2e-6;
  if (grad) {
    // The backward's D_i = <dy_i, y_i> uses the forward's bf16 y (as
    // cuDNN's does): |dD_i| <= 2^-8 hd max|dy| max|v| (|y| <= max|v|). It
    // moves dS_ij = P_ij (dP_ij - D_i) by P_ij |dD_i|, so dq_i by at most
    // scale |dD| max|k| (sum_j P_ij = 1) and dk_j by at most
    // scale |dD| max|q| group t (a key's probabilities over the group's
    // queries sum to at most group t); dv does not use D.
    const double maxAbs = 0.75, scale = 1.0 / std::sqrt(double(hd));
    const double dD = kBf16Unit * double(hd) * maxAbs * maxAbs;
    c.atol += scale * dD * maxAbs * double(h / kv) * double(t);
  }
  return c;
}

} // namespace

TEST_CASE("the emulated fused attention agrees with the SIMT kernels within "
          "its bf16 roundings") {
  DeviceOptions fusedOptions;
  fusedOptions.attention = AttentionChoice::Cudnn;
  auto simt = createEmulatedGpuDevice(nullptr);
  auto fused = createEmulatedGpuDevice(nullptr, fusedOptions);
  for (bool grad : {false, true})
    for (auto [b, t, h, kv, hd] :
         std::vector<std::array<int64_t, 5>>{{2, 7, 4, 2, 16},
                                             {1, 5, 2, 2, 8},
                                             {2, 3, 4, 1, 8},
                                             {1, 1, 1, 1, 4}}) {
      testing::KernelCase c = attentionCase(grad, b, t, h, kv, hd, fused.get());
      INFO(c.name << ", atol " << c.atol);
      testing::CaseResult r = testing::runCase(c, *simt, *fused);
      CHECK(r.error == "");
      // The backward's roundings show: the paths differ (a fused path that
      // silently ran the SIMT kernels would agree to 1e-5). With one token
      // y = v, dv = dy and dq = dk = 0, all bf16 values: there they agree.
      // The forward's outputs are rounded to bf16 by both (the SIMT y by
      // the kernel in mixed precision, KernelEntry::roundsOutputs) and may
      // agree exactly; the preparing test below counts the fused calls.
      if (t > 1 && grad)
        CHECK(r.worstRelative > 1e-3);
    }
}

TEST_CASE("the fused path's backward is the model's on the packed operands, "
          "bit for bit, with rotary embeddings and grouped heads") {
  // What the kernel does around the fused attention (pack with rotation,
  // y packed and the statistics taken from the forward's lse, dy packed,
  // dq and dk rotated back), done here step by step on the model itself.
  g::AttentionShape s = shapeOf(2, 6, 4, 2, 8, 10000.0);
  const size_t n = size_t(s.rows() * s.cols), ny = size_t(s.rows() * s.qCols);
  std::vector<float> qkv = normal(n, 3), dy = normal(ny, 4);
  for (float &x : qkv)
    x = g::fromBf16(g::toBf16(x));
  for (float &x : dy)
    x = g::fromBf16(g::toBf16(x));

  g::HostFusedAttentionProvider provider;
  g::Context ctx;
  g::FusedAttentionShape fs{s.batch,   s.seq,     s.heads,
                            s.kvHeads, s.headDim, s.scale};
  const g::FusedAttention *model = nullptr;
  REQUIRE(provider.get(ctx, fs, model));
  REQUIRE(model);
  std::vector<char> table(g::attentionRopeTableBytes(s));
  std::vector<uint16_t> qkv16(n), y16(ny), dy16(ny), dqkv16(n);
  std::vector<float> stats(size_t(s.batch * s.heads * s.seq));
  REQUIRE(g::launchAttentionPackBf16(ctx, s, qkv.data(), qkv16.data(),
                                     table.data()));
  REQUIRE(model->forward(ctx, qkv16.data(), y16.data(), stats.data(), nullptr));
  for (size_t e = 0; e < ny; ++e)
    dy16[e] = g::toBf16(dy[e]);
  REQUIRE(model->backward(ctx, qkv16.data(), y16.data(), dy16.data(),
                          stats.data(), dqkv16.data(), nullptr));
  // dq and dk rotated back, then rounded to bf16 as the executor rounds
  // a mixed-precision output (the kernel rounds dqkv itself:
  // Device::roundsOutputs).
  std::vector<float> want(n);
  REQUIRE(g::launchAttentionUnpackGradBf16(ctx, s, dqkv16.data(), want.data(),
                                           table.data()));
  for (float &x : want)
    x = g::fromBf16(g::toBf16(x));
  // The forward's outputs as the attention kernel gives them: y up-cast,
  // the statistics as lse pairs, which give them back exactly.
  std::vector<float> y(ny), lse(size_t(s.rows() * 2 * s.heads), NAN),
      back(stats.size(), NAN);
  for (size_t e = 0; e < ny; ++e)
    y[e] = g::fromBf16(y16[e]);
  REQUIRE(g::launchStatsToLse(ctx, s, stats.data(), lse.data()));
  REQUIRE(g::launchLseToStats(ctx, s, lse.data(), back.data()));
  CHECK(std::memcmp(back.data(), stats.data(), stats.size() * sizeof(float)) ==
        0);

  // The same through the attention_grad kernel of a device whose attention
  // is the model.
  DeviceOptions fusedOptions;
  fusedOptions.attention = AttentionChoice::Cudnn;
  auto device = createEmulatedGpuDevice(nullptr, fusedOptions);
  plan::Kernel kernel;
  kernel.set_op("attention_grad");
  (*kernel.mutable_attrs())["heads"] = testing::intAttr(s.heads);
  (*kernel.mutable_attrs())["kv_heads"] = testing::intAttr(s.kvHeads);
  (*kernel.mutable_attrs())["seq"] = testing::intAttr(s.seq);
  (*kernel.mutable_attrs())["rope_theta"] = testing::floatAttr(s.ropeTheta);
  std::vector<float> got(n, NAN);
  std::vector<TensorRef> ins = {
      TensorRef{plan::F32, {s.rows(), s.cols}, qkv.data()},
      TensorRef{plan::F32, {s.rows(), s.qCols}, y.data()},
      TensorRef{plan::F32, {s.rows(), 2 * s.heads}, lse.data()},
      TensorRef{plan::F32, {s.rows(), s.qCols}, dy.data()}};
  std::vector<TensorRef> outs = {
      TensorRef{plan::F32, {s.rows(), s.cols}, got.data()}};
  KernelContext kctx;
  kctx.lowPrecision = true;
  const KernelInfo *info = device->findKernel("attention_grad");
  REQUIRE(info);
  Status st = device->runKernel(*info, kernel, decodeKernelAttrs(kernel), ins,
                                outs, kctx);
  INFO(st.message());
  REQUIRE(st);
  int differ = 0;
  for (size_t e = 0; e < n; ++e)
    differ += std::memcmp(&got[e], &want[e], sizeof(float)) != 0;
  CHECK(differ == 0);
  // And the rotation mattered: without it the gradient differs.
  bool anyNonZero = false;
  for (float x : got)
    anyNonZero |= x != 0;
  CHECK(anyNonZero);

  // y given packed (a step buffer that only GEMMs and attention_grad read,
  // Device::readsPackedInput): the fused backward reads it as it is, with
  // the same bits.
  std::vector<float> gotPacked(n, NAN);
  ins[1] = TensorRef{plan::BF16, {s.rows(), s.qCols}, y16.data()};
  outs[0].data = gotPacked.data();
  REQUIRE(device->runKernel(*info, kernel, decodeKernelAttrs(kernel), ins, outs,
                            kctx));
  CHECK(std::memcmp(gotPacked.data(), want.data(), n * sizeof(float)) == 0);

  // dqkv stored packed (read only by the QKV projection's GEMMs,
  // Device::writesPackedOutput): the same values, packed.
  std::vector<uint16_t> dqkvGot(n, 0xFFFF);
  outs[0] = TensorRef{plan::BF16, {s.rows(), s.cols}, dqkvGot.data()};
  REQUIRE(device->runKernel(*info, kernel, decodeKernelAttrs(kernel), ins, outs,
                            kctx));
  int packedDiffer = 0;
  for (size_t e = 0; e < n; ++e)
    packedDiffer += dqkvGot[e] != g::toBf16(want[e]);
  CHECK(packedDiffer == 0);

  // And the forward stores a packed y (Device::writesPackedOutput) as the
  // model writes it, lse rounded to bf16 as in every mixed-precision call
  // (the kernel rounds its outputs itself: Device::roundsOutputs).
  kernel.set_op("attention");
  const KernelInfo *forward = device->findKernel("attention");
  REQUIRE(forward);
  std::vector<uint16_t> yGot(ny, 0xFFFF);
  std::vector<float> lseGot(lse.size(), NAN);
  std::vector<TensorRef> forwardIns = {
      TensorRef{plan::F32, {s.rows(), s.cols}, qkv.data()}};
  std::vector<TensorRef> forwardOuts = {
      TensorRef{plan::BF16, {s.rows(), s.qCols}, yGot.data()},
      TensorRef{plan::F32, {s.rows(), 2 * s.heads}, lseGot.data()}};
  REQUIRE(device->runKernel(*forward, kernel, decodeKernelAttrs(kernel),
                            forwardIns, forwardOuts, kctx));
  CHECK(yGot == y16);
  for (float &x : lse)
    x = g::fromBf16(g::toBf16(x));
  CHECK(std::memcmp(lseGot.data(), lse.data(), lse.size() * sizeof(float)) ==
        0);
}

TEST_CASE("--attention cudnn refuses fp32 plans; simt and fp32 run the SIMT "
          "kernels") {
  DeviceOptions fusedOptions;
  fusedOptions.attention = AttentionChoice::Cudnn;
  auto fused = createEmulatedGpuDevice(nullptr, fusedOptions);
  testing::KernelCase c = attentionCase(false, 1, 3, 2, 2, 8);
  c.lowPrecision = false;
  auto simt = createEmulatedGpuDevice(nullptr);
  testing::CaseResult r = testing::runCase(c, *simt, *fused);
  CHECK(r.error.find("--attention cudnn: cuDNN's fused attention runs bf16 "
                     "plans only") != std::string::npos);
  // Auto on the emulation (no cuDNN) is the SIMT kernels: the same bits.
  DeviceOptions autoOptions;
  auto autoDevice = createEmulatedGpuDevice(nullptr, autoOptions);
  c.lowPrecision = true;
  c.rtol = 0;
  c.atol = 0;
  r = testing::runCase(c, *simt, *autoDevice);
  CHECK(r.error == "");
}

namespace {

/// The host model of the fused attention, counting the calls for a shape.
class CountingProvider final : public g::FusedAttentionProvider {
public:
  Status get(const g::Context &ctx, const g::FusedAttentionShape &s,
             const g::FusedAttention *&out) override {
    ++asked;
    last = s;
    return model.get(ctx, s, out);
  }
  g::HostFusedAttentionProvider model;
  int asked = 0;
  g::FusedAttentionShape last;
};

/// A host workspace that records the largest block asked of it.
class RecordingWorkspace final : public g::Workspace {
public:
  Status reserve(size_t bytes, void *&ptr) override {
    largest = std::max(largest, bytes);
    block.resize((largest + 7) / 8);
    ptr = block.data();
    return Status::ok();
  }
  size_t largest = 0;
  std::vector<double> block;
};

/// One attention or attention_grad call of batch 2, seq 3, 2 heads over 1
/// key/value head of 8: its kernel, and operands of its shapes (data
/// null, as the executor passes them to prepareKernel).
struct AttentionCall {
  explicit AttentionCall(bool grad) {
    const int64_t rows = 6, cols = (2 + 2 * 1) * 8;
    kernel.set_op(grad ? "attention_grad" : "attention");
    auto &attrs = *kernel.mutable_attrs();
    attrs["heads"] = testing::intAttr(2);
    attrs["kv_heads"] = testing::intAttr(1);
    attrs["seq"] = testing::intAttr(3);
    auto ref = [](std::vector<int64_t> shape) {
      return TensorRef{plan::F32, std::move(shape), nullptr};
    };
    if (grad) {
      inputs = {ref({rows, cols}), ref({rows, 16}), ref({rows, 4}),
                ref({rows, 16})};
      outputs = {ref({rows, cols})};
    } else {
      inputs = {ref({rows, cols})};
      outputs = {ref({rows, 16}), ref({rows, 4})};
    }
  }
  Status prepare(const g::Context &ctx) {
    return g::prepareKernel(*g::findKernelInfo(kernel.op()), kernel,
                            decodeKernelAttrs(kernel), inputs, outputs, kctx,
                            ctx);
  }
  /// The call itself, on host operands of zeros.
  Status run(const g::Context &ctx) {
    std::vector<std::vector<float>> data;
    std::vector<TensorRef> ins = inputs, outs = outputs;
    for (auto *refs : {&ins, &outs})
      for (TensorRef &t : *refs) {
        data.emplace_back(static_cast<size_t>(t.numel()), 0.0f);
        t.data = data.back().data();
      }
    return g::runKernel(*g::findKernelInfo(kernel.op()), kernel,
                        decodeKernelAttrs(kernel), ins, outs, kctx, ctx);
  }
  plan::Kernel kernel;
  std::vector<TensorRef> inputs, outputs;
  KernelContext kctx;
};

} // namespace

TEST_CASE("preparing the attention kernels when a plan loads builds the fused "
          "attention of their shape and reserves their scratch: a call "
          "builds and grows nothing") {
  CountingProvider provider;
  RecordingWorkspace workspace;
  g::Context ctx;
  ctx.bf16 = true;
  ctx.attention = g::AttentionMode::Cudnn;
  ctx.fused = &provider;
  ctx.workspace = &workspace;

  AttentionCall forward(false), backward(true);
  REQUIRE(forward.prepare(ctx));
  CHECK(provider.asked == 1);
  CHECK(provider.last.batch == 2);
  CHECK(provider.last.seq == 3);
  CHECK(provider.last.heads == 2);
  CHECK(provider.last.kvHeads == 1);
  CHECK(provider.last.headDim == 8);
  CHECK(provider.last.scale == static_cast<float>(1.0 / std::sqrt(8.0)));
  const size_t forwardScratch = workspace.largest;
  CHECK(forwardScratch > 0);
  REQUIRE(backward.prepare(ctx));
  CHECK(provider.asked == 2);
  // The backward's block adds bf16 dy and dqkv to the forward's.
  const size_t prepared = workspace.largest;
  CHECK(prepared > forwardScratch);

  // The calls find what was prepared: the same shape, no larger block.
  REQUIRE(forward.run(ctx));
  REQUIRE(backward.run(ctx));
  CHECK(provider.asked == 4);
  CHECK(provider.last.seq == 3);
  CHECK(workspace.largest == prepared);

  SECTION("--attention cudnn on an fp32 plan fails when the plan loads") {
    ctx.bf16 = false;
    Status st = forward.prepare(ctx);
    CHECK(st.message().find("--attention cudnn: cuDNN's fused attention "
                            "runs bf16 plans only") == 0);
  }
  SECTION("the SIMT kernels reserve their scratch, no fused attention") {
    ctx.attention = g::AttentionMode::Simt;
    RecordingWorkspace simt;
    ctx.workspace = &simt;
    REQUIRE(forward.prepare(ctx));
    REQUIRE(backward.prepare(ctx));
    CHECK(provider.asked == 4);
    const size_t simtPrepared = simt.largest;
    REQUIRE(forward.run(ctx));
    REQUIRE(backward.run(ctx));
    CHECK(simt.largest == simtPrepared);
  }
  SECTION("a kernel without preparation, and a malformed call") {
    plan::Kernel gelu;
    gelu.set_op("gelu");
    KernelContext kctx;
    std::vector<TensorRef> none;
    CHECK(g::prepareKernel(*g::findKernelInfo("gelu"), gelu,
                           decodeKernelAttrs(gelu), none, none, kctx, ctx));
    forward.outputs.pop_back();
    Status st = forward.prepare(ctx);
    CHECK(st.message() == "attention: expected 2 outputs, got 1");
  }
}

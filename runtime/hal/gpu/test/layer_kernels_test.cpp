// The layer GPU kernels beyond the shared cases (LayerCases.cpp): malformed
// calls get the CPU kernels' errors, out-of-range ids (which only the CPU
// kernels reject: the GPU wrapper never reads tensor data) are skipped
// without an out-of-bounds access, and the worst error of each layer
// kernel's cases, printed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <set>

#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"
#include "runtime/hal/gpu/test/KernelCases.h"
#include "support/Precision.h"

using namespace piper;
using namespace piper::runtime;
using namespace piper::runtime::hal;
using namespace piper::runtime::hal::testing;

namespace {

const std::set<std::string> kLayerOps = {"embedding",
                                         "embedding_grad",
                                         "position_add",
                                         "position_add_grad",
                                         "layer_norm",
                                         "layer_norm_grad_input",
                                         "layer_norm_grad_weight",
                                         "rms_norm",
                                         "rms_norm_grad_input",
                                         "rms_norm_grad_weight",
                                         "add_layer_norm",
                                         "add_rms_norm",
                                         "layer_norm_grad_input_add",
                                         "rms_norm_grad_input_add",
                                         "qk_norm",
                                         "qk_norm_grad_input",
                                         "qk_norm_grad_weight"};

} // namespace

TEST_CASE("malformed layer calls fail on the GPU with the CPU's message") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  struct Bad {
    KernelCase c;
    std::string message; // a part of the expected message
  };
  std::vector<Bad> bad = {
      {{"embedding f32 ids",
        "embedding",
        {},
        {f32({4}), f32({5, 3})},
        {zeros({4, 3})}},
       "ids"},
      {{"embedding wrong y",
        "embedding",
        {},
        {tokens({4}, 5), f32({5, 3})},
        {zeros({4, 2})}},
       "y has shape [4,2], expected [4,3]"},
      {{"embedding_grad vocab mismatch",
        "embedding_grad",
        {{"vocab", intAttr(6)}},
        {tokens({4}, 5), f32({4, 3})},
        {zeros({5, 3})}},
       "attribute 'vocab' is 6 but dtable has 5 rows"},
      {{"position_add rows not a multiple of seq",
        "position_add",
        {{"seq", intAttr(4)}},
        {f32({6, 3}), f32({4, 3})},
        {zeros({6, 3})}},
       "not a multiple of seq 4"},
      {{"position_add_grad too few positions",
        "position_add_grad",
        {{"seq", intAttr(4)}},
        {f32({8, 3})},
        {zeros({3, 3})}},
       "fewer than seq 4"},
      {{"layer_norm negative eps",
        "layer_norm",
        {{"eps", floatAttr(-1)}},
        {f32({2, 3}), f32({3}), f32({3})},
        {zeros({2, 3})}},
       "attribute 'eps' must not be negative"},
      {{"layer_norm_grad_input wrong gamma",
        "layer_norm_grad_input",
        {},
        {f32({2, 3}), f32({4}), f32({2, 3})},
        {zeros({2, 3})}},
       "gamma has shape [4], expected [3]"},
      {{"layer_norm_grad_weight one output",
        "layer_norm_grad_weight",
        {},
        {f32({2, 3}), f32({2, 3})},
        {zeros({3})}},
       "expected 2 outputs, got 1"},
      {{"rms_norm rank 1 x",
        "rms_norm",
        {},
        {f32({3}), f32({3})},
        {zeros({3})}},
       "x has shape [3], expected rank 2"},
      {{"rms_norm_grad_input wrong dy",
        "rms_norm_grad_input",
        {},
        {f32({2, 3}), f32({3}), f32({3, 2})},
        {zeros({2, 3})}},
       "dy has shape [3,2], expected [2,3]"},
      {{"rms_norm_grad_weight wrong dgamma",
        "rms_norm_grad_weight",
        {},
        {f32({2, 3}), f32({2, 3})},
        {zeros({2})}},
       "dgamma has shape [2], expected [3]"},
      {{"add_layer_norm wrong r",
        "add_layer_norm",
        {},
        {f32({2, 3}), f32({3, 2}), f32({3}), f32({3})},
        {zeros({2, 3}), zeros({2, 3})}},
       "r has shape [3,2], expected [2,3]"},
      {{"add_rms_norm one output",
        "add_rms_norm",
        {},
        {f32({2, 3}), f32({2, 3}), f32({3})},
        {zeros({2, 3})}},
       "expected 2 outputs, got 1"},
      {{"rms_norm_grad_input_add wrong r",
        "rms_norm_grad_input_add",
        {},
        {f32({2, 3}), f32({3}), f32({2, 3}), f32({2, 4})},
        {zeros({2, 3})}},
       "r has shape [2,4], expected [2,3]"},
      {{"layer_norm_grad_input_add no r",
        "layer_norm_grad_input_add",
        {},
        {f32({2, 3}), f32({3}), f32({2, 3})},
        {zeros({2, 3})}},
       "expected 4 inputs, got 3"},
      {{"qk_norm no heads",
        "qk_norm",
        {},
        {f32({2, 6}), f32({2})},
        {zeros({2, 6})}},
       "missing attribute 'heads'"},
      {{"qk_norm kv_heads not dividing heads",
        "qk_norm",
        {{"heads", intAttr(3)}, {"kv_heads", intAttr(2)}},
        {f32({2, 14}), f32({4})},
        {zeros({2, 14})}},
       "attribute 'heads' (3) must be a multiple of 'kv_heads' (2)"},
      {{"qk_norm width not whole heads",
        "qk_norm",
        {{"heads", intAttr(2)}},
        {f32({2, 7}), f32({2})},
        {zeros({2, 7})}},
       "qkv has 7 columns, not a positive multiple of heads + 2 kv_heads = 6"},
      {{"qk_norm_grad_input wrong gamma",
        "qk_norm_grad_input",
        {{"heads", intAttr(2)}},
        {f32({2, 12}), f32({2}), f32({2, 12})},
        {zeros({2, 12})}},
       "gamma has shape [2], expected [4]"},
      {{"qk_norm_grad_weight wrong dgamma",
        "qk_norm_grad_weight",
        {{"heads", intAttr(2)}},
        {f32({2, 12}), f32({2, 12})},
        {zeros({2})}},
       "dgamma has shape [2], expected [4]"},
  };
  std::set<std::string> covered;
  for (const Bad &b : bad) {
    INFO("case " << b.c.name);
    covered.insert(b.c.op);
    // Both sides fail: "<cpu>: <message>; <gpu>: <message>".
    std::string error = runCase(b.c, *cpu, *gpu).error;
    std::string cpuPrefix = cpu->name() + ": ";
    std::string gpuPrefix = "; " + gpu->name() + ": ";
    size_t split = error.find(gpuPrefix);
    REQUIRE(error.rfind(cpuPrefix, 0) == 0);
    REQUIRE(split != std::string::npos);
    std::string cpuMessage =
        error.substr(cpuPrefix.size(), split - cpuPrefix.size());
    std::string gpuMessage = error.substr(split + gpuPrefix.size());
    CHECK(cpuMessage == gpuMessage);
    CHECK(cpuMessage.find(b.message) != std::string::npos);
  }
  CHECK(covered == kLayerOps);
}

namespace {

struct Host {
  std::vector<int64_t> shape;
  std::vector<float> values; // I32: the ids' bits
  plan::DType dtype = plan::F32;
};

/// A call's attributes and the rank's members (runOp).
struct Call {
  std::vector<std::pair<std::string, plan::AttrValue>> attrs;
  int64_t tensorMember = 0, contextMember = 0;
};

// Runs `op` (default attributes) on `device` as the executor does: the
// outputs, of `outShapes` (zeros), rounded to bf16 in mixed precision unless
// the kernel rounds them itself (Device::roundsOutputs). With `accumulate`
// (the attribute), the outputs start as `accumulators` and are state the
// executor does not round.
std::vector<Host>
runOp(Device &device, const std::string &op, const std::vector<Host> &ins,
      const std::vector<std::vector<int64_t>> &outShapes, bool lowPrecision,
      const std::vector<Host> &accumulators = {}, const Call &call = {}) {
  const bool accumulate = !accumulators.empty();
  DeviceRun run{device, {}, {}, {}};
  auto words = [](const std::vector<float> &v) {
    std::vector<uint32_t> w(v.size());
    std::memcpy(w.data(), v.data(), v.size() * 4);
    return w;
  };
  std::vector<TensorRef> inRefs, outRefs;
  for (const Host &h : ins)
    inRefs.push_back(run.upload(h.dtype == plan::F32 ? f32(h.shape)
                                                     : zeros(h.shape, h.dtype),
                                words(h.values)));
  for (size_t o = 0; o < outShapes.size(); ++o) {
    int64_t n = 1;
    for (int64_t d : outShapes[o])
      n *= d;
    outRefs.push_back(run.upload(
        f32(outShapes[o]),
        accumulate ? words(accumulators[o].values)
                   : std::vector<uint32_t>(static_cast<size_t>(n), 0u)));
  }
  REQUIRE(run.status);
  const KernelInfo *info = device.findKernel(op);
  REQUIRE(info);
  plan::Kernel kernel;
  kernel.set_op(op);
  if (accumulate && op != "accumulate") // the kernel's flag
    (*kernel.mutable_attrs())["accumulate"] = intAttr(1);
  for (const auto &[name, value] : call.attrs)
    (*kernel.mutable_attrs())[name] = value;
  KernelContext ctx;
  ctx.lowPrecision = lowPrecision;
  ctx.tensorMember = call.tensorMember;
  ctx.contextMember = call.contextMember;
  REQUIRE(device.runKernel(*info, kernel, decodeKernelAttrs(kernel), inRefs,
                           outRefs, ctx));
  std::vector<Host> outs;
  for (size_t o = 0; o < outRefs.size(); ++o) {
    std::vector<uint32_t> w = run.download(outRefs[o]);
    Host h{outShapes[o], std::vector<float>(w.size())};
    std::memcpy(h.values.data(), w.data(), w.size() * 4);
    if (lowPrecision && !device.roundsOutputs(*info) && !accumulate)
      for (float &v : h.values)
        v = roundToBf16(v);
    outs.push_back(h);
  }
  REQUIRE(run.status);
  return outs;
}

// N(shift, scale^2) values of `shape`, held as bf16 values when `bf16` (the
// executor's operands in mixed precision).
Host randomHost(std::mt19937_64 &rng, std::vector<int64_t> shape, bool bf16,
                float scale = 1, float shift = 0) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Host h{shape, {}};
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  for (int64_t i = 0; i < n; ++i) {
    float v = shift + scale * normal(rng);
    h.values.push_back(bf16 ? roundToBf16(v) : v);
  }
  return h;
}

bool sameBits(const Host &a, const Host &b) {
  return a.values.size() == b.values.size() &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * 4) ==
             0;
}

} // namespace

// The compiler's residual fusions: add_layer_norm is add then layer_norm
// (and add_rms_norm add then rms_norm), *_grad_input_add the norm's
// grad_input then add, bit for bit, in fp32 and in mixed precision (with
// the executor's rounding of the first kernel's output in between), on the
// CPU and on the emulated GPU. Rows wider than a warp's stride and odd.
TEST_CASE("the residual norms are add and the norm, bit for bit, on the CPU "
          "and the emulated GPU") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  const int64_t rows = 7, hidden = 45;
  std::mt19937_64 rng(41);
  for (bool low : {false, true}) {
    // Operands hold bf16 values in mixed precision (the executor's).
    auto operand = [&](std::vector<int64_t> shape, float scale, float shift) {
      return randomHost(rng, shape, low, scale, shift);
    };
    const std::vector<int64_t> m = {rows, hidden}, vec = {hidden};
    Host x = operand(m, 3, 0), r = operand(m, 1, 0), dy = operand(m, 1, 0);
    Host gamma = operand(vec, 0.2f, 1), beta = operand(vec, 1, 0);
    for (Device *d : {cpu.get(), gpu.get()}) {
      for (std::string norm : {"layer_norm", "rms_norm"}) {
        INFO(d->name() << " " << norm << " lowPrecision=" << low);
        std::vector<Host> params = {gamma};
        if (norm == "layer_norm")
          params.push_back(beta);
        Host s = runOp(*d, "add", {x, r}, {m}, low)[0];
        std::vector<Host> normIns = {s};
        normIns.insert(normIns.end(), params.begin(), params.end());
        Host y = runOp(*d, norm, normIns, {m}, low)[0];
        std::vector<Host> fusedIns = {x, r};
        fusedIns.insert(fusedIns.end(), params.begin(), params.end());
        std::vector<Host> fused =
            runOp(*d, "add_" + norm, fusedIns, {m, m}, low);
        CHECK(sameBits(fused[0], s));
        CHECK(sameBits(fused[1], y));
        CHECK(!sameBits(y, x)); // it ran

        Host dx = runOp(*d, norm + "_grad_input", {s, gamma, dy}, {m}, low)[0];
        Host sum = runOp(*d, "add", {r, dx}, {m}, low)[0];
        Host fusedDx =
            runOp(*d, norm + "_grad_input_add", {s, gamma, dy, r}, {m}, low)[0];
        CHECK(sameBits(fusedDx, sum));
        CHECK(!sameBits(sum, dx));
      }
    }
  }
}

// The compiler's GEMM epilogue fusions with GELU: linear_gelu is linear
// then gelu (h and y), linear_grad_input_gelu linear_grad_input then
// gelu_grad, bit for bit, in fp32 and in mixed precision (the executor's
// rounding of the first kernel's output in between; linear_gelu rounds
// its outputs itself, Device::roundsOutputs), with and without a bias, on
// the CPU and on the emulated GPU (whose GEMMs have no GELU epilogue; on
// CUDA cuBLASLt's applies GELU to the unrounded product: not run here).
TEST_CASE("the GELU linears are linear and gelu, bit for bit, on the CPU and "
          "the emulated GPU") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  const int64_t rows = 9, in = 13, out = 37;
  std::mt19937_64 rng(47);
  for (bool low : {false, true}) {
    const std::vector<int64_t> xs = {rows, in}, ws = {in, out},
                               hs = {rows, out}, bs = {out};
    Host x = randomHost(rng, xs, low), w = randomHost(rng, ws, low, 0.3f);
    Host b = randomHost(rng, bs, low);
    Host dout = randomHost(rng, hs, low);
    for (Device *d : {cpu.get(), gpu.get()}) {
      for (bool bias : {false, true}) {
        INFO(d->name() << " lowPrecision=" << low << " bias=" << bias);
        std::vector<Host> ins = {x, w};
        if (bias)
          ins.push_back(b);
        Host h = runOp(*d, "linear", ins, {hs}, low)[0];
        Host y = runOp(*d, "gelu", {h}, {hs}, low)[0];
        std::vector<Host> fused = runOp(*d, "linear_gelu", ins, {hs, hs}, low);
        CHECK(sameBits(fused[0], h));
        CHECK(sameBits(fused[1], y));
        CHECK(!sameBits(y, h)); // it ran
      }
      // The next linear's backward: dy [rows, out] through w to the
      // pre-activation x [rows, in] of this GELU.
      INFO(d->name() << " lowPrecision=" << low << " backward");
      Host dx = runOp(*d, "linear_grad_input", {dout, w}, {xs}, low)[0];
      Host dh = runOp(*d, "gelu_grad", {x, dx}, {xs}, low)[0];
      Host fused =
          runOp(*d, "linear_grad_input_gelu", {dout, w, x}, {xs}, low)[0];
      CHECK(sameBits(fused, dh));
      CHECK(!sameBits(dh, dx)); // it ran
    }
  }
}

// The compiler's accumulation of the norms' weight gradients:
// layer_norm_grad_weight (rms_norm_grad_weight) with `accumulate` adds its
// gradients to the accumulators as the kernel then an `accumulate` kernel
// per gradient do, bit for bit, in fp32 and in mixed precision (the
// executor rounds the unfused kernel's outputs; `accumulate` runs in fp32),
// on the CPU and on the emulated GPU.
TEST_CASE("the norms' weight gradients accumulate as the accumulate kernels "
          "do, bit for bit, on the CPU and the emulated GPU") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  const int64_t rows = 70, hidden = 37; // several column chunks
  std::mt19937_64 rng(43);
  auto random = [&](std::vector<int64_t> shape, bool low) {
    return randomHost(rng, shape, low);
  };
  for (bool low : {false, true}) {
    Host x = random({rows, hidden}, low), dy = random({rows, hidden}, low);
    for (Device *d : {cpu.get(), gpu.get()}) {
      for (std::string norm : {"layer_norm", "rms_norm"}) {
        INFO(d->name() << " " << norm << " lowPrecision=" << low);
        const std::string op = norm + "_grad_weight";
        const size_t outs = norm == "layer_norm" ? 2 : 1;
        std::vector<std::vector<int64_t>> shapes(outs, {hidden});
        std::vector<Host> grads;
        for (size_t o = 0; o < outs; ++o)
          grads.push_back(random({hidden}, false));
        std::vector<Host> sums = runOp(*d, op, {x, dy}, shapes, low);
        std::vector<Host> fused = runOp(*d, op, {x, dy}, shapes, low, grads);
        for (size_t o = 0; o < outs; ++o) {
          Host unfused = runOp(*d, "accumulate", {sums[o]}, {{hidden}}, false,
                               {grads[o]})[0];
          CHECK(sameBits(fused[o], unfused));
          CHECK(!sameBits(fused[o], grads[o])); // it added
        }
      }
    }
  }
}

// The embeddings' gradients with `accumulate` (the compiler's fusion of
// the accumulate kernel after them) are the kernel, the executor's rounding
// in mixed precision and `accumulate`, bit for bit, on the CPU and the
// emulated GPU: rows with a gradient and rows without (ids that do not
// occur, another vocabulary member's ids, positions past seq or another
// context member's), an accumulator holding -0 (to which the unfused
// kernels add +0).
TEST_CASE("the embeddings' gradients accumulate as the accumulate kernels "
          "do, bit for bit, on the CPU and the emulated GPU") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  const int64_t hidden = 37, rows = 200; // several sort and column chunks
  std::mt19937_64 rng(44);
  auto accumulators = [&](std::vector<int64_t> shape) {
    Host acc = randomHost(rng, shape, false);
    for (size_t i = 0; i < acc.values.size(); i += 5)
      acc.values[i] = -0.0f;
    return acc;
  };
  struct Variant {
    std::string op;
    std::vector<Host> ins;
    std::vector<int64_t> outShape;
    Call call;
  };
  std::vector<Variant> variants;
  // embedding_grad: the even ids 26..64 of 3 members' 3 x 30 (member 1
  // holds ids 30..59), so that the odd rows of its table get no token.
  std::uniform_int_distribution<int32_t> id(0, 19);
  Host ids{{rows}, std::vector<float>(rows), plan::I32};
  for (float &v : ids.values) {
    const int32_t i = 26 + 2 * id(rng);
    std::memcpy(&v, &i, sizeof i);
  }
  for (int64_t members : {1, 3}) {
    const int64_t vocab = members == 1 ? 3 * 30 : 30;
    Call call{{{"vocab", intAttr(vocab)}}};
    if (members > 1) {
      call.attrs.push_back({"members", intAttr(members)});
      call.tensorMember = 1;
    }
    variants.push_back({"embedding_grad", {ids}, {vocab, hidden}, call});
  }
  // position_add_grad: 5 positions for seq 4 (one past it); under context
  // parallelism, member 1 of 2 of seq 8 (positions 2, 3, 4, 5 of 9).
  variants.push_back(
      {"position_add_grad", {}, {5, hidden}, Call{{{"seq", intAttr(4)}}}});
  variants.push_back({"position_add_grad",
                      {},
                      {9, hidden},
                      Call{{{"seq", intAttr(8)}, {"cp", intAttr(2)}}, 0, 1}});
  for (bool low : {false, true}) {
    Host dy = randomHost(rng, {rows, hidden}, low);
    for (const Variant &v : variants) {
      std::vector<Host> ins = v.ins;
      ins.push_back(dy);
      const Host acc = accumulators(v.outShape);
      for (Device *d : {cpu.get(), gpu.get()}) {
        INFO(d->name() << " " << v.op << " [" << v.outShape[0]
                       << " rows] lowPrecision=" << low);
        Host grad = runOp(*d, v.op, ins, {v.outShape}, low, {}, v.call)[0];
        Host fused = runOp(*d, v.op, ins, {v.outShape}, low, {acc}, v.call)[0];
        Host unfused =
            runOp(*d, "accumulate", {grad}, {v.outShape}, false, {acc})[0];
        CHECK(sameBits(fused, unfused));
        // It added, and rows without a gradient are in both.
        CHECK(!sameBits(fused, acc));
        int64_t zeroRows = 0;
        for (int64_t r = 0; r < v.outShape[0]; ++r)
          zeroRows += std::all_of(grad.values.begin() + r * hidden,
                                  grad.values.begin() + (r + 1) * hidden,
                                  [](float g) { return g == 0.0f; });
        CHECK(zeroRows > 0);
        CHECK(zeroRows < v.outShape[0]);
      }
    }
  }
}

TEST_CASE("the GPU embedding kernels skip out-of-range ids") {
  auto gpu = createEmulatedGpuDevice(nullptr);
  Allocator &mem = gpu->allocator();
  const int64_t vocab = 3, hidden = 2;
  const std::vector<int32_t> ids = {2, -1, 3, 0, 1 << 30, 2};
  const int64_t rows = static_cast<int64_t>(ids.size());
  std::vector<float> table = {1, 2, 3, 4, 5, 6};
  std::vector<float> dy(static_cast<size_t>(rows * hidden));
  for (size_t i = 0; i < dy.size(); ++i)
    dy[i] = static_cast<float>(i + 1);
  auto upload = [&](const void *host, size_t bytes) {
    void *p = nullptr;
    REQUIRE(mem.allocate(bytes, p));
    REQUIRE(mem.copyFromHost(p, host, bytes));
    return p;
  };
  void *idsDev = upload(ids.data(), ids.size() * 4);
  void *tableDev = upload(table.data(), table.size() * 4);
  void *dyDev = upload(dy.data(), dy.size() * 4);
  void *outDev = nullptr;
  REQUIRE(mem.allocate(static_cast<size_t>(rows * hidden) * 4, outDev));
  KernelContext kctx;

  plan::Kernel fwd;
  fwd.set_op("embedding");
  REQUIRE(gpu->runKernel(*gpu->findKernel("embedding"), fwd,
                         decodeKernelAttrs(fwd),
                         {TensorRef{plan::I32, {rows}, idsDev},
                          TensorRef{plan::F32, {vocab, hidden}, tableDev}},
                         {TensorRef{plan::F32, {rows, hidden}, outDev}}, kctx));
  std::vector<float> y(static_cast<size_t>(rows * hidden));
  REQUIRE(mem.copyToHost(y.data(), outDev, y.size() * 4));
  CHECK(y == std::vector<float>{5, 6, 0, 0, 0, 0, 1, 2, 0, 0, 5, 6});

  plan::Kernel bwd;
  bwd.set_op("embedding_grad");
  (*bwd.mutable_attrs())["vocab"] = intAttr(vocab);
  REQUIRE(gpu->runKernel(
      *gpu->findKernel("embedding_grad"), bwd, decodeKernelAttrs(bwd),
      {TensorRef{plan::I32, {rows}, idsDev},
       TensorRef{plan::F32, {rows, hidden}, dyDev}},
      {TensorRef{plan::F32, {vocab, hidden}, tableDev}}, kctx));
  std::vector<float> dtable(table.size());
  REQUIRE(mem.copyToHost(dtable.data(), tableDev, dtable.size() * 4));
  // Row 0 from token 3 (dy 7, 8); row 1 from none; row 2 from tokens 0 and
  // 5 (dy 1 + 11, 2 + 12).
  CHECK(dtable == std::vector<float>{7, 8, 0, 0, 12, 14});

  mem.deallocate(idsDev, ids.size() * 4);
  mem.deallocate(tableDev, table.size() * 4);
  mem.deallocate(dyDev, dy.size() * 4);
  mem.deallocate(outDev, static_cast<size_t>(rows * hidden) * 4);
}

TEST_CASE("worst error of each layer kernel's cases") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  std::map<std::string, std::pair<int, double>> worst;
  for (const KernelCase &c : kernelCases()) {
    if (!kLayerOps.count(c.op))
      continue;
    INFO("case " << c.name);
    CaseResult r = runCase(c, *cpu, *gpu);
    CHECK(r.error == "");
    auto &w = worst[c.op];
    ++w.first;
    w.second = std::max(w.second, r.worstRelative);
  }
  CHECK(worst.size() == kLayerOps.size());
  for (const auto &[op, w] : worst)
    std::cout << op << ": " << w.first << " cases, worst |gpu - cpu| / "
              << "(atol + rtol |cpu|) = " << w.second << "\n";
}

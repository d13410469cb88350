// The layer GPU kernels beyond the shared cases (LayerCases.cpp): malformed
// calls get the CPU kernels' errors, out-of-range ids (which only the CPU
// kernels reject: the GPU wrapper never reads tensor data) are skipped
// without an out-of-bounds access, and the worst error of each layer
// kernel's cases, printed.
#include <catch2/catch.hpp>

#include <cstring>
#include <iostream>
#include <map>
#include <set>

#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"
#include "runtime/hal/gpu/test/KernelCases.h"

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

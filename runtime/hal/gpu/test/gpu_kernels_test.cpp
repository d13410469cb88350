// The GPU kernels' host emulation against the CPU kernels: every registered
// case (test/*Cases.cpp), and every GPU kernel has a case. Built with
// PIPER_GPU_LANES32 (gpu_kernels_lanes_test), the kernels run 32 lanes per
// row on host threads: there, the cases up to kLanesElements operand
// elements, and every kernel must have one. Also the gradient norm's sums
// of squares.
#include <catch2/catch.hpp>

#include <set>

#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"
#include "runtime/hal/gpu/test/KernelCases.h"

using namespace piper::runtime;
using namespace piper::runtime::hal;

namespace {

int64_t operandElements(const testing::KernelCase &c) {
  int64_t total = 0;
  for (const auto *list : {&c.inputs, &c.outputs})
    for (const testing::Operand &o : *list) {
      int64_t n = 1;
      for (int64_t d : o.shape)
        n *= d;
      total += n;
    }
  return total;
}

#ifdef PIPER_GPU_LANES32
constexpr int64_t kLanesElements = 3600;
#else
constexpr int64_t kLanesElements = INT64_MAX;
#endif

} // namespace

TEST_CASE("the emulated GPU kernels agree with the CPU kernels") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  REQUIRE(!testing::kernelCases().empty());
  std::set<std::string> ran;
  for (const testing::KernelCase &c : testing::kernelCases()) {
    if (operandElements(c) > kLanesElements)
      continue;
    INFO("case " << c.name << " (" << c.op << ")");
    testing::CaseResult r = testing::runCase(c, *cpu, *gpu);
    CHECK(r.error == "");
    ran.insert(c.op);
  }
  for (const auto &k : hal::PIPER_GPU_NS::kernels()) {
    INFO("kernel " << k.name << " ran no case");
    CHECK(ran.count(k.name) == 1);
  }
}

// gpu-review C.12: the gradient norm's sums of squares, measured into
// device slots and read at once.
TEST_CASE("the emulated GPU's sums of squares agree with the CPU's") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  CHECK(testing::compareSquareSums(*cpu, *gpu) == "");
}

TEST_CASE("the emulated GPU's clipped-step norm, clip factor and scaling "
          "agree with the CPU's") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  CHECK(testing::compareGradClip(*cpu, *gpu) == "");
}

TEST_CASE("every GPU kernel has a test case") {
  std::set<std::string> tested;
  for (const testing::KernelCase &c : testing::kernelCases())
    tested.insert(c.op);
  for (const auto &k : hal::PIPER_GPU_NS::kernels()) {
    INFO("kernel " << k.name);
    CHECK(tested.count(k.name) == 1);
  }
}

// The executor skips zeroing a value whose first kernel writes it whole
// (Kernels.h kernelReadsOutputs): every kernel not declared to read its
// outputs must give the same bits from outputs that start as zeros and as a
// NaN canary, on the CPU and on the emulated GPU, in every case; the
// declared ones must read them somewhere (the declaration is not stale).
TEST_CASE("kernels write every element of their outputs, but those declared "
          "to update them in place") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  std::set<std::string> readers;
  for (const testing::KernelCase &c : testing::kernelCases()) {
    if (!c.rejects.empty() || operandElements(c) > kLanesElements)
      continue;
    for (Device *d : {cpu.get(), gpu.get()}) {
      INFO("case " << c.name << " (" << c.op << ") on " << d->name());
      std::vector<std::vector<uint32_t>> zero, canary;
      REQUIRE(testing::runOutputsFrom(c, *d, 0u, zero) == "");
      REQUIRE(testing::runOutputsFrom(c, *d, 0x7fc00001u, canary) == "");
      if (kernelReadsOutputs(c.op)) {
        if (zero != canary)
          readers.insert(c.op);
        continue;
      }
      CHECK(zero == canary);
    }
  }
  for (const char *op : {"accumulate", "adamw"}) {
    INFO("kernel " << op);
    CHECK(kernelReadsOutputs(op));
    CHECK(readers.count(op) == 1);
  }
}

// The GPU kernels' host emulation against the CPU kernels: every registered
// case (test/*Cases.cpp), and every GPU kernel has a case.
#include <catch2/catch.hpp>

#include <set>

#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"
#include "runtime/hal/gpu/test/KernelCases.h"

using namespace piper::runtime;
using namespace piper::runtime::hal;

TEST_CASE("the emulated GPU kernels agree with the CPU kernels") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  REQUIRE(!testing::kernelCases().empty());
  for (const testing::KernelCase &c : testing::kernelCases()) {
    INFO("case " << c.name << " (" << c.op << ")");
    testing::CaseResult r = testing::runCase(c, *cpu, *gpu);
    CHECK(r.error == "");
  }
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

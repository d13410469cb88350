// The CUDA kernels against the CPU kernels (needs a GPU; tag gpu): every
// case of runtime/hal/gpu/test/*Cases.cpp, the cases the host emulation
// passes everywhere (gpu_kernels_test), and the gradient norm's sums of
// squares.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <set>

#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/cuda/CudaBackend.h"
#include "runtime/hal/gpu/test/KernelCases.h"

using namespace piper;

using namespace piper::runtime;
using namespace piper::runtime::hal;

namespace {
/// CUDA device 0; the test fails, with CUDA's message, where there is none.
std::unique_ptr<Device> cudaDevice() {
  Status st;
  auto gpu = createCudaDevice(0, nullptr, st);
  INFO(st.message());
  REQUIRE(gpu);
  return gpu;
}
} // namespace

TEST_CASE("the CUDA kernels agree with the CPU kernels") {
  auto gpu = cudaDevice();
  auto cpu = createCpuDevice(nullptr);
  REQUIRE(!testing::kernelCases().empty());
  double worst = 0;
  std::string worstCase;
  for (const testing::KernelCase &c : testing::kernelCases()) {
    INFO("case " << c.name << " (" << c.op << ")");
    testing::CaseResult r = testing::runCase(c, *cpu, *gpu);
    CHECK(r.error == "");
    if (r.error.empty() && r.worstRelative > worst) {
      worst = r.worstRelative;
      worstCase = c.name;
    }
  }
  // The closest call to a bound, for docs/gpu.md's table.
  std::printf("cuda kernels: %zu cases, worst |diff| / bound %.3f (%s)\n",
              testing::kernelCases().size(), worst, worstCase.c_str());
}

TEST_CASE("the CUDA sums of squares agree with the CPU's") {
  auto gpu = cudaDevice();
  auto cpu = createCpuDevice(nullptr);
  CHECK(testing::compareSquareSums(*cpu, *gpu) == "");
  CHECK(testing::compareSquaresBatching(*gpu) == "");
}

TEST_CASE("the CUDA clipped-step norm and clip factor agree with the CPU's") {
  auto gpu = cudaDevice();
  auto cpu = createCpuDevice(nullptr);
  CHECK(testing::compareGradClip(*cpu, *gpu) == "");
}

TEST_CASE("the CUDA fused AdamW calls give each call's own bits, and the "
          "clip factor scales each gradient as a pass before did") {
  auto gpu = cudaDevice();
  CHECK(testing::compareAdamwCalls(*gpu) == "");
}

// As gpu_kernels_test on the emulation: the GEMMs reading packed bf16
// operands where they are (or re-strided, bf16 to bf16, where their
// columns are not 16-byte aligned) give the bits of the same values as
// fp32 operands packed by the GEMM, and the kernels storing packed outputs
// (the fused classifier's dlogits, the norms', MLP activations, attention's
// y written by cuDNN, linear's y as cuBLASLt's bf16 D) store their fp32
// outputs packed; every declared packed operand is checked.
TEST_CASE("the CUDA kernels' packed bf16 operands give their fp32 values' "
          "bits") {
  auto gpu = cudaDevice();
  std::set<std::string> checked;
  CHECK(testing::comparePackedOperands(*gpu, *gpu, INT64_MAX, checked) == "");
  CHECK(checked == testing::declaredPackedOperands(*gpu));
  CHECK(checked.size() == 92); // gpu_kernels_test's declared list
}

// As gpu_kernels_test on the emulation: the executor does not zero a value
// whose first kernel writes it whole, so every CUDA kernel not declared to
// read its outputs (kernelReadsOutputs) must write every element of them.
TEST_CASE("the CUDA kernels write every element of their outputs") {
  auto gpu = cudaDevice();
  for (const testing::KernelCase &c : testing::kernelCases()) {
    if (!c.rejects.empty() || kernelReadsOutputs(testing::kernelOf(c)))
      continue;
    INFO("case " << c.name << " (" << c.op << ")");
    std::vector<std::vector<uint32_t>> zero, canary;
    REQUIRE(testing::runOutputsFrom(c, *gpu, 0u, zero) == "");
    REQUIRE(testing::runOutputsFrom(c, *gpu, 0x7fc00001u, canary) == "");
    CHECK(zero == canary);
  }
}

// The CUDA backend on any machine, any build: --backend cuda either can run
// or says clearly why not. On the development machine (toolkit, no driver)
// that is CUDA's own error from cudaGetDeviceCount, with file and line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/hal/cuda/CudaBackend.h"
#ifdef PIPER_HAVE_CUDA
#include "runtime/hal/cuda/CudaCheck.h"
#endif

using namespace piper::runtime;
using namespace piper::runtime::hal;

TEST_CASE("--backend cuda runs here or says why not", "[cuda]") {
  Status check = checkCudaBackend();
  Status created;
  std::unique_ptr<Device> device = createCudaDevice(0, nullptr, created);
  INFO("checkCudaBackend: " << check.message());
  INFO("createCudaDevice: " << created.message());
  if (!cudaBackendBuilt()) {
    CHECK_FALSE(check);
    CHECK(check.message().find("this piper-run was built without CUDA (no "
                               "toolkit at ") == 0);
    CHECK(check.message().find("see docs/gpu.md") != std::string::npos);
    CHECK_FALSE(created);
    CHECK(created.message() == check.message());
    CHECK(device == nullptr);
    return;
  }
  if (check) {
    // A GPU machine: the device exists and has every kernel of the CPU
    // registry, and no other.
    REQUIRE(device);
    CHECK(device->name() == "cuda");
    std::vector<std::string> gpu = device->kernelNames(),
                             cpu = piper::runtime::kernelNames();
    std::sort(gpu.begin(), gpu.end());
    std::sort(cpu.begin(), cpu.end());
    CHECK(gpu == cpu);
    CHECK(device->findKernel("add") != nullptr);
    CHECK(device->findKernel("no_such_kernel") == nullptr);
    return;
  }
  // Built with CUDA, no usable device: CUDA's error names the call, its
  // code, its message, and where it was made.
  WARN("no GPU here: " << check.message());
  CHECK(check.message().find("no usable CUDA device: ") == 0);
  if (check.message().find("found 0") == std::string::npos) {
    CHECK(check.message().find("cudaGetDeviceCount(&count): cudaError") !=
          std::string::npos);
    CHECK(check.message().find("(runtime/hal/cuda/CudaDevice.cpp:") !=
          std::string::npos);
  }
  CHECK_FALSE(created);
  CHECK(device == nullptr);
}

#ifdef PIPER_HAVE_CUDA
TEST_CASE("CUDA errors carry the call, CUDA's name and message, file and "
          "line",
          "[cuda]") {
  CHECK(cudaErrorMessage(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)",
                         "runtime/hal/cuda/X.cpp", 42) ==
        "cudaMalloc(&p, n): cudaErrorMemoryAllocation: out of memory "
        "(runtime/hal/cuda/X.cpp:42)");
}
#endif

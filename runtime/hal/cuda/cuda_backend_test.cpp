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

using namespace piper;

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

#ifdef PIPER_HAVE_CUDA
// gpu-review A.5: an illegal address shows at a later call (a synchronize),
// which is not the culprit: the error names the stream's last kernel. A
// synchronous error (a bad argument) is the call's own and names none.
TEST_CASE("an asynchronous kernel error names the last kernel launched",
          "[cuda]") {
  CHECK(cudaCallError(cudaErrorIllegalAddress, "cudaStreamSynchronize(s)",
                      "runtime/hal/cuda/X.cpp", 7, "attention_backward")
            .message() ==
        "cudaStreamSynchronize(s): cudaErrorIllegalAddress: an illegal memory "
        "access was encountered (runtime/hal/cuda/X.cpp:7); the last kernel "
        "launched on this stream was 'attention_backward' "
        "(CUDA_LAUNCH_BLOCKING=1 names the one that faulted)");
  CHECK(cudaCallError(cudaErrorInvalidValue, "cudaMemcpyAsync(d, s, n)",
                      "runtime/hal/cuda/X.cpp", 8, "attention_backward")
            .message() == "cudaMemcpyAsync(d, s, n): cudaErrorInvalidValue: "
                          "invalid argument (runtime/hal/cuda/X.cpp:8)");
  CHECK(cudaCallError(cudaErrorLaunchFailure, "cudaEventQuery(e)", "X.cpp",
                      9, nullptr)
            .message()
            .find("last kernel") == std::string::npos);
  // Launches are noted per thread (a stream's worker issues its work).
  CHECK(lastKernelLaunched() == nullptr);
  noteKernelLaunch("layer_norm");
  CHECK(std::string(lastKernelLaunched()) == "layer_norm");
}
#endif

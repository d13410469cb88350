// The CUDA backend's entry points in a build without the CUDA toolkit
// (@cuda//:defs.bzl CUDA_AVAILABLE = False): each says so.
#include "runtime/hal/cuda/CudaBackend.h"
#include "runtime/hal/cuda/NcclCommunicator.h"

#ifndef PIPER_CUDA_PATH
#define PIPER_CUDA_PATH "/usr/local/cuda"
#endif

namespace piper::runtime::hal {

namespace {
Status notBuilt() {
  return Status::error(
      "this piper-run was built without CUDA (no toolkit at " PIPER_CUDA_PATH
      " at build time); see docs/gpu.md");
}
} // namespace

bool cudaBackendBuilt() { return false; }

Status checkCudaBackend() { return notBuilt(); }

Status cudaDeviceCount(int &count) {
  count = 0;
  return notBuilt();
}

std::unique_ptr<Device> createCudaDevice(int, Communicator *, Status &status,
                                         const DeviceOptions &) {
  status = notBuilt();
  return nullptr;
}

std::unique_ptr<Communicator>
createNcclCommunicator(int, int, int, std::shared_ptr<gloo::rendezvous::Store>,
                       std::chrono::milliseconds, Status &status) {
  status = notBuilt();
  return nullptr;
}

std::unique_ptr<Communicator> createNcclCommunicator(int, int, int,
                                                     const std::string &,
                                                     std::chrono::milliseconds,
                                                     Status &status) {
  status = notBuilt();
  return nullptr;
}

} // namespace piper::runtime::hal

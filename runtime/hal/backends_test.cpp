// The backend factory (Backends.h): which device and communicator each
// --backend / --comm pair gets, and that they are made.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <unistd.h>

#include "runtime/hal/Backends.h"
#include "runtime/hal/StagingCommunicator.h"

using namespace piper;

using namespace piper::runtime;
using namespace piper::runtime::hal;

TEST_CASE("--backend names a device kind") {
  CHECK(parseDeviceKind("cpu") == DeviceKind::Cpu);
  CHECK(parseDeviceKind("cuda") == DeviceKind::Cuda);
  CHECK(parseDeviceKind("cuda-emulation") == DeviceKind::CudaEmulation);
  CHECK(!parseDeviceKind("tpu"));
  CHECK(!parseDeviceKind(""));
}

TEST_CASE("each backend's communicator") {
  CHECK(communicatorKind(DeviceKind::Cpu, "") == CommunicatorKind::Gloo);
  CHECK(communicatorKind(DeviceKind::Cpu, "gloo") == CommunicatorKind::Gloo);
  CHECK(communicatorKind(DeviceKind::Cuda, "") == CommunicatorKind::Nccl);
  CHECK(communicatorKind(DeviceKind::Cuda, "nccl") == CommunicatorKind::Nccl);
  CHECK(communicatorKind(DeviceKind::Cuda, "gloo") ==
        CommunicatorKind::StagedGloo);
  CHECK(communicatorKind(DeviceKind::CudaEmulation, "") ==
        CommunicatorKind::StagedGloo);
}

TEST_CASE("the CPU device is the executor's default; the emulated GPU is made "
          "on demand") {
  DeviceFactory factory;
  REQUIRE(createDevice(DeviceKind::Cpu, 0, nullptr, nullptr, factory));
  CHECK(!factory);
  REQUIRE(createDevice(DeviceKind::CudaEmulation, 0, nullptr, nullptr,
                       factory));
  REQUIRE(factory);
  std::unique_ptr<Device> device = factory(nullptr);
  REQUIRE(device);
  void *p = nullptr;
  REQUIRE(device->allocator().allocate(256, p));
  CHECK(p != nullptr);
  device->allocator().deallocate(p, 256);
  int ordinal = -1;
  REQUIRE(cudaOrdinalFor(DeviceKind::Cpu, 3, ordinal));
  CHECK(ordinal == 0);
}

TEST_CASE("a staged Gloo communicator is wrapped and handed back") {
  char dir[] = "/tmp/piper-backends-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  Rendezvous meet;
  meet.storeDir = dir;
  Status st;
  StagingCommunicator *staging = reinterpret_cast<StagingCommunicator *>(1);
  std::unique_ptr<Communicator> gloo =
      createCommunicator(CommunicatorKind::Gloo, 0, 1, 0, meet,
                         std::chrono::milliseconds(5000), st, &staging);
  REQUIRE(st);
  REQUIRE(gloo);
  CHECK(staging == nullptr);
  std::unique_ptr<Communicator> staged =
      createCommunicator(CommunicatorKind::StagedGloo, 0, 1, 0, meet,
                         std::chrono::milliseconds(5000), st, &staging);
  REQUIRE(st);
  REQUIRE(staged);
  CHECK(staging == staged.get());
  std::string rm = std::string("rm -rf ") + dir;
  CHECK(std::system(rm.c_str()) == 0);
}

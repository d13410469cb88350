// The device and communicator of each backend (Backends.h).
#include "runtime/hal/Backends.h"

#include "runtime/comm/TcpStore.h"
#include "runtime/hal/StagingCommunicator.h"
#include "runtime/hal/cuda/CudaBackend.h"
#include "runtime/hal/cuda/NcclCommunicator.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"

namespace piper::runtime::hal {

std::optional<DeviceKind> parseDeviceKind(const std::string &name) {
  if (name == "cpu")
    return DeviceKind::Cpu;
  if (name == "cuda")
    return DeviceKind::Cuda;
  if (name == "cuda-emulation")
    return DeviceKind::CudaEmulation;
  return std::nullopt;
}

std::optional<AttentionChoice> parseAttentionChoice(const std::string &name) {
  if (name == "auto")
    return AttentionChoice::Auto;
  if (name == "cudnn")
    return AttentionChoice::Cudnn;
  if (name == "simt")
    return AttentionChoice::Simt;
  return std::nullopt;
}

CommunicatorKind communicatorKind(DeviceKind device, const std::string &comm) {
  switch (device) {
  case DeviceKind::Cpu:
    return CommunicatorKind::Gloo;
  case DeviceKind::Cuda:
    return comm == "gloo" ? CommunicatorKind::StagedGloo
                          : CommunicatorKind::Nccl;
  case DeviceKind::CudaEmulation:
    return CommunicatorKind::StagedGloo;
  }
  return CommunicatorKind::Gloo;
}

std::unique_ptr<Communicator>
createCommunicator(CommunicatorKind kind, int rank, int worldSize,
                   int cudaOrdinal, const Rendezvous &meet,
                   std::chrono::milliseconds timeout, Status &status,
                   StagingCommunicator **staging) {
  *staging = nullptr;
  const bool fileStore = !meet.storeDir.empty();
  std::unique_ptr<Communicator> comm;
  if (kind == CommunicatorKind::Nccl)
    comm = fileStore ? createNcclCommunicator(rank, worldSize, cudaOrdinal,
                                              meet.storeDir, timeout, status)
                     : createNcclCommunicator(rank, worldSize, cudaOrdinal,
                                              meet.store, timeout, status);
  else
    comm = fileStore
               ? createGlooCommunicator(rank, worldSize, meet.storeDir, timeout,
                                        status)
               : createGlooCommunicator(rank, worldSize, meet.store, timeout,
                                        status, meet.bindAddress);
  if (!comm || !status) {
    if (status)
      status = Status::error("unknown error");
    return nullptr;
  }
  if (kind != CommunicatorKind::StagedGloo)
    return comm;
  auto wrapped = std::make_unique<StagingCommunicator>(std::move(comm));
  *staging = wrapped.get();
  return wrapped;
}

Status createDevice(DeviceKind kind, int cudaOrdinal, Communicator *comm,
                    StagingCommunicator *staging, DeviceFactory &out,
                    const DeviceOptions &options) {
  out = nullptr;
  switch (kind) {
  case DeviceKind::Cpu:
    return Status::ok();
  case DeviceKind::Cuda: {
    Status created;
    auto device = std::make_shared<std::unique_ptr<Device>>(
        createCudaDevice(cudaOrdinal, comm, created, options));
    if (!*device)
      return Status::error("backend 'cuda': " + created.message());
    if (staging)
      staging->attach((*device)->allocator());
    // Created here, where an error can be reported; handed over once.
    out = [device](Communicator *) { return std::move(*device); };
    return Status::ok();
  }
  case DeviceKind::CudaEmulation:
    out = [staging, options](Communicator *c) {
      auto device = createEmulatedGpuDevice(
          c, options, staging ? &staging->hostCommunicator() : nullptr);
      if (staging)
        staging->attach(device->allocator());
      return device;
    };
    return Status::ok();
  }
  return Status::error("unknown device kind");
}

Status cudaOrdinalFor(DeviceKind kind, int localRank, int &ordinal) {
  ordinal = 0;
  if (kind != DeviceKind::Cuda)
    return Status::ok();
  // CUDA_VISIBLE_DEVICES chooses which GPUs a node's ranks see
  // (docs/gpu.md).
  int gpus = 0;
  PIPER_RETURN_IF_ERROR(cudaDeviceCount(gpus).withContext("backend 'cuda'"));
  ordinal = gpus > 0 ? localRank % gpus : 0;
  return Status::ok();
}

} // namespace piper::runtime::hal

// The choice of a rank's device and communicator, in one place: which
// backend runs the kernels (--backend) and how the ranks of that backend
// talk (--comm). The launcher names the kinds; this creates them, so the
// rank's code never branches on a backend.
#ifndef PIPER_RUNTIME_HAL_BACKENDS_H
#define PIPER_RUNTIME_HAL_BACKENDS_H

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "runtime/comm/Communicator.h"
#include "runtime/hal/Hal.h"
#include "support/Status.h"

namespace gloo::rendezvous {
class Store;
} // namespace gloo::rendezvous

namespace piper::runtime::hal {

class StagingCommunicator;

/// What runs a rank's kernels (--backend).
enum class DeviceKind {
  Cpu,           ///< "cpu": the host, OpenBLAS and threads
  Cuda,          ///< "cuda": one NVIDIA GPU per rank
  CudaEmulation, ///< "cuda-emulation": the CUDA kernels run on the host
};

/// The kind --backend `name` names, or none.
std::optional<DeviceKind> parseDeviceKind(const std::string &name);

/// The choice --attention `name` ("auto", "cudnn", "simt") names, or none.
std::optional<AttentionChoice> parseAttentionChoice(const std::string &name);

/// How the ranks of a backend communicate.
enum class CommunicatorKind {
  Gloo,       ///< Gloo over host memory (the CPU)
  Nccl,       ///< NCCL between GPUs
  StagedGloo, ///< Gloo staged through host memory (several ranks per GPU)
};

/// The communicator of `device` with --comm `comm` ("" or "auto": the
/// backend's own; "gloo"): NCCL on CUDA unless --comm gloo; Gloo staged
/// through host memory with --comm gloo on CUDA and on the emulated GPU;
/// Gloo on the CPU.
CommunicatorKind communicatorKind(DeviceKind device, const std::string &comm);

/// Where the ranks meet: a file store in `storeDir` (piper-run's own
/// spawner), else `store` (a TCP store); Gloo's pairs bind `bindAddress`.
struct Rendezvous {
  std::string storeDir;
  std::shared_ptr<gloo::rendezvous::Store> store;
  std::string bindAddress = "127.0.0.1";
};

/// The communicator of `kind` for `rank` of `worldSize` (NCCL on CUDA
/// device `cudaOrdinal`). Operations wait at most `timeout`. For
/// StagedGloo, `*staging` is set to the StagingCommunicator returned, which
/// the rank's device must be attached to (createDevice does). Null with
/// `status` set on error.
std::unique_ptr<Communicator>
createCommunicator(CommunicatorKind kind, int rank, int worldSize,
                   int cudaOrdinal, const Rendezvous &meet,
                   std::chrono::milliseconds timeout, Status &status,
                   StagingCommunicator **staging);

/// Makes a rank's device from its communicator (ExecutorOptions::
/// createDevice); empty for the CPU, whose device is the executor's
/// default.
using DeviceFactory =
    std::function<std::unique_ptr<Device>(Communicator *comm)>;

/// The device factory of `kind` (on CUDA device `cudaOrdinal`, with `comm`
/// and, when the communicator is staged, `staging`). A CUDA device is
/// created now, so that its error is this call's; the emulated one when the
/// executor asks.
Status createDevice(DeviceKind kind, int cudaOrdinal, Communicator *comm,
                    StagingCommunicator *staging, DeviceFactory &out,
                    const DeviceOptions &options = {});

/// The CUDA device a rank with local rank `localRank` uses on `kind`: local
/// rank r uses visible device r modulo their number (so ranks may share
/// one); 0 off CUDA. An error when CUDA cannot be used.
Status cudaOrdinalFor(DeviceKind kind, int localRank, int &ordinal);

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_BACKENDS_H

// The NCCL communicator: the Communicator of ranks whose tensors live on
// CUDA devices, one GPU per rank. NCCL is loaded at run time
// (NcclLibrary.h); this header includes no CUDA or NCCL header.
//
// Every operation is issued on the CUDA stream bound to its logical stream
// (the key's or isend/irecv's stream name): the CUDA device binds each HAL
// stream it creates by name (Communicator::bindDeviceStream), so the stream
// is passed explicitly, never found through the calling thread. An unbound
// stream's operations (the executor's checkpoint gathers) run on a stream
// of the communicator. Nothing blocks the host at issue. Its work records a
// CUDA event after the operation; wait() makes the bound stream wait for
// that event, or, for an unbound stream (and for operations on host
// memory), waits on the host until it completes, at most the
// communicator's timeout, and then aborts the communicator.
//
// One NCCL communicator per key, created once in connect() in sorted key
// order: the lowest rank of the key creates the ncclUniqueId and publishes
// it through the rendezvous store. A pair key (two ranks: point-to-point and
// two-rank collectives) has two NCCL communicators, one per direction, and a
// CUDA stream for this rank's sends, so that a send never waits behind a
// receive on the same stream (NCCL sends complete only when the peer
// receives; the executor issues sends and receives in any interleaving, as
// Gloo allows). NCCL matches the sends and receives of one direction in
// issue order: the tag is not used. A one-rank key gets its communicator on
// first use, without the store. Sending to this rank is an error, as with
// Gloo.
//
// Buffers are device memory (the device's allocator); host pointers (the
// executor's all-to-all row counts, allReduceSumWorld) are recognised
// (cudaPointerGetAttributes) and staged through temporary device memory;
// the data are copied back by wait(), which then waits on the host.
//
// Sums: fp32, f64 and i32 as NCCL computes them (the same bits on every
// member); bf16 sums are NCCL's, rounded to bf16 after each addition (with
// more than two members this differs from Gloo's fp32 accumulation by a few
// bf16 ulps). Unequal per-member counts use grouped ncclReduce (reduce-
// scatter) or ncclBroadcast (all-gather), one per member; all-to-all is
// grouped ncclSend/ncclRecv (this rank's own slice is a device copy).
#ifndef PIPER_RUNTIME_HAL_CUDA_NCCLCOMMUNICATOR_H
#define PIPER_RUNTIME_HAL_CUDA_NCCLCOMMUNICATOR_H

#include <chrono>
#include <memory>
#include <string>

#include "runtime/comm/Communicator.h"
#include "support/Status.h"

namespace gloo::rendezvous {
class Store;
} // namespace gloo::rendezvous

namespace piper::runtime::hal {

/// An NCCL communicator for `rank` of `worldSize` on CUDA device
/// `cudaDevice` (the ordinal the rank's CudaDevice uses), meeting the other
/// ranks through `store` (a TcpStore, a gloo FileStore: the store the Gloo
/// communicator would use; its keys start with "nccl:"). `timeout` bounds
/// the wait for a key's unique id in connect() and every host-side wait.
/// Loads NCCL (a clear error when it cannot) and checks the device exists;
/// talks to no other rank until connect(). Null with `status` set on error.
std::unique_ptr<Communicator>
createNcclCommunicator(int rank, int worldSize, int cudaDevice,
                       std::shared_ptr<gloo::rendezvous::Store> store,
                       std::chrono::milliseconds timeout, Status &status);

/// As above, meeting through a gloo FileStore in the existing directory
/// `storeDir` (piper-run's own spawner, as createGlooCommunicator).
std::unique_ptr<Communicator>
createNcclCommunicator(int rank, int worldSize, int cudaDevice,
                       const std::string &storeDir,
                       std::chrono::milliseconds timeout, Status &status);

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_NCCLCOMMUNICATOR_H

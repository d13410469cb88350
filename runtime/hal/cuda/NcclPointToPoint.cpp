// The NCCL communicator's point-to-point operations (NcclInternal.h): a
// pair's sends run on its send stream after the caller's data are ready, on
// the communicator of this rank's direction; receives run on the caller's
// stream, on the other direction's.
#include <fmt/format.h>

#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/cuda/NcclInternal.h"

namespace piper::runtime::hal::nccl {

CommWorkPtr NcclCommunicator::isend(const std::string &stream, const void *data,
                                    size_t bytes, int peer, uint32_t) {
  std::string op = fmt::format("send to rank {} on stream '{}'", peer, stream);
  Group *g = nullptr;
  IssueStream issue;
  if (CommWorkPtr error = preparePair(stream, peer, op, g, issue))
    return error;
  int peerPosition = 1 - g->position;
  return launch(
      *g, op, issue,
      [&](Staging &staging) -> Status {
        PIPER_RETURN_IF_ERROR(staging.in(data, bytes));
        // The send runs on the pair's send stream once its data are ready
        // on the caller's stream; the staging memory is freed there.
        PIPER_CUDA_RETURN_IF_ERROR(cudaEventRecord(g->ready, issue.stream));
        PIPER_CUDA_RETURN_IF_ERROR(
            cudaStreamWaitEvent(g->sendStream, g->ready, 0));
        staging.stream = g->sendStream;
        return PIPER_NCCL_CHECK(lib.ncclSend(data, bytes, ncclInt8,
                                             peerPosition, g->sendComm(),
                                             g->sendStream));
      },
      g->sendStream, g->sendTail);
}

CommWorkPtr NcclCommunicator::irecv(const std::string &stream, void *data,
                                    size_t bytes, int peer, uint32_t) {
  std::string op =
      fmt::format("recv from rank {} on stream '{}'", peer, stream);
  Group *g = nullptr;
  IssueStream issue;
  if (CommWorkPtr error = preparePair(stream, peer, op, g, issue))
    return error;
  int peerPosition = 1 - g->position;
  return launch(*g, op, issue, [&](Staging &staging) -> Status {
    PIPER_RETURN_IF_ERROR(staging.out(data, bytes));
    return PIPER_NCCL_CHECK(lib.ncclRecv(data, bytes, ncclInt8, peerPosition,
                                         g->recvComm(), issue.stream));
  });
}

} // namespace piper::runtime::hal::nccl

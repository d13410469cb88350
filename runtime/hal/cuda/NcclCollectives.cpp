// The NCCL communicator's collectives (NcclInternal.h): all-reduce,
// reduce-scatter and all-gather (equal slices in one NCCL call, unequal ones
// as one rooted reduce or broadcast per member), all-to-all as grouped
// sends and receives, and the world sum on the control communicator.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/cuda/NcclInternal.h"

namespace piper::runtime::hal::nccl {

namespace {

std::string describe(const char *what, const CommKey &key) {
  return fmt::format("{} over ranks {} on stream '{}'", what,
                     rankList(key.ranks), key.stream);
}

bool allEqual(const std::vector<size_t> &counts) {
  return std::adjacent_find(counts.begin(), counts.end(),
                            std::not_equal_to<size_t>()) == counts.end();
}

size_t total(const std::vector<size_t> &counts) {
  return std::accumulate(counts.begin(), counts.end(), size_t{0});
}

} // namespace

CommWorkPtr NcclCommunicator::allReduce(const CommKey &key, void *data,
                                        size_t count, CommDType type) {
  std::string op = describe("all-reduce", key);
  Group *g = nullptr;
  IssueStream issue;
  if (CommWorkPtr error = prepareCollective(key, op, nullptr, g, issue))
    return error;
  size_t bytes = count * commDTypeSize(type);
  return launch(*g, op, issue, [&](Staging &staging) -> Status {
    PIPER_RETURN_IF_ERROR(staging.inOut(data, bytes));
    return PIPER_NCCL_CHECK(lib.ncclAllReduce(data, data, count, ncclType(type),
                                              ncclSum, g->comm, issue.stream));
  });
}

CommWorkPtr NcclCommunicator::reduceScatter(const CommKey &key,
                                            const void *input, void *output,
                                            const std::vector<size_t> &counts,
                                            CommDType type) {
  return sliced(/*scatter=*/true, key, input, output, counts, type);
}

CommWorkPtr NcclCommunicator::allGather(const CommKey &key, const void *input,
                                        void *output,
                                        const std::vector<size_t> &counts,
                                        CommDType type) {
  return sliced(/*scatter=*/false, key, input, output, counts, type);
}

CommWorkPtr NcclCommunicator::sliced(bool scatter, const CommKey &key,
                                     const void *input, void *output,
                                     const std::vector<size_t> &counts,
                                     CommDType type) {
  std::string op = describe(scatter ? "reduce-scatter" : "all-gather", key);
  Group *g = nullptr;
  IssueStream issue;
  if (CommWorkPtr error = prepareCollective(key, op, &counts, g, issue))
    return error;
  const size_t elem = commDTypeSize(type);
  const size_t mine = counts[g->position], all = total(counts);
  const ncclDataType_t t = ncclType(type);
  return launch(*g, op, issue, [&](Staging &staging) -> Status {
    PIPER_RETURN_IF_ERROR(staging.in(input, (scatter ? all : mine) * elem));
    PIPER_RETURN_IF_ERROR(staging.out(output, (scatter ? mine : all) * elem));
    if (allEqual(counts))
      return scatter
                 ? PIPER_NCCL_CHECK(lib.ncclReduceScatter(
                       input, output, mine, t, ncclSum, g->comm, issue.stream))
                 : PIPER_NCCL_CHECK(lib.ncclAllGather(input, output, mine, t,
                                                      g->comm, issue.stream));
    // Unequal slices: one operation per member, rooted at it: the reduce
    // of its slice of the input (recvbuff is only written on the root), or
    // the broadcast of its slice of the output.
    return perMember(counts, [&](int i, size_t offset) -> Status {
      const bool root = i == g->position;
      if (scatter) {
        const char *slice = static_cast<const char *>(input) + offset * elem;
        void *recv = root ? output : const_cast<char *>(slice);
        return PIPER_NCCL_CHECK(lib.ncclReduce(
            slice, recv, counts[i], t, ncclSum, i, g->comm, issue.stream));
      }
      char *slice = static_cast<char *>(output) + offset * elem;
      return PIPER_NCCL_CHECK(lib.ncclBroadcast(
          root ? input : slice, slice, counts[i], t, i, g->comm, issue.stream));
    });
  });
}

CommWorkPtr NcclCommunicator::allToAll(const CommKey &key, const void *input,
                                       const std::vector<size_t> &sendCounts,
                                       void *output,
                                       const std::vector<size_t> &recvCounts,
                                       CommDType type) {
  std::string op = describe("all-to-all", key);
  Group *g = nullptr;
  IssueStream issue;
  if (CommWorkPtr error = prepareCollective(key, op, &sendCounts, g, issue))
    return error;
  if (recvCounts.size() != sendCounts.size())
    return completedWork(
        opError(op, fmt::format("{} receive counts for {} members",
                                recvCounts.size(), sendCounts.size())));
  const size_t elem = commDTypeSize(type);
  const int me = g->position;
  return launch(*g, op, issue, [&](Staging &staging) -> Status {
    PIPER_RETURN_IF_ERROR(staging.in(input, total(sendCounts) * elem));
    PIPER_RETURN_IF_ERROR(staging.out(output, total(recvCounts) * elem));
    std::vector<size_t> sendOffset(sendCounts.size()),
        recvOffset(recvCounts.size());
    for (size_t i = 1; i < sendCounts.size(); ++i) {
      sendOffset[i] = sendOffset[i - 1] + sendCounts[i - 1];
      recvOffset[i] = recvOffset[i - 1] + recvCounts[i - 1];
    }
    if (sendCounts[me] != recvCounts[me])
      return Status::error(
          fmt::format("this rank sends itself {} elements but expects {}",
                      sendCounts[me], recvCounts[me]));
    if (sendCounts[me] > 0)
      PIPER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          static_cast<char *>(output) + recvOffset[me] * elem,
          static_cast<const char *>(input) + sendOffset[me] * elem,
          sendCounts[me] * elem, cudaMemcpyDeviceToDevice, issue.stream));
    if (g->size() == 1)
      return Status::ok();
    return grouped([&]() -> Status {
      for (int i = 0; i < g->size(); ++i) {
        if (i == me)
          continue;
        if (sendCounts[i] > 0)
          PIPER_RETURN_IF_ERROR(PIPER_NCCL_CHECK(lib.ncclSend(
              static_cast<const char *>(input) + sendOffset[i] * elem,
              sendCounts[i], ncclType(type), i, g->comm, issue.stream)));
        if (recvCounts[i] > 0)
          PIPER_RETURN_IF_ERROR(PIPER_NCCL_CHECK(lib.ncclRecv(
              static_cast<char *>(output) + recvOffset[i] * elem, recvCounts[i],
              ncclType(type), i, g->comm, issue.stream)));
      }
      return Status::ok();
    });
  });
}

Status NcclCommunicator::allReduceSumWorld(double *data, size_t count) {
  if (size == 1 || count == 0)
    return Status::ok();
  std::lock_guard<std::mutex> serial(worldMutex);
  std::string op = "sum over all ranks";
  if (!world.comm && world.failure.empty())
    return opError(op, "the communicator is not connected");
  PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  // The communicator's own stream, waited for on the host.
  IssueStream issue{worldStream, false};
  CommWorkPtr work = launch(world, op, issue, [&](Staging &staging) -> Status {
    void *buffer = data;
    PIPER_RETURN_IF_ERROR(staging.inOut(buffer, count * sizeof(double)));
    return PIPER_NCCL_CHECK(lib.ncclAllReduce(
        buffer, buffer, count, ncclFloat64, ncclSum, world.comm, worldStream));
  });
  return work->wait();
}

Status NcclCommunicator::allReduceSumWorldOn(const std::string &stream,
                                             double *data, size_t count) {
  if (size == 1 || count == 0)
    return Status::ok();
  std::lock_guard<std::mutex> serial(worldMutex);
  std::string op = "sum over all ranks on stream '" + stream + "'";
  if (!world.comm && world.failure.empty())
    return opError(op, "the communicator is not connected");
  // Queued on the stream's device stream: its later work (the clip factor,
  // the update) runs after the sum, and the host does not wait.
  IssueStream issue;
  PIPER_RETURN_IF_ERROR(issueStream(stream, issue));
  CommWorkPtr work = launch(world, op, issue, [&](Staging &staging) -> Status {
    void *buffer = data;
    PIPER_RETURN_IF_ERROR(staging.inOut(buffer, count * sizeof(double)));
    return PIPER_NCCL_CHECK(lib.ncclAllReduce(
        buffer, buffer, count, ncclFloat64, ncclSum, world.comm, issue.stream));
  });
  return work->wait();
}

} // namespace piper::runtime::hal::nccl

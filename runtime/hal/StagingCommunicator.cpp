// The staging communicator: see StagingCommunicator.h.
#include "runtime/hal/StagingCommunicator.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace piper::runtime::hal {

namespace {

/// Host copies of one operation's buffers.
struct Buffers {
  std::vector<char> input;
  std::vector<char> output;
};

/// The host operation's work; wait() copies the result back to the device
/// buffer (when there is one to copy back, and only on success).
class StagedWork final : public CommWork {
public:
  StagedWork(Allocator &memory, std::unique_ptr<Buffers> buffers,
             CommWorkPtr inner, void *deviceOutput, size_t outputBytes)
      : memory(memory), buffers(std::move(buffers)), inner(std::move(inner)),
        deviceOutput(deviceOutput), outputBytes(outputBytes) {}
  ~StagedWork() override {
    // The host operation may still use the buffers until its work goes.
    inner.reset();
  }
  Status wait() override {
    if (waited)
      return status;
    waited = true;
    status = inner->wait();
    if (status.isOk() && deviceOutput && outputBytes > 0)
      status =
          memory.copyFromHost(deviceOutput, buffers->output.data(), outputBytes)
              .withContext("copying the result to the device");
    return status;
  }

private:
  Allocator &memory;
  std::unique_ptr<Buffers> buffers; // destroyed after `inner`
  CommWorkPtr inner;
  void *deviceOutput;
  size_t outputBytes;
  bool waited = false;
  Status status;
};

size_t sum(const std::vector<size_t> &counts) {
  return std::accumulate(counts.begin(), counts.end(), size_t{0});
}

} // namespace

StagingCommunicator::StagingCommunicator(std::unique_ptr<Communicator> host)
    : host(std::move(host)) {}

void StagingCommunicator::attach(Allocator &deviceMemory,
                                 IsDeviceMemory isDeviceMemory) {
  memory = &deviceMemory;
  isDevice = std::move(isDeviceMemory);
}

CommWorkPtr StagingCommunicator::notAttached(const std::string &op) const {
  if (memory)
    return nullptr;
  return completedWork(Status::error(
      "rank " + std::to_string(host->rank()) + ": " + op +
      " failed: the staging communicator has no device memory attached"));
}

bool StagingCommunicator::onDevice(const void *ptr) const {
  return ptr && (!isDevice || isDevice(ptr));
}

CommWorkPtr StagingCommunicator::stageInput(const std::string &op,
                                            const void *data, size_t bytes,
                                            std::vector<char> &staged,
                                            const void *&in) const {
  in = data;
  if (!onDevice(data) || bytes == 0)
    return nullptr;
  staged.resize(bytes);
  Status copied = memory->copyToHost(staged.data(), data, bytes);
  if (!copied)
    return completedWork(Status::error(
        "rank " + std::to_string(host->rank()) + ": " + op +
        " failed: copying the input to the host: " + copied.message()));
  in = staged.data();
  return nullptr;
}

namespace {

/// This rank's position in `key` (its ranks sorted), or -1.
int positionOf(const CommKey &key, int rank) {
  std::vector<int> ranks = key.ranks;
  std::sort(ranks.begin(), ranks.end());
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end() || *it != rank)
    return -1;
  return static_cast<int>(it - ranks.begin());
}

} // namespace

// Each operation: `in` is the host view of the input (staged when on the
// device), `out` the host buffer the host operation writes, copied back to
// `deviceOut` by wait() (null: nothing to copy back).
#define PIPER_STAGING_PROLOGUE(name)                                           \
  const std::string op = name;                                                 \
  if (CommWorkPtr error = notAttached(op))                                     \
    return error;                                                              \
  auto buffers = std::make_unique<Buffers>();

CommWorkPtr StagingCommunicator::isend(const std::string &stream,
                                       const void *data, size_t bytes, int peer,
                                       uint32_t tag) {
  PIPER_STAGING_PROLOGUE("send on stream '" + stream + "'")
  const void *in = nullptr;
  if (CommWorkPtr error = stageInput(op, data, bytes, buffers->input, in))
    return error;
  CommWorkPtr inner = host->isend(stream, in, bytes, peer, tag);
  return std::make_shared<StagedWork>(*memory, std::move(buffers),
                                      std::move(inner), nullptr, 0);
}

CommWorkPtr StagingCommunicator::irecv(const std::string &stream, void *data,
                                       size_t bytes, int peer, uint32_t tag) {
  PIPER_STAGING_PROLOGUE("receive on stream '" + stream + "'")
  if (!onDevice(data) || bytes == 0)
    return host->irecv(stream, data, bytes, peer, tag);
  buffers->output.resize(bytes);
  CommWorkPtr inner =
      host->irecv(stream, buffers->output.data(), bytes, peer, tag);
  return std::make_shared<StagedWork>(*memory, std::move(buffers),
                                      std::move(inner), data, bytes);
}

Status StagingCommunicator::allReduceSumWorldOn(const std::string &stream,
                                                double *data, size_t count) {
  const std::string op = "sum over all ranks on stream '" + stream + "'";
  if (count == 0 || !onDevice(data))
    return host->allReduceSumWorld(data, count);
  if (CommWorkPtr error = notAttached(op))
    return error->wait();
  std::vector<double> staged(count);
  size_t bytes = count * sizeof(double);
  PIPER_RETURN_IF_ERROR(memory->copyToHost(staged.data(), data, bytes)
                            .withContext(op + ": staging"));
  PIPER_RETURN_IF_ERROR(host->allReduceSumWorld(staged.data(), count));
  return memory->copyFromHost(data, staged.data(), bytes)
      .withContext(op + ": unstaging");
}

CommWorkPtr StagingCommunicator::allReduce(const CommKey &key, void *data,
                                           size_t count, CommDType type) {
  PIPER_STAGING_PROLOGUE("all-reduce over '" + key.str() + "'")
  size_t bytes = count * commDTypeSize(type);
  if (!onDevice(data) || bytes == 0)
    return host->allReduce(key, data, count, type);
  const void *staged = nullptr;
  if (CommWorkPtr error = stageInput(op, data, bytes, buffers->output, staged))
    return error;
  CommWorkPtr inner = host->allReduce(key, buffers->output.data(), count, type);
  return std::make_shared<StagedWork>(*memory, std::move(buffers),
                                      std::move(inner), data, bytes);
}

CommWorkPtr StagingCommunicator::reduceScatter(
    const CommKey &key, const void *input, void *output,
    const std::vector<size_t> &counts, CommDType type) {
  PIPER_STAGING_PROLOGUE("reduce-scatter over '" + key.str() + "'")
  size_t elem = commDTypeSize(type);
  int position = positionOf(key, rank());
  size_t inBytes = sum(counts) * elem;
  size_t outBytes =
      position >= 0 && static_cast<size_t>(position) < counts.size()
          ? counts[position] * elem
          : 0;
  const void *in = nullptr;
  if (CommWorkPtr error = stageInput(op, input, inBytes, buffers->input, in))
    return error;
  void *out = output;
  void *deviceOut = nullptr;
  if (onDevice(output) && outBytes > 0) {
    buffers->output.resize(outBytes);
    out = buffers->output.data();
    deviceOut = output;
  }
  CommWorkPtr inner = host->reduceScatter(key, in, out, counts, type);
  return std::make_shared<StagedWork>(*memory, std::move(buffers),
                                      std::move(inner), deviceOut, outBytes);
}

CommWorkPtr StagingCommunicator::allGather(const CommKey &key,
                                           const void *input, void *output,
                                           const std::vector<size_t> &counts,
                                           CommDType type) {
  PIPER_STAGING_PROLOGUE("all-gather over '" + key.str() + "'")
  size_t elem = commDTypeSize(type);
  int position = positionOf(key, rank());
  size_t inBytes =
      position >= 0 && static_cast<size_t>(position) < counts.size()
          ? counts[position] * elem
          : 0;
  size_t outBytes = sum(counts) * elem;
  const void *in = nullptr;
  if (CommWorkPtr error = stageInput(op, input, inBytes, buffers->input, in))
    return error;
  void *out = output;
  void *deviceOut = nullptr;
  if (onDevice(output) && outBytes > 0) {
    buffers->output.resize(outBytes);
    out = buffers->output.data();
    deviceOut = output;
  }
  CommWorkPtr inner = host->allGather(key, in, out, counts, type);
  return std::make_shared<StagedWork>(*memory, std::move(buffers),
                                      std::move(inner), deviceOut, outBytes);
}

CommWorkPtr StagingCommunicator::allToAll(const CommKey &key, const void *input,
                                          const std::vector<size_t> &sendCounts,
                                          void *output,
                                          const std::vector<size_t> &recvCounts,
                                          CommDType type) {
  PIPER_STAGING_PROLOGUE("all-to-all over '" + key.str() + "'")
  size_t elem = commDTypeSize(type);
  size_t inBytes = sum(sendCounts) * elem;
  size_t outBytes = sum(recvCounts) * elem;
  const void *in = nullptr;
  if (CommWorkPtr error = stageInput(op, input, inBytes, buffers->input, in))
    return error;
  void *out = output;
  void *deviceOut = nullptr;
  if (onDevice(output) && outBytes > 0) {
    buffers->output.resize(outBytes);
    out = buffers->output.data();
    deviceOut = output;
  }
  CommWorkPtr inner =
      host->allToAll(key, in, sendCounts, out, recvCounts, type);
  return std::make_shared<StagedWork>(*memory, std::move(buffers),
                                      std::move(inner), deviceOut, outBytes);
}

#undef PIPER_STAGING_PROLOGUE

} // namespace piper::runtime::hal

// The emulated GPU's stream-ordered communicator (EmulatedCommunicator.h).
#include "runtime/hal/gpu/host/EmulatedCommunicator.h"

#include <memory>
#include <utility>

#include "runtime/hal/gpu/host/HostCapture.h"

namespace piper::runtime::hal {

namespace {

namespace gpu = PIPER_GPU_NS;

/// A recorded operation's work between its start and its completion, in
/// the recording that runs both.
struct Pending {
  CommWorkPtr work;
};

/// What the executor holds of a recorded operation: waiting for it records
/// its completion on the same stream (an edge on the device, as NCCL's
/// work waits with cudaStreamWaitEvent); the host waits for nothing.
class RecordedWork final : public CommWork {
public:
  RecordedWork(gpu::HostRecording &recording, std::shared_ptr<Pending> pending,
               std::string op, std::function<void(const Status &)> failed)
      : recording(recording), pending(std::move(pending)), op(std::move(op)),
        failed(std::move(failed)) {}

  Status wait() override {
    if (waited)
      return status;
    waited = true;
    if (gpu::currentRecording != &recording) {
      status = Status::error("internal error: " + op +
                             " was captured with a step, and its completion "
                             "is waited for outside that stream's capture");
      return status;
    }
    recording.work.emplace_back([pending = pending, failed = failed,
                                 &recording = recording] {
      Status done = pending->work ? pending->work->wait()
                                  : Status::error("internal error: a captured "
                                                  "operation was not started");
      pending->work.reset();
      if (!done) {
        failed(done);
        if (recording.fail)
          recording.fail(done);
      }
    });
    return status;
  }

private:
  gpu::HostRecording &recording;
  std::shared_ptr<Pending> pending;
  std::string op;
  std::function<void(const Status &)> failed;
  bool waited = false;
  Status status;
};

std::string onStream(const std::string &stream) {
  return " on stream '" + stream + "'";
}

} // namespace

Status EmulatedCommunicator::failure() const {
  std::lock_guard<std::mutex> lock(mu);
  return first;
}

void EmulatedCommunicator::failed(const Status &status) {
  std::lock_guard<std::mutex> lock(mu);
  if (first.isOk())
    first = status;
}

CommWorkPtr EmulatedCommunicator::record(std::string op,
                                         std::function<CommWorkPtr()> start) {
  gpu::HostRecording &recording = *gpu::currentRecording;
  auto pending = std::make_shared<Pending>();
  recording.work.emplace_back([this, pending, op, start = std::move(start)] {
    Status earlier = failure();
    pending->work =
        earlier.isOk()
            ? start()
            : completedWork(Status::error(
                  "rank " + std::to_string(rank()) + ": " + op +
                  " was not run: an earlier operation of the captured step "
                  "failed: " +
                  earlier.message()));
  });
  return std::make_shared<RecordedWork>(
      recording, std::move(pending), std::move(op),
      [this](const Status &status) { failed(status); });
}

CommWorkPtr EmulatedCommunicator::isend(const std::string &stream,
                                        const void *data, size_t bytes,
                                        int peer, uint32_t tag) {
  if (!gpu::currentRecording)
    return issued.isend(stream, data, bytes, peer, tag);
  return record("send to rank " + std::to_string(peer) + onStream(stream),
                [=] { return direct.isend(stream, data, bytes, peer, tag); });
}

CommWorkPtr EmulatedCommunicator::irecv(const std::string &stream, void *data,
                                        size_t bytes, int peer, uint32_t tag) {
  if (!gpu::currentRecording)
    return issued.irecv(stream, data, bytes, peer, tag);
  return record("receive from rank " + std::to_string(peer) + onStream(stream),
                [=] { return direct.irecv(stream, data, bytes, peer, tag); });
}

CommWorkPtr EmulatedCommunicator::allReduce(const CommKey &key, void *data,
                                            size_t count, CommDType type) {
  if (!gpu::currentRecording)
    return issued.allReduce(key, data, count, type);
  return record("all-reduce over " + key.str(),
                [=] { return direct.allReduce(key, data, count, type); });
}

CommWorkPtr EmulatedCommunicator::reduceScatter(
    const CommKey &key, const void *input, void *output,
    const std::vector<size_t> &counts, CommDType type) {
  if (!gpu::currentRecording)
    return issued.reduceScatter(key, input, output, counts, type);
  return record("reduce-scatter over " + key.str(), [=] {
    return direct.reduceScatter(key, input, output, counts, type);
  });
}

CommWorkPtr EmulatedCommunicator::allGather(const CommKey &key,
                                            const void *input, void *output,
                                            const std::vector<size_t> &counts,
                                            CommDType type) {
  if (!gpu::currentRecording)
    return issued.allGather(key, input, output, counts, type);
  return record("all-gather over " + key.str(), [=] {
    return direct.allGather(key, input, output, counts, type);
  });
}

CommWorkPtr EmulatedCommunicator::allToAll(
    const CommKey &key, const void *input,
    const std::vector<size_t> &sendCounts, void *output,
    const std::vector<size_t> &recvCounts, CommDType type) {
  if (!gpu::currentRecording)
    return issued.allToAll(key, input, sendCounts, output, recvCounts, type);
  // The counts are the capture's: a captured step's all-to-alls exchange
  // fixed blocks, their row counts beside them in device memory
  // (runtime/exec/Collectives.cpp, allToAllBlocks).
  return record("all-to-all over " + key.str(), [=] {
    return direct.allToAll(key, input, sendCounts, output, recvCounts, type);
  });
}

Status EmulatedCommunicator::allReduceSumWorldOn(const std::string &stream,
                                                 double *data, size_t count) {
  if (!gpu::currentRecording)
    return issued.allReduceSumWorldOn(stream, data, count);
  const std::string op = "sum over all ranks" + onStream(stream);
  return record(op,
                [=] {
                  return completedWork(direct.allReduceSumWorld(data, count));
                })
      ->wait();
}

} // namespace piper::runtime::hal

// A host communicator (Gloo) for tensors in device memory: each operation
// copies its device input to host staging buffers, runs the host
// operation, and its work's wait() copies the result back into device
// memory. This lets several ranks share one GPU with `--comm gloo` (NCCL
// needs one GPU per rank). CUDA-free: it moves data through the device's
// hal::Allocator (copyToHost / copyFromHost, which on CUDA synchronize the
// calling stream), so it works with any device.
#ifndef PIPER_RUNTIME_HAL_STAGINGCOMMUNICATOR_H
#define PIPER_RUNTIME_HAL_STAGINGCOMMUNICATOR_H

#include <functional>
#include <memory>

#include "runtime/comm/Communicator.h"
#include "runtime/hal/Hal.h"

namespace piper::runtime::hal {

class StagingCommunicator final : public Communicator {
public:
  /// Says whether a buffer handed to an operation is device memory (to be
  /// staged) or already host memory (passed to the host communicator as it
  /// is: the executor's all-to-all row counts).
  using IsDeviceMemory = std::function<bool(const void *)>;

  /// Wraps `host`, which must not be null. Operations fail until attach().
  explicit StagingCommunicator(std::unique_ptr<Communicator> host);

  /// The device's memory, through which data are staged (the device is
  /// created after its communicator, so this comes later). Without
  /// `isDeviceMemory` every buffer is taken to be device memory. Call once,
  /// before the first operation; `deviceMemory` must outlive the
  /// operations' works.
  void attach(Allocator &deviceMemory, IsDeviceMemory isDeviceMemory = {});

  /// The wrapped communicator.
  Communicator &hostCommunicator() { return *host; }

  int rank() const override { return host->rank(); }
  int worldSize() const override { return host->worldSize(); }
  Status connect(std::vector<CommKey> keys) override {
    return host->connect(std::move(keys));
  }
  CommWorkPtr isend(const std::string &stream, const void *data, size_t bytes,
                    int peer, uint32_t tag) override;
  CommWorkPtr irecv(const std::string &stream, void *data, size_t bytes,
                    int peer, uint32_t tag) override;
  CommWorkPtr allReduce(const CommKey &key, void *data, size_t count,
                        CommDType type) override;
  CommWorkPtr reduceScatter(const CommKey &key, const void *input, void *output,
                            const std::vector<size_t> &counts,
                            CommDType type) override;
  CommWorkPtr allGather(const CommKey &key, const void *input, void *output,
                        const std::vector<size_t> &counts,
                        CommDType type) override;
  CommWorkPtr allToAll(const CommKey &key, const void *input,
                       const std::vector<size_t> &sendCounts, void *output,
                       const std::vector<size_t> &recvCounts,
                       CommDType type) override;
  std::string stepCaptureRefusal() const override {
    return "--comm gloo stages every operation through the host";
  }
  /// Host data already: passed through.
  Status allReduceSumWorld(double *data, size_t count) override {
    return host->allReduceSumWorld(data, count);
  }
  /// Device data: copied to the host, summed there, copied back.
  Status allReduceSumWorldOn(const std::string &stream, double *data,
                             size_t count) override;

private:
  /// An error work when no device memory is attached, else null.
  CommWorkPtr notAttached(const std::string &op) const;
  bool onDevice(const void *ptr) const;
  /// Points `in` at `data`, or, for device memory, copies its `bytes` into
  /// `staged` and points `in` there; an error work of `op` when that copy
  /// fails, else null.
  CommWorkPtr stageInput(const std::string &op, const void *data, size_t bytes,
                         std::vector<char> &staged, const void *&in) const;

  std::unique_ptr<Communicator> host;
  Allocator *memory = nullptr;
  IsDeviceMemory isDevice;
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_STAGINGCOMMUNICATOR_H

// The emulated GPU's model of a communicator whose operations are ordered
// on the device streams, as NCCL's are (docs/runtime.md "Steps as graphs"):
// an operation issued while a stream's worker captures a step is recorded
// as that stream's device work, at its place among the kernels, and runs
// (on the host communicator, over the emulated device's memory, which is
// the host's) each time the capture is launched; its completion is
// recorded too, where the executor waits for it. So a step of several
// ranks is captured and replayed on the emulation as on CUDA with NCCL,
// and an operation the capture missed, ran out of order or waited for on
// the host shows as other numbers, a hang or an error. Outside a capture
// every operation goes to the communicator the device was given, as it
// is.
#ifndef PIPER_RUNTIME_HAL_GPU_HOST_EMULATEDCOMMUNICATOR_H
#define PIPER_RUNTIME_HAL_GPU_HOST_EMULATEDCOMMUNICATOR_H

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/Communicator.h"

namespace piper::runtime::hal {

class EmulatedCommunicator final : public Communicator {
public:
  /// `issued` takes the operations issued outside a capture (on the
  /// cuda-emulation backend the staging communicator); `direct` is the same
  /// ranks' communicator on host memory (the one `issued` wraps, or
  /// `issued` itself), which recorded operations call when they run. Both
  /// must outlive this.
  EmulatedCommunicator(Communicator &issued, Communicator &direct)
      : issued(issued), direct(direct) {}

  int rank() const override { return issued.rank(); }
  int worldSize() const override { return issued.worldSize(); }
  Status connect(std::vector<CommKey> keys) override {
    return issued.connect(std::move(keys));
  }
  void bindDeviceStream(const std::string &stream,
                        void *deviceStream) override {
    issued.bindDeviceStream(stream, deviceStream);
  }
  void unbindDeviceStream(const std::string &stream,
                          void *deviceStream) override {
    issued.unbindDeviceStream(stream, deviceStream);
  }
  std::string stepCaptureRefusal() const override { return ""; }

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
  /// Host data, after the step: never captured.
  Status allReduceSumWorld(double *data, size_t count) override {
    return issued.allReduceSumWorld(data, count);
  }
  /// Device data: while capturing, recorded (summed by `direct` in place
  /// when it runs); otherwise as `issued` does it.
  Status allReduceSumWorldOn(const std::string &stream, double *data,
                             size_t count) override;

  /// The first error of a recorded operation, or ok. After it the later
  /// recorded operations fail at once, naming it (as NCCL's communicator
  /// is unusable after an error), so a failed rank's peers do not wait
  /// out one timeout per operation.
  Status failure() const;

private:
  /// Records `start` (which issues the operation on `direct`) as the
  /// calling stream's device work and returns the work whose wait()
  /// records the operation's completion.
  CommWorkPtr record(std::string op, std::function<CommWorkPtr()> start);
  /// Keeps the first failure; later ones are about it.
  void failed(const Status &status);

  Communicator &issued;
  Communicator &direct;
  mutable std::mutex mu;
  Status first;
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_GPU_HOST_EMULATEDCOMMUNICATOR_H

// A step captured on CUDA: see CudaStepGraph.h.
#include "runtime/hal/cuda/CudaStepGraph.h"

#include <utility>

#include "runtime/hal/cuda/CudaCheck.h"

namespace piper::runtime::hal {

/// The capture instantiated: launched for each later step of its parity.
class CudaStepGraph final : public StepGraph {
public:
  CudaStepGraph(std::unique_ptr<CudaStepCapture> capture, cudaGraphExec_t exec)
      : capture(std::move(capture)), exec(exec) {}
  ~CudaStepGraph() override { cudaGraphExecDestroy(exec); }
  Status launch(const StepValues &values) override {
    PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(capture->ordinal));
    // The streams are idle: no copy of the last launch reads the tables.
    for (const std::vector<gpu::ConstantRefill> &lane : capture->refills)
      for (const gpu::ConstantRefill &refill : lane)
        refill(values.step, values.lrScale);
    PIPER_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, capture->origin));
    return Status::ok();
  }

private:
  std::unique_ptr<CudaStepCapture> capture; // its refills and events
  cudaGraphExec_t exec;
};

CudaStepCapture::~CudaStepCapture() {
  for (cudaEvent_t event : events)
    if (event)
      cudaEventDestroy(event);
}

Status CudaStepCapture::begin(int ordinal, uint64_t id,
                              std::vector<CudaCaptureStream> streams,
                              std::unique_ptr<CudaStepCapture> &out) {
  out = nullptr;
  if (streams.empty())
    return Status::error("beginning a step capture: no stream to capture");
  std::unique_ptr<CudaStepCapture> cap(new CudaStepCapture());
  cap->ordinal = ordinal;
  cap->streams = std::move(streams);
  cap->origin = cap->streams[0].handle;
  cap->refills.resize(cap->streams.size());
  cap->events.assign(cap->streams.size(), nullptr);
  PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  for (cudaEvent_t &event : cap->events)
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  // Relaxed: each stream's worker thread issues its own work into the
  // capture, and may allocate (a constant table, a scratch block).
  PIPER_CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(cap->origin, cudaStreamCaptureModeRelaxed));
  Status forked = [&]() -> Status {
    PIPER_CUDA_RETURN_IF_ERROR(cudaEventRecord(cap->events[0], cap->origin));
    for (size_t i = 1; i < cap->streams.size(); ++i)
      PIPER_CUDA_RETURN_IF_ERROR(
          cudaStreamWaitEvent(cap->streams[i].handle, cap->events[0], 0));
    return Status::ok();
  }();
  if (!forked) {
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(cap->origin, &graph);
    if (graph)
      cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return forked;
  }
  for (size_t i = 0; i < cap->streams.size(); ++i)
    cap->streams[i].setCapture(id, &cap->refills[i]);
  out = std::move(cap);
  return Status::ok();
}

Status CudaStepCapture::end(std::unique_ptr<CudaStepCapture> cap,
                            std::unique_ptr<StepGraph> &graph) {
  graph = nullptr;
  for (CudaCaptureStream &stream : cap->streams)
    stream.setCapture(0, nullptr);
  Status joined = [&]() -> Status {
    PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(cap->ordinal));
    for (size_t i = 1; i < cap->streams.size(); ++i) {
      PIPER_CUDA_RETURN_IF_ERROR(
          cudaEventRecord(cap->events[i], cap->streams[i].handle));
      PIPER_CUDA_RETURN_IF_ERROR(
          cudaStreamWaitEvent(cap->origin, cap->events[i], 0));
    }
    return Status::ok();
  }();
  // Always ended, so that the streams run their work again.
  cudaGraph_t captured = nullptr;
  cudaError_t ended = cudaStreamEndCapture(cap->origin, &captured);
  if (ended != cudaSuccess || !joined) {
    (void)cudaGetLastError();
    if (captured)
      cudaGraphDestroy(captured);
    if (!joined)
      return joined;
    return Status::error(
        cudaErrorMessage(ended, "cudaStreamEndCapture(stream, &graph)",
                         __FILE__, __LINE__) +
        ": a call of the step could not be captured");
  }
  cudaGraphExec_t exec = nullptr;
  cudaError_t made = cudaGraphInstantiate(&exec, captured, 0);
  cudaGraphDestroy(captured);
  if (made != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::error(cudaErrorMessage(
        made, "cudaGraphInstantiate(&exec, graph, 0)", __FILE__, __LINE__));
  }
  graph = std::make_unique<CudaStepGraph>(std::move(cap), exec);
  return Status::ok();
}

} // namespace piper::runtime::hal

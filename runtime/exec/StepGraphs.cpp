// Steps as graphs (ExecutorOptions::stepGraphs, docs/runtime.md "Steps as
// graphs"): after one step run as usual, the next step of each parity is
// captured while the host issues it (hal::Device::beginStepCapture), and
// later steps launch the capture of their parity instead of issuing their
// instructions. The parity picks the half of the batch staging the step's
// LOAD_BATCH copies read (prefetchBatches). What a captured step's host
// code decided must hold for every later step: it does from the second
// step on (the bf16 copies are written by the update, gradients cleared
// before the step, the loss accumulators zeroed before it), and AdamW's
// per-step constants are rewritten by the graph's launch. What would
// change the host's decisions (loading state: invalidateCopies) drops the
// captures.
#include "runtime/exec/ExecutorImpl.h"
#include "runtime/exec/Validate.h"

namespace piper::runtime {

std::string ExecutorImpl::stepGraphRefusal() const {
  std::string device = this->device->stepCaptureRefusal();
  if (!device.empty())
    return device;
  if (plan.world_size() > 1) {
    // The step's operations between ranks are captured with its kernels
    // where the communicator queues them on the device streams (NCCL).
    const std::string ranks =
        "the plan has " + std::to_string(plan.world_size()) + " ranks and ";
    std::string why =
        comm ? comm->stepCaptureRefusal() : "no communicator connects them";
    if (!why.empty())
      return ranks + "the communicator cannot be captured: " + why;
    // The all-to-alls move fixed blocks (Collectives.cpp, allToAllBlocks).
  }
  if (options.profile)
    return "--profile times each instruction as the host issues it";
  if (options.traceStep >= 0)
    return "--trace times each instruction as the host issues it";
  if (options.faultStep >= 0)
    return "a fault is injected into the step's host code";
  return "";
}

void ExecutorImpl::dropStepGraphs() {
  stepGraphs[0].reset();
  stepGraphs[1].reset();
  graphsWarm = false;
}

bool ExecutorImpl::replayStep(hal::StepGraph &graph, StepState &st) {
  const int half = static_cast<int>(st.step & 1);
  // As LOAD_BATCH: the batches' fills must have succeeded.
  for (size_t k = 0; k < batchLoads.size(); ++k) {
    const BatchLoad &load = batchLoads[k];
    Status filled =
        batchStep[half] == st.step
            ? batchFilled[half][k]
            : Status::error("internal error: the batches of step " +
                            std::to_string(st.step) + " were not loaded");
    if (!filled) {
      markFailed(load.stream);
      fail(st, filled.withContext(
                   who + ", " +
                   instructionContext(plan, load.stream, load.instruction)));
      return false;
    }
  }
  hal::StepValues values;
  values.step = st.step;
  values.lrScale = scheduleScale(plan.training(), st.step);
  Status launched = graph.launch(values);
  if (!launched) {
    markFailed(0);
    fail(st, launched.withContext(who + ": launching the capture of step " +
                                  std::to_string(st.step) +
                                  " (piper-run --step-graph off runs steps "
                                  "as usual)"));
    return false;
  }
  st.launched = true;
  return true;
}

void ExecutorImpl::issueStep(StepState &st) {
  const bool graphs = graphRefusal.empty() && plan.streams_size() > 0;
  std::unique_ptr<hal::StepGraph> &graph = stepGraphs[st.step & 1];
  if (!graphs || !graphsWarm) {
    issueStreams(st);
    graphsWarm = graphs;
  } else if (graph) {
    if (replayStep(*graph, st))
      ++replayed;
  } else {
    captureStep(st, graph);
  }
  // The next step's batches, into the other half of the staging, while the
  // streams run (a data error is kept for the LOAD_BATCH that needs it).
  prefetchBatches(st.step + 1);
}

void ExecutorImpl::issueStreams(StepState &st) {
  for (int s = 0; s < plan.streams_size(); ++s)
    streams[s]->enqueue([this, s, &st] { runStream(s, st); });
}

void ExecutorImpl::captureStep(StepState &st,
                               std::unique_ptr<hal::StepGraph> &graph) {
  std::vector<hal::Stream *> capturing;
  for (const std::unique_ptr<hal::Stream> &stream : streams)
    capturing.push_back(stream.get());
  auto failCapture = [&](const Status &status) {
    markFailed(0);
    fail(st, status.withContext(who + ": capturing step " +
                                std::to_string(st.step) +
                                " (piper-run --step-graph off runs steps as "
                                "usual)"));
  };
  Status begun = device->beginStepCapture(capturing);
  if (!begun) {
    failCapture(begun);
    return;
  }
  // The host issues the step as usual while its device work is kept; its
  // part only is waited for: nothing captured has run.
  issueStreams(st);
  for (hal::Stream *stream : capturing)
    (void)stream->synchronize();
  std::unique_ptr<hal::StepGraph> made;
  Status ended = device->endStepCapture(made);
  if (st.failed.load())
    return; // the stream's own error says what failed
  if (!ended) {
    failCapture(ended);
    return;
  }
  graph = std::move(made);
  ++captured;
  (void)replayStep(*graph, st);
}

const std::string &Executor::stepGraphRefusal() const {
  return impl->graphRefusal;
}

int64_t Executor::capturedSteps() const { return impl->captured; }
int64_t Executor::replayedSteps() const { return impl->replayed; }

} // namespace piper::runtime

// One training step: every plan stream runs its instructions on its
// persistent HAL stream, failures stop the others, and the step's loss and
// gradient norm are summed over ranks.
#include <algorithm>
#include <exception>

#include "runtime/exec/ExecutorImpl.h"
#include "runtime/exec/Validate.h"

namespace piper::runtime {

void ExecutorImpl::fail(StepState &st, const Status &status) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(st.errorMu);
    if (!st.failed.load()) {
      st.error = status;
      st.failed.store(true);
      first = true;
    }
  }
  if (!first)
    return;
  // Waiters check the flag under their event's own lock: wake them all.
  for (const std::unique_ptr<hal::Event> &event : events)
    event->wake();
  if (options.onStreamError)
    options.onStreamError(status);
}

void ExecutorImpl::runStream(int s, StepState &st) {
  const plan::Stream &stream = plan.streams(s);
  std::vector<PendingSend> pendingSends;
  auto abandonSends = [&] {
    std::lock_guard<std::mutex> lock(abandonedMu);
    for (PendingSend &send : pendingSends)
      abandoned.push_back(std::move(send.tensor));
    pendingSends.clear();
  };
  std::atomic<int> &at = streamAt.load(std::memory_order_relaxed)[s];
  std::atomic<int> &entered =
      streamAt.load(std::memory_order_relaxed)[plan.streams_size() + s];
  const bool faults = options.faultStep == st.step && options.faultStream == s;
  // --trace: this step's spans of this stream, else null (no clock read).
  StepTrace::Span *spans = tracer.traces(st.step) ? tracer.spans(s) : nullptr;
  int i = 0;
  try {
    for (; i < stream.instructions_size(); ++i) {
      if (st.failed.load(std::memory_order_relaxed))
        break;
      at.store(i, std::memory_order_relaxed);
      const bool fault =
          faults && i == options.faultInstruction && options.onFault;
      if (fault && !options.faultInside)
        options.onFault();
      entered.store(i, std::memory_order_relaxed);
      if (fault && options.faultInside)
        options.onFault();
      if (spans)
        spans[i].startNs = steadyNowNs();
      Status status = execute(s, i, st, pendingSends);
      if (spans)
        spans[i].endNs = steadyNowNs();
      if (!status) {
        markFailed(s);
        fail(st,
             status.withContext(who + ", " + instructionContext(plan, s, i)));
        abandonSends();
        return;
      }
    }
    if (i < stream.instructions_size()) {
      abandonSends();
      return;
    }
    at.store(i, std::memory_order_relaxed);
    if (!pendingSends.empty()) {
      Clock::time_point start;
      if (options.profile)
        start = Clock::now();
      // Waits for every send, even after a failure, so that no buffer is
      // still in use afterwards; reports the first error.
      Status status;
      for (PendingSend &send : pendingSends) {
        Status sent = send.work->wait();
        if (status.isOk() && !sent.isOk())
          status = sent.withContext(send.what);
      }
      if (options.profile)
        profiler.add(s, Profiler::kWaitSends, nanosSince(start));
      if (!status) {
        markFailed(s);
        fail(st, status.withContext(who + ", stream '" + stream.name() +
                                    "', end of step: waiting for sends"));
        abandonSends();
        return;
      }
    }
    if (spans)
      tracer.endStream(s);
  } catch (const std::exception &e) {
    markFailed(s);
    fail(st, Status::error(who + ", " + instructionContext(plan, s, i) +
                           ": internal error: " + e.what()));
    abandonSends();
  }
}

Status ExecutorImpl::runStep(int64_t step, double &loss) {
  if (broken)
    return Status::error(who + ": the executor cannot run after a failed step");
  // Events signal the step number (a timeline), so a step at or below one
  // already run would find its waits satisfied before their signals.
  if (step < 1 || step <= lastStep)
    return Status::error(
        who + ": cannot run step " + std::to_string(step) +
        (lastStep ? " after step " + std::to_string(lastStep) : "") +
        ": steps are numbered from 1 and must increase");
  lastStep = step;
  int numStreams = plan.streams_size();
  Status cleared = clearGradients();
  if (!cleared) {
    broken = true;
    return cleared.withContext(who + ": before step " + std::to_string(step));
  }
  // The streams are idle: their loss accumulators start the step at zero.
  Status reset = lossSums->reset();
  if (!reset) {
    broken = true;
    return reset.withContext(who +
                             ": zeroing the loss accumulators before step " +
                             std::to_string(step));
  }
  ranStep = true;

  StepState st;
  st.step = step;
  st.buffers = std::make_unique<BufferSlot[]>(plan.buffers_size());
  for (int b = 0; b < plan.buffers_size(); ++b)
    st.buffers[b].readersLeft.store(readerCount[b], std::memory_order_relaxed);

  if (!streamAtStore) {
    streamAtStore = std::make_unique<std::atomic<int>[]>(
        static_cast<size_t>(std::max(1, 2 * numStreams)));
    for (int s = 0; s < 2 * numStreams; ++s)
      streamAtStore[s].store(-1, std::memory_order_relaxed);
    streamAt.store(streamAtStore.get(), std::memory_order_release);
  }
  for (int s = 0; s < 2 * numStreams; ++s)
    streamAtStore[s].store(-1, std::memory_order_relaxed);
  posStep.store(step, std::memory_order_relaxed);
  posPhase.store(ExecPosition::kStreams, std::memory_order_relaxed);

  // This step's batches, unless the previous step prefetched them.
  prefetchBatches(step);
  const bool traced = tracer.traces(step);
  if (traced)
    tracer.beginStep();
  // The streams issue the step's work (or launch its capture), and the
  // next step's batches are prefetched meanwhile.
  issueStep(st);
  for (int s = 0; s < numStreams; ++s) {
    // An asynchronous device error (a kernel that faulted after its launch
    // returned) surfaces here at the latest: the stream's failure.
    Status synced = streams[s]->synchronize();
    if (!synced) {
      markFailed(s);
      fail(st,
           synced.withContext(
               who + ", stream '" + plan.streams(s).name() + "', end of step" +
               (st.launched ? " (launched from its capture: the kernel "
                              "named last was issued when it was "
                              "captured; piper-run --step-graph off "
                              "names the one issued last)"
                            : "")));
    }
  }
  if (st.failed.load()) {
    broken = true;
    return st.error;
  }
  if (traced)
    tracer.endStep(step);
  if (options.profile) {
    // The streams are synchronized: every timed launch has finished.
    Status timed = device->collectLaunchTimes();
    if (!timed) {
      broken = true;
      return timed.withContext(who + ": reading the launch times of step " +
                               std::to_string(step));
    }
  }
  posPhase.store(ExecPosition::kLossAllReduce, std::memory_order_relaxed);

  // The streams are synchronized: one read of every stream's loss.
  // (Each stream adds to its own, so kernels never share an adder.)
  std::vector<double> losses(static_cast<size_t>(std::max(1, numStreams)));
  Status lossRead = lossSums->read(losses.data());
  if (!lossRead) {
    broken = true;
    return lossRead.withContext(who + ": reading the loss of step " +
                                std::to_string(step));
  }
  loss = 0;
  for (double l : losses)
    loss += l;
  // A captured step's all-to-alls leave their faults on the device.
  StatusOr<std::string> faults = blockExchangeFaults(step);
  if (!faults) {
    broken = true;
    return faults.status().withContext(who + ": end of step " +
                                       std::to_string(step));
  }
  // One world reduction per step: the loss, when the plan does not clip
  // the squared gradient norm, and how many ranks' all-to-alls failed (so
  // that every rank stops).
  double sums[3] = {loss, 0, faults->empty() ? 0.0 : 1.0};
  Status measured = localGradSquares(sums[1]);
  if (!measured) {
    broken = true;
    return measured.withContext(who + ": end of step " + std::to_string(step));
  }
  if (comm) {
    Clock::time_point start;
    if (options.profile)
      start = Clock::now();
    Status status = comm->allReduceSumWorld(sums, 3);
    // The streams are idle: stream 0's rows are free to use.
    if (options.profile)
      profiler.add(0, Profiler::kLossAllReduce, nanosSince(start));
    if (!status) {
      broken = true;
      return status.withContext(who + ": summing the step loss over ranks");
    }
  }
  if (!faults->empty()) {
    broken = true;
    return Status::error(*faults);
  }
  if (sums[2] > 0) {
    broken = true;
    return Status::error(who + ", end of step " + std::to_string(step) +
                         ": another rank's all-to-all failed (its own error "
                         "says why)");
  }
  loss = sums[0];
  finishGradNorm(sums[1]);
  if (clips) {
    // CLIP_GRADS left the world's norm on the device: one read, after the
    // streams' end-of-step synchronization.
    Status read = squares->readNorm(lastGradNorm);
    if (!read) {
      broken = true;
      return read.withContext(who + ": reading the gradient norm of step " +
                              std::to_string(step));
    }
  }
  // Divergence stops the run whatever the clipping, here, after the step
  // and before anything is written from it (a checkpoint, --save); a plan
  // that clips has skipped its update (the clip factor is NaN).
  // Every rank sees the same world sums, so every rank stops.
  Status finite = checkDivergence(step, loss);
  if (!finite) {
    broken = true;
    return finite.withContext(who + ", end of step " + std::to_string(step));
  }
  posPhase.store(ExecPosition::kIdle, std::memory_order_relaxed);
  return Status::ok();
}

void ExecutorImpl::markFailed(int s) {
  int none = -1;
  failedStream.compare_exchange_strong(none, s);
}

ExecPosition ExecutorImpl::position() const {
  ExecPosition p;
  p.step = posStep.load(std::memory_order_relaxed);
  p.phase = posPhase.load(std::memory_order_relaxed);
  p.failedStream = failedStream.load(std::memory_order_relaxed);
  p.filling = posFilling.load(std::memory_order_relaxed);
  std::atomic<int> *at = streamAt.load(std::memory_order_acquire);
  p.instruction.assign(static_cast<size_t>(plan.streams_size()), -1);
  p.entered.assign(static_cast<size_t>(plan.streams_size()), -1);
  if (at)
    for (int s = 0; s < plan.streams_size(); ++s) {
      p.instruction[s] = at[s].load(std::memory_order_relaxed);
      p.entered[s] =
          at[plan.streams_size() + s].load(std::memory_order_relaxed);
    }
  return p;
}

ExecPosition Executor::position() const { return impl->position(); }

} // namespace piper::runtime

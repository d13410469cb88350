// Executing one instruction of a stream, and the step's buffer table:
// CALL (see Segments.cpp), SEND, RECV, the gradient ALL_REDUCE and
// CLIP_GRADS (see Gradients.cpp), value collectives (Collectives.cpp),
// RECORD/WAIT on HAL events, LOAD_BATCH.
#include <algorithm>

#include "proto/PlanShards.h"
#include "proto/PlanTensors.h"
#include "runtime/exec/ExecutorImpl.h"

namespace piper::runtime {

using plan::Instruction;

Status ExecutorImpl::fetchStored(StepState &st, int id, TensorPtr &out) {
  BufferSlot &slot = st.buffers[id];
  if (!slot.written.load(std::memory_order_acquire))
    return Status::error(describeBuffer(id) +
                         " is read before it is written in this step");
  out = slot.tensor;
  if (!out)
    return Status::error("internal: " + describeBuffer(id) +
                         " was freed before its last reader");
  return Status::ok();
}

bool ExecutorImpl::packed(int id) const {
  return plan::packedBf16(plan.buffers(id).type(), bf16);
}

Status ExecutorImpl::publish(StepState &st, int id) {
  // The buffer's bytes are already at its offset in the arena.
  BufferSlot &slot = st.buffers[id];
  // A buffer nobody reads dies at once.
  if (slot.readersLeft.load(std::memory_order_relaxed) > 0)
    slot.tensor = bufferViews[id];
  slot.written.store(true, std::memory_order_release);
  return Status::ok();
}

void ExecutorImpl::release(StepState &st, const std::vector<int> &ids) {
  for (int id : ids) {
    BufferSlot &slot = st.buffers[id];
    // Every other reader has taken its reference before its decrement.
    if (slot.readersLeft.fetch_sub(1, std::memory_order_acq_rel) == 1)
      slot.tensor.reset();
  }
}

Status ExecutorImpl::execute(int s, int i, StepState &st,
                             std::vector<PendingSend> &pendingSends) {
  const plan::Stream &stream = plan.streams(s);
  const Instruction &inst = stream.instructions(i);
  const bool profiling = options.profile;
  Clock::time_point start;
  if (profiling)
    start = Clock::now();
  int64_t accounted = 0; // CALL: time in kernels and allocations
  switch (inst.kind()) {
  case Instruction::CALL:
    PIPER_RETURN_IF_ERROR(call(s, inst, st, accounted));
    break;
  case Instruction::SEND: {
    TensorPtr t;
    PIPER_RETURN_IF_ERROR(fetchStored(st, inst.inputs(0), t));
    int peer = peerOf(inst);
    CommWorkPtr work =
        comm->isend(stream.name(), t->data, static_cast<size_t>(t->bytes), peer,
                    static_cast<uint32_t>(inst.tag()));
    pendingSends.push_back(
        PendingSend{std::move(t), std::move(work),
                    "send of " + describeBuffer(inst.inputs(0)) + " to rank " +
                        std::to_string(peer) + " (tag " +
                        std::to_string(inst.tag()) + ")"});
    break;
  }
  case Instruction::RECV: {
    int id = inst.outputs(0);
    const TensorPtr &t = bufferViews[id];
    int peer = peerOf(inst);
    PIPER_RETURN_IF_ERROR(
        comm->irecv(stream.name(), t->data, static_cast<size_t>(t->bytes), peer,
                    static_cast<uint32_t>(inst.tag()))
            ->wait()
            .withContext("receive of " + describeBuffer(id) + " from rank " +
                         std::to_string(peer) + " (tag " +
                         std::to_string(inst.tag()) + ")"));
    PIPER_RETURN_IF_ERROR(publish(st, id));
    break;
  }
  case Instruction::ALL_REDUCE:
    if (inst.params_size() > 0)
      PIPER_RETURN_IF_ERROR(allReduce(s, inst));
    else
      PIPER_RETURN_IF_ERROR(collective(s, inst, st));
    break;
  case Instruction::REDUCE_SCATTER:
  case Instruction::ALL_GATHER:
    PIPER_RETURN_IF_ERROR(collective(s, inst, st));
    break;
  case Instruction::ALL_TO_ALL:
    PIPER_RETURN_IF_ERROR(allToAll(s, i, st));
    break;
  case Instruction::REDUCE_SCATTER_GRADS:
    PIPER_RETURN_IF_ERROR(reduceScatterGrads(s, inst, st));
    break;
  case Instruction::ALL_GATHER_PARAMS:
    PIPER_RETURN_IF_ERROR(allGatherParams(s, inst, st));
    break;
  case Instruction::CLIP_GRADS:
    PIPER_RETURN_IF_ERROR(clipGrads(s));
    break;
  case Instruction::RECORD:
    // Events are timelines valued by step: no reset between steps.
    PIPER_RETURN_IF_ERROR(
        events[inst.event()]
            ->signal(static_cast<uint64_t>(st.step))
            .withContext("signalling event " + std::to_string(inst.event())));
    break;
  case Instruction::WAIT: {
    Status waited =
        events[inst.event()]->wait(static_cast<uint64_t>(st.step), st.failed);
    if (!waited && st.failed.load())
      return Status::error("stopped while waiting for event " +
                           std::to_string(inst.event()) +
                           ": another stream failed");
    PIPER_RETURN_IF_ERROR(waited.withContext("waiting for event " +
                                             std::to_string(inst.event())));
    break;
  }
  case Instruction::LOAD_BATCH: {
    const TensorPtr &tokens = bufferViews[inst.outputs(0)],
                    &targets = bufferViews[inst.outputs(1)];
    // Filled in host memory before the step (prefetchBatches), then copied
    // to the device without the host waiting.
    const int half = static_cast<int>(st.step & 1);
    if (batchStep[half] != st.step)
      return Status::error("internal error: the batches of step " +
                           std::to_string(st.step) + " were not loaded");
    const size_t k = static_cast<size_t>(batchLoadOf[s][i]);
    PIPER_RETURN_IF_ERROR(batchFilled[half][k]);
    const char *slot = batchSlot(half, batchLoads[k]);
    PIPER_RETURN_IF_ERROR(
        memory
            ->copyFromHostAsync(tokens->data, slot,
                                static_cast<size_t>(tokens->bytes))
            .withContext("copying the tokens to the device"));
    PIPER_RETURN_IF_ERROR(
        memory
            ->copyFromHostAsync(targets->data, slot + tokens->bytes,
                                static_cast<size_t>(targets->bytes))
            .withContext("copying the targets to the device"));
    PIPER_RETURN_IF_ERROR(publish(st, inst.outputs(0)));
    PIPER_RETURN_IF_ERROR(publish(st, inst.outputs(1)));
    break;
  }
  default:
    return Status::error("unsupported instruction kind " +
                         std::to_string(inst.kind()));
  }
  release(st, distinctInputs[s][i]);
  if (profiling) {
    int64_t ns = nanosSince(start);
    if (inst.kind() == Instruction::CALL)
      profiler.add(s, Profiler::kCallOther,
                   std::max<int64_t>(0, ns - accounted));
    else
      profiler.add(s, profiler.kindRow(inst.kind()), ns);
  }
  return Status::ok();
}

} // namespace piper::runtime

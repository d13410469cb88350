// Gradient accumulators between kernels: the data-parallel all-reduce,
// global-norm clipping, the gradient norm of plans that do not clip, and
// clearing the accumulators no plan kernel clears.
#include <algorithm>
#include <cmath>

#include "runtime/exec/ExecutorImpl.h"

#include <fmt/format.h>

namespace piper::runtime {

using plan::Instruction;
using plan::Operand;

void ExecutorImpl::analyzeGradients() {
  int numParams = plan.params_size();
  updated.assign(numParams, 0);
  zeroedByPlan.assign(numParams, 0);
  gradSquares.assign(numParams, 0.0);
  std::vector<char> called(plan.segments_size(), 0);
  for (const plan::Stream &stream : plan.streams())
    for (const Instruction &inst : stream.instructions()) {
      if (inst.kind() == Instruction::CALL)
        called[inst.segment()] = 1;
      clips |= inst.kind() == Instruction::CLIP_GRADS;
    }
  for (int g = 0; g < plan.segments_size(); ++g) {
    if (!called[g])
      continue;
    for (const plan::Kernel &kernel : plan.segments(g).kernels()) {
      if (kernel.op() == "adamw" && kernel.inputs_size() > 0 &&
          kernel.inputs(0).kind() == Operand::GRAD)
        updated[kernel.inputs(0).index()] = 1;
      if (kernel.op() == "zero")
        for (const Operand &op : kernel.outputs())
          if (op.kind() == Operand::GRAD)
            zeroedByPlan[op.index()] = 1;
    }
  }
}

Status ExecutorImpl::clearGradients() {
  // Gradients are this step's alone, as after optimizer.zero_grad(): plans
  // clear the accumulators they update; the others (--no-optimizer) are
  // cleared here, so that an all-reduce never re-sums an earlier step.
  if (!ranStep)
    return Status::ok();
  for (int p = 0; p < plan.params_size(); ++p)
    if (!zeroedByPlan[p]) {
      const TensorPtr &g = stateOf(p, Operand::GRAD);
      PIPER_RETURN_IF_ERROR(
          memory->zero(g->data, static_cast<size_t>(g->bytes))
              .withContext("clearing the gradient of parameter '" +
                           plan.params(p).name() + "'"));
    }
  return Status::ok();
}

float *ExecutorImpl::gradOf(int p) const {
  return zeroSharded(p) ? rangeOf(p, Operand::GRAD)
                        : static_cast<float *>(stateOf(p, Operand::GRAD)->data);
}

int64_t ExecutorImpl::gradElements(int p) const {
  return zeroSharded(p) ? shard[p].count : stateOf(p, Operand::GRAD)->bytes / 4;
}

hal::SquaresSpan ExecutorImpl::gradSpan(int p) const {
  return {gradOf(p), gradElements(p), p};
}

double ExecutorImpl::shareWeight(int p) const {
  // The world sum of squares is divided by num_replicas, as every replica
  // holds the same reduced gradient. A ZeRO rank holds only its range of
  // it, which the members together cover once. A parameter held by several
  // classes (tied) holds the same summed gradient in each: count it once.
  // An expert parameter's block is held by num_replicas / expert_members
  // replicas only. Under tensor parallelism num_replicas counts data
  // replicas: the members of a group hold disjoint slices of a sliced
  // parameter (together once per data replica), and each holds a whole
  // copy of the others.
  const plan::Parameter &param = plan.params(p);
  double weight = 1.0 / std::max(1, param.copies());
  if (zeroSharded(p))
    weight *= std::max(1, plan.training().num_replicas());
  weight *= plan::expertMembers(param);
  if (plan::tensorSliceMembers(param) < 2)
    weight /= static_cast<double>(plan::tensorParallel(plan));
  return weight;
}

Status ExecutorImpl::localGradSquares(double &sum) {
  sum = 0;
  if (clips || plan.params_size() == 0)
    return Status::ok();
  // The same definition as CLIP_GRADS; updated parameters were measured
  // just before their update (Segments.cpp), on the streams, which are
  // synchronized by now.
  PIPER_RETURN_IF_ERROR(measureGradSquares(/*skipUpdated=*/true));
  PIPER_RETURN_IF_ERROR(squares->read(gradSquares.data(), plan.params_size())
                            .withContext("reading the gradient norm"));
  for (int p = 0; p < plan.params_size(); ++p)
    sum += gradSquares[p] * shareWeight(p);
  return Status::ok();
}

Status ExecutorImpl::measureGradSquares(bool skipUpdated) {
  // One measurement of the gradients, read at once later (gpu-review C.12).
  std::vector<hal::SquaresSpan> spans;
  for (int p = 0; p < plan.params_size(); ++p)
    if (!skipUpdated || !updated[p])
      spans.push_back(gradSpan(p));
  if (spans.empty())
    return Status::ok();
  return squares->measure(spans).withContext("measuring the gradient norm");
}

void ExecutorImpl::finishGradNorm(double worldSquares) {
  if (!clips)
    lastGradNorm =
        std::sqrt(worldSquares / std::max(1, plan.training().num_replicas()));
}

std::string ExecutorImpl::divergedMessage(const char *what, int64_t step,
                                          double value) {
  return fmt::format("non-finite {} at step {} ({}): the training diverged "
                     "(non-finite weights or data, or a learning rate too "
                     "high); every rank stops here",
                     what, step, value);
}

Status ExecutorImpl::checkDivergence(int64_t step, double loss) const {
  if ((clips || plan.params_size() > 0) && !std::isfinite(lastGradNorm))
    return Status::diverged(
        divergedMessage("gradient norm", step, lastGradNorm) +
        (clips ? "; CLIP_GRADS measured it, and the step's update was "
                 "skipped"
               : ""));
  if (!std::isfinite(loss))
    return Status::diverged(divergedMessage("loss", step, loss));
  return Status::ok();
}

Status ExecutorImpl::clipGrads(int s) {
  // Each class holds data-parallel-reduced gradients, identical across its
  // replicas: the world sum of squares counts every gradient num_replicas
  // times. Everything stays on the device, queued on this stream: every
  // gradient measured, the slots weighed into this rank's share (in
  // parameter order, in double), the share summed over the ranks in place,
  // the norm and the clip factor computed. The updates scale each gradient
  // by it as they read it (KernelContext::clipFactor): no pass of its own.
  // A non-finite norm makes the factor NaN: the updates skip, and the host,
  // reading the norm once after the step, stops the run (checkDivergence).
  PIPER_RETURN_IF_ERROR(measureGradSquares(/*skipUpdated=*/false));
  PIPER_RETURN_IF_ERROR(
      squares->weigh().withContext("weighing the gradient norm"));
  if (comm)
    PIPER_RETURN_IF_ERROR(
        comm->allReduceSumWorldOn(plan.streams(s).name(), squares->total(), 1)
            .withContext("summing the squared gradient norm over ranks"));
  return squares
      ->clip(std::max(1, plan.training().num_replicas()),
             plan.training().clip_grad_norm())
      .withContext("the gradient norm's clip factor");
}

Status ExecutorImpl::allReduce(int s, const Instruction &inst) {
  std::vector<int> ranks = memberRanks(inst);
  if (ranks.size() < 2)
    return Status::ok(); // a sum over one rank is the identity
  std::string what = "all-reduce over ranks [";
  for (size_t i = 0; i < ranks.size(); ++i)
    what += (i ? ", " : "") + std::to_string(ranks[i]);
  what += "]";

  CommKey key{plan.streams(s).name(), ranks};
  if (inst.params_size() == 1) {
    const TensorPtr &g = stateOf(inst.params(0), Operand::GRAD);
    return comm
        ->allReduce(key, g->data, static_cast<size_t>(g->bytes / 4),
                    CommDType::F32)
        ->wait()
        .withContext(what);
  }
  // One flat buffer means one collective per instruction, however many
  // parameters it covers: the staging block at the instruction's
  // scratch_offset in the arena.
  float *flat = reinterpret_cast<float *>(at(inst.scratch_offset()));
  size_t count = 0;
  for (int p : inst.params()) {
    const TensorPtr &g = stateOf(p, Operand::GRAD);
    PIPER_RETURN_IF_ERROR(
        memory->copy(flat + count, g->data, static_cast<size_t>(g->bytes))
            .withContext(what + ": staging a gradient"));
    count += static_cast<size_t>(g->bytes / 4);
  }
  PIPER_RETURN_IF_ERROR(comm->allReduce(key, flat, count, CommDType::F32)
                            ->wait()
                            .withContext(what));
  size_t pos = 0;
  for (int p : inst.params()) {
    const TensorPtr &g = stateOf(p, Operand::GRAD);
    PIPER_RETURN_IF_ERROR(
        memory->copy(g->data, flat + pos, static_cast<size_t>(g->bytes))
            .withContext(what + ": unstaging a gradient"));
    pos += static_cast<size_t>(g->bytes / 4);
  }
  return Status::ok();
}

} // namespace piper::runtime

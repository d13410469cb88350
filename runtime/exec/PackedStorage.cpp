// Which of a segment's values a mixed-precision call keeps packed bf16
// (PackedStorage, ExecutorImpl.h): arguments read as their step buffers
// are stored, values stored packed by their writer, and the step's memory
// plan laid out again for that storage (planStorage); and which parameters
// keep their bf16 copy packed (planPackedParams), for which the state region
// is laid out again.
#include "proto/analysis/MemoryPlan.h"
#include "runtime/exec/ExecutorImpl.h"

namespace piper::runtime {

using plan::Operand;

PackedStorage planPackedStorage(const plan::Segment &seg,
                                const std::vector<ResolvedKernel> &resolved) {
  const int numValues = seg.values_size();
  std::vector<int> argOf(numValues, -1), asResult(numValues, 0);
  for (int a = 0; a < seg.args_size(); ++a)
    argOf[seg.args(a)] = a;
  for (int v : seg.results())
    ++asResult[v];
  // Per value: its packed writes, and its other writes and fp32 reads.
  std::vector<int> packedWrites(numValues, 0), otherUses(numValues, 0);
  for (int k = 0; k < seg.kernels_size(); ++k) {
    const plan::Kernel &kernel = seg.kernels(k);
    std::vector<char> isInput(numValues, 0);
    for (int j = 0; j < kernel.inputs_size(); ++j) {
      const Operand &o = kernel.inputs(j);
      if (o.kind() != Operand::VALUE)
        continue;
      isInput[o.index()] = 1;
      if (!resolved[k].packedInputs[j])
        ++otherUses[o.index()];
    }
    for (int o = 0; o < kernel.outputs_size(); ++o) {
      const Operand &out = kernel.outputs(o);
      if (out.kind() != Operand::VALUE)
        continue;
      if (resolved[k].packedOutputs[o] && !isInput[out.index()])
        ++packedWrites[out.index()];
      else
        ++otherUses[out.index()];
    }
  }
  PackedStorage p;
  p.unpacksArg.assign(seg.args_size(), 0);
  for (int a = 0; a < seg.args_size(); ++a) {
    int v = seg.args(a);
    p.unpacksArg[a] = otherUses[v] > 0 || asResult[v] > 0;
  }
  // Written once, packed, and read packed only; a result once at most.
  auto packed = [&](int v) {
    return argOf[v] < 0 && asResult[v] <= 1 && packedWrites[v] == 1 &&
           otherUses[v] == 0 && seg.value_offsets(v) >= 0;
  };
  p.packsResult.assign(seg.results_size(), 0);
  for (int r = 0; r < seg.results_size(); ++r)
    p.packsResult[r] = packed(seg.results(r));
  for (int v = 0; v < numValues; ++v)
    if (asResult[v] == 0 && packed(v))
      p.packedSlots.push_back(v);
  return p;
}

Status ExecutorImpl::resolveStorage(int g, int k, ResolvedKernel &r) const {
  const plan::Segment &seg = plan.segments(g);
  const plan::Kernel &kernel = seg.kernels(k);
  r.info = device->findKernel(kernel.op());
  if (!r.info)
    return Status::error("segment " + std::to_string(g) + " ('" + seg.name() +
                         "'), kernel " + std::to_string(k) +
                         ": unknown kernel '" + kernel.op() + "' on device " +
                         device->name());
  const std::string &op = kernel.op();
  // Mixed precision: compute kernels read bf16 weights; the optimizer and
  // the gradient accumulators stay in fp32.
  r.lowPrecision = bf16 && op != "accumulate" && op != "zero" && op != "adamw";
  r.roundsOutputs = r.lowPrecision && device->roundsOutputs(*r.info);
  for (const Operand &o : kernel.outputs())
    r.roundsOutputs &= o.kind() == Operand::VALUE;
  r.packedInputs.assign(kernel.inputs_size(), 0);
  for (int j = 0; j < kernel.inputs_size(); ++j)
    r.packedInputs[j] = r.lowPrecision && options.packedStepBuffers &&
                        kernel.inputs(j).kind() == Operand::VALUE &&
                        device->readsPackedInput(*r.info, j);
  r.packedOutputs.assign(kernel.outputs_size(), 0);
  for (int o = 0; o < kernel.outputs_size(); ++o)
    r.packedOutputs[o] = r.roundsOutputs && options.packedStepBuffers &&
                         kernel.outputs(o).kind() == Operand::VALUE &&
                         !kernelReadsOutputs(kernel) &&
                         device->writesPackedOutput(*r.info, o);
  return Status::ok();
}

Status ExecutorImpl::planStorage() {
  kernels.assign(plan.segments_size(), {});
  packedStorage.clear();
  plan::ValueBytes &bytes = storageBytes.values;
  bytes.assign(plan.segments_size(), {});
  bool relayout = false;
  for (int g = 0; g < plan.segments_size(); ++g) {
    const plan::Segment &seg = plan.segments(g);
    std::vector<ResolvedKernel> &resolved = kernels[g];
    resolved.resize(seg.kernels_size());
    for (int k = 0; k < seg.kernels_size(); ++k)
      PIPER_RETURN_IF_ERROR(resolveStorage(g, k, resolved[k]));
    packedStorage.push_back(planPackedStorage(seg, resolved));
    const PackedStorage &p = packedStorage.back();
    std::vector<int64_t> &b = bytes[g];
    b.assign(seg.values_size(), -1);
    // Written straight into its step buffer, or read from it as stored.
    for (int r = 0; r < seg.results_size(); ++r)
      if (p.packsResult[r])
        b[seg.results(r)] = 0;
    for (int a = 0; a < seg.args_size(); ++a)
      if (!p.unpacksArg[a] && seg.value_offsets(seg.args(a)) >= 0)
        b[seg.args(a)] = 0;
    // Packed in the first half of its slot.
    for (int v : p.packedSlots) {
      plan::TensorType type = seg.values(v);
      type.set_dtype(plan::BF16);
      b[v] = tensorBytes(type);
    }
    for (int64_t n : b)
      relayout |= n >= 0;
  }
  // The compute copies stored packed take half their slots: the state
  // region is laid out again too.
  planPackedParams();
  plan::CopyBytes &copies = storageBytes.copies;
  copies.assign(plan.params_size(), -1);
  for (int p = 0; p < plan.params_size(); ++p)
    if (packedParam[p]) {
      plan::TensorType type = plan.params(p).type();
      type.set_dtype(plan::BF16);
      copies[p] = tensorBytes(type);
      relayout = true;
    }
  if (!relayout)
    return Status::ok();
  std::string error;
  plan::layOutState(plan, &copies);
  if (!plan::relayoutStep(plan, &bytes, error) ||
      !plan::checkArena(plan, error, &bytes, &copies))
    return Status::error("internal error: the memory plan laid out again for "
                         "the values stored packed: " +
                         error);
  return Status::ok();
}

void ExecutorImpl::planPackedParams() {
  packedParam.assign(plan.params_size(), 0);
  if (!bf16 || !options.packedStepBuffers)
    return;
  std::vector<int> readers(plan.params_size(), 0),
      packedReaders(plan.params_size(), 0);
  for (int g = 0; g < plan.segments_size(); ++g)
    for (int k = 0; k < plan.segments(g).kernels_size(); ++k) {
      const plan::Kernel &kernel = plan.segments(g).kernels(k);
      const ResolvedKernel &r = kernels[g][k];
      for (int j = 0; j < kernel.inputs_size(); ++j) {
        const Operand &o = kernel.inputs(j);
        if (!r.lowPrecision || o.kind() != Operand::PARAM || o.index() < 0 ||
            o.index() >= plan.params_size())
          continue;
        ++readers[o.index()];
        packedReaders[o.index()] += device->readsPackedInput(*r.info, j);
      }
    }
  // A parameter with a compute copy (none under ZeRO-3: kernels read the
  // gathered parameter).
  for (int p = 0; p < plan.params_size(); ++p)
    packedParam[p] = !plan::stateSharded(plan.params(p), 0) && readers[p] > 0 &&
                     packedReaders[p] == readers[p];
}

Executor::PackedCounts Executor::packedCounts() const {
  const plan::Plan &plan = impl->plan;
  PackedCounts c;
  for (size_t g = 0; g < impl->packedStorage.size(); ++g) {
    const plan::Segment &seg = plan.segments(static_cast<int>(g));
    const PackedStorage &p = impl->packedStorage[g];
    for (char r : p.packsResult)
      c.results += r;
    c.values += static_cast<int64_t>(p.packedSlots.size());
    // An argument no kernel unpacks and one reads packed.
    std::vector<char> readPacked(seg.values_size(), 0);
    for (int k = 0; k < seg.kernels_size(); ++k)
      for (int j = 0; j < seg.kernels(k).inputs_size(); ++j) {
        const Operand &o = seg.kernels(k).inputs(j);
        if (o.kind() == Operand::VALUE && impl->kernels[g][k].packedInputs[j])
          readPacked[o.index()] = 1;
      }
    for (int a = 0; a < seg.args_size(); ++a)
      c.arguments += !p.unpacksArg[a] && readPacked[seg.args(a)];
  }
  for (char packed : impl->packedParam)
    c.paramCopies += packed;
  return c;
}

} // namespace piper::runtime

// Which of a segment's values a mixed-precision call keeps packed bf16
// (PackedStorage, ExecutorImpl.h): arguments read as their step buffers
// are stored, values stored packed by their writer; and which parameters
// keep their bf16 copy packed (planPackedParams).
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
  for (int p = 0; p < plan.params_size(); ++p) {
    if (!bf16Params[p] || readers[p] == 0 || packedReaders[p] != readers[p])
      continue;
    // The first half of the copy's slot, packed.
    plan::TensorType type = plan.params(p).type();
    type.set_dtype(plan::BF16);
    bf16Params[p] =
        viewTensor(plan::BF16, type, tensorBytes(type), bf16Params[p]->data);
    packedParam[p] = 1;
  }
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

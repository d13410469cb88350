// Which of a segment's values a mixed-precision call keeps packed bf16
// (PackedStorage, ExecutorImpl.h): arguments read as their step buffers
// are stored, values stored packed by their writer.
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

} // namespace piper::runtime

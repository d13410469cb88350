// ZeRO's collectives on sharded parameter state (plan.proto ParamSharding):
// REDUCE_SCATTER_GRADS leaves each member its range of the summed gradients,
// ALL_GATHER_PARAMS rebuilds whole parameters from the members' ranges. One
// collective per instruction: the bucket's tensors are staged flat, grouped
// by member, at the instruction's scratch_offset.
#include <algorithm>

#include "runtime/exec/ExecutorImpl.h"

namespace piper::runtime {

using plan::Instruction;
using plan::Operand;

namespace {

std::string describe(const char *what, const std::vector<int> &ranks,
                     const std::string &stream, int params) {
  std::string out = std::string(what) + " of " + std::to_string(params) +
                    " params over ranks [";
  for (size_t i = 0; i < ranks.size(); ++i)
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "] on stream '" + stream + "'";
}

/// The bucket's layout in the staging block: member m's ranges of every
/// parameter, in instruction order, one member after the other.
struct Layout {
  std::vector<std::vector<plan::ShardRange>> ranges; // [param][member]
  std::vector<size_t> counts;                         // per member
  size_t total = 0;
};

Layout layoutOf(const plan::Plan &plan, const Instruction &inst,
                int members) {
  Layout l;
  l.counts.assign(members, 0);
  for (int p : inst.params()) {
    int64_t n = plan::paramElements(plan.params(p));
    std::vector<plan::ShardRange> r(members);
    for (int m = 0; m < members; ++m) {
      r[m] = plan::shardRange(n, members, m);
      l.counts[m] += static_cast<size_t>(r[m].count);
    }
    l.total += static_cast<size_t>(n);
    l.ranges.push_back(std::move(r));
  }
  return l;
}

} // namespace

Status ExecutorImpl::reduceScatterGrads(int s, const Instruction &inst,
                                        StepState &st) {
  std::vector<int> ranks = memberRanks(inst);
  const int members = static_cast<int>(ranks.size());
  // checkSharding: the group is plan.ranks, in order; under tensor
  // parallelism `ranks` is this member's subgroup (every T-th).
  const int me = static_cast<int>(plan::dataReplica(plan, replica));
  Layout l = layoutOf(plan, inst, members);
  CommKey key{plan.streams(s).name(), ranks};
  const std::string what = describe("ZeRO gradient reduce-scatter", ranks,
                                    key.stream, inst.params_size());
  auto scatter = [&](const float *input, float *output,
                     const std::vector<size_t> &counts) -> Status {
    if (members < 2)
      return memory->copy(output, input, 4 * counts[0]).withContext(what);
    return comm->reduceScatter(key, input, output, counts, CommDType::F32)
        ->wait()
        .withContext(what);
  };
  char *staging = at(inst.scratch_offset());
  if (inst.inputs_size() > 0) {
    // One microbatch's whole gradients (ZeRO-2, 3): a parameter's
    // flattened gradient is already grouped by member, so each is scattered
    // straight from its buffer (unpacked first in mixed precision) and this
    // member's range added into its sharded accumulator. The staging holds
    // one range, and one unpacked gradient.
    float *mine = reinterpret_cast<float *>(staging);
    float *unpacked = mine + zeroRangeStaging(inst);
    for (int i = 0; i < inst.params_size(); ++i) {
      int p = inst.params(i);
      TensorPtr in;
      PIPER_RETURN_IF_ERROR(fetchStored(st, inst.inputs(i), in));
      const float *grad = static_cast<const float *>(in->data);
      if (in->dtype == plan::BF16) {
        PIPER_RETURN_IF_ERROR(
            device
                ->unpackBf16(unpacked, static_cast<const uint16_t *>(in->data),
                             plan::paramElements(plan.params(p)))
                .withContext(what + ": unpacking " +
                             describeBuffer(inst.inputs(i))));
        grad = unpacked;
      }
      std::vector<size_t> counts;
      for (const plan::ShardRange &r : l.ranges[i])
        counts.push_back(static_cast<size_t>(r.count));
      PIPER_RETURN_IF_ERROR(scatter(grad, mine, counts));
      PIPER_RETURN_IF_ERROR(
          device->add(rangeOf(p, Operand::GRAD), mine, l.ranges[i][me].count)
              .withContext(what + ": accumulating the range of parameter '" +
                           plan.params(p).name() + "'"));
    }
    return Status::ok();
  }
  // The whole accumulators (ZeRO-1), after the last microbatch: one
  // collective for the bucket, staged flat member by member; each member's
  // range of its accumulator is replaced by the sum.
  float *flat = reinterpret_cast<float *>(staging);
  float *mine = flat + l.total;
  size_t pos = 0;
  for (int m = 0; m < members; ++m)
    for (int i = 0; i < inst.params_size(); ++i) {
      const plan::ShardRange &r = l.ranges[i][m];
      PIPER_RETURN_IF_ERROR(
          memory
              ->copy(flat + pos,
                     static_cast<const float *>(
                         stateOf(inst.params(i), Operand::GRAD)->data) +
                         r.start,
                     static_cast<size_t>(4 * r.count))
              .withContext(what + ": staging"));
      pos += static_cast<size_t>(r.count);
    }
  PIPER_RETURN_IF_ERROR(scatter(flat, mine, l.counts));
  pos = 0;
  for (int i = 0; i < inst.params_size(); ++i) {
    const plan::ShardRange &r = l.ranges[i][me];
    PIPER_RETURN_IF_ERROR(
        memory
            ->copy(rangeOf(inst.params(i), Operand::GRAD), mine + pos,
                   static_cast<size_t>(4 * r.count))
            .withContext(what + ": unstaging"));
    pos += static_cast<size_t>(r.count);
  }
  return Status::ok();
}

int64_t ExecutorImpl::zeroRangeStaging(const Instruction &inst) const {
  int64_t most = 0;
  for (int p : inst.params())
    most = std::max(most, plan::shardCapacity(plan::paramElements(plan.params(p)),
                                              plan::shardMembers(plan,
                                                                 plan.params(p))));
  return most;
}

Status ExecutorImpl::allGatherParams(int s, const Instruction &inst,
                                     StepState &st) {
  std::vector<int> ranks = memberRanks(inst);
  const int members = static_cast<int>(ranks.size());
  const int me = static_cast<int>(plan::dataReplica(plan, replica));
  Layout l = layoutOf(plan, inst, members);
  CommKey key{plan.streams(s).name(), ranks};
  const std::string what = describe("ZeRO parameter all-gather", ranks,
                                    key.stream, inst.params_size());
  auto gather = [&](const float *input, float *output,
                    const std::vector<size_t> &counts) -> Status {
    if (members < 2)
      return memory->copy(output, input, 4 * counts[0]).withContext(what);
    return comm->allGather(key, input, output, counts, CommDType::F32)
        ->wait()
        .withContext(what);
  };
  char *staging = at(inst.scratch_offset());
  if (inst.outputs_size() > 0) {
    // Into new buffers (ZeRO-3, before a use): a flattened parameter is its
    // members' ranges in order, so each is gathered straight from its shard
    // into its buffer (through one staged whole parameter when the buffer
    // is packed bf16: the bf16 copy a kernel would read).
    float *whole = reinterpret_cast<float *>(staging);
    for (int i = 0; i < inst.params_size(); ++i) {
      int p = inst.params(i);
      int id = inst.outputs(i);
      std::vector<size_t> counts;
      for (const plan::ShardRange &r : l.ranges[i])
        counts.push_back(static_cast<size_t>(r.count));
      bool pack = packed(id);
      float *out = pack ? whole : static_cast<float *>(bufferViews[id]->data);
      PIPER_RETURN_IF_ERROR(gather(rangeOf(p, Operand::PARAM), out, counts));
      if (pack)
        PIPER_RETURN_IF_ERROR(
            device
                ->packBf16(static_cast<uint16_t *>(bufferViews[id]->data),
                           whole, plan::paramElements(plan.params(p)))
                .withContext(what + ": packing " + describeBuffer(id)));
      PIPER_RETURN_IF_ERROR(publish(st, id));
    }
    return Status::ok();
  }
  // In place (ZeRO-1, 2, after the update): one collective for the bucket,
  // staged flat member by member, then every member's ranges back into the
  // whole parameters.
  float *flat = reinterpret_cast<float *>(staging);
  float *mine = flat + l.total;
  size_t pos = 0;
  for (int i = 0; i < inst.params_size(); ++i) {
    const plan::ShardRange &r = l.ranges[i][me];
    PIPER_RETURN_IF_ERROR(
        memory
            ->copy(mine + pos, rangeOf(inst.params(i), Operand::PARAM),
                   static_cast<size_t>(4 * r.count))
            .withContext(what + ": staging"));
    pos += static_cast<size_t>(r.count);
  }
  PIPER_RETURN_IF_ERROR(gather(mine, flat, l.counts));
  pos = 0;
  for (int m = 0; m < members; ++m)
    for (int i = 0; i < inst.params_size(); ++i) {
      const plan::ShardRange &r = l.ranges[i][m];
      PIPER_RETURN_IF_ERROR(
          memory
              ->copy(static_cast<float *>(
                         stateOf(inst.params(i), Operand::PARAM)->data) +
                         r.start,
                     flat + pos, static_cast<size_t>(4 * r.count))
              .withContext(what + ": unstaging"));
      pos += static_cast<size_t>(r.count);
    }
  return Status::ok();
}

} // namespace piper::runtime

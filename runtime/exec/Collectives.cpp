// Value-level collectives on step buffers: ALL_REDUCE of buffers,
// REDUCE_SCATTER, ALL_GATHER and ALL_TO_ALL with run-time counts. (The
// gradient form of ALL_REDUCE, on accumulators, is in Gradients.cpp.)
#include <algorithm>
#include <numeric>

#include "runtime/comm/RowExchange.h"
#include "runtime/exec/ExecutorImpl.h"

namespace piper::runtime {

using plan::Instruction;

namespace {
/// What the error messages call a collective: "reduce-scatter over ranks
/// [0, 1] on stream 'dp_stream'".
std::string describe(const char *what, const std::vector<int> &ranks,
                     const std::string &stream) {
  std::string out = std::string(what) + " over ranks [";
  for (size_t i = 0; i < ranks.size(); ++i)
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "] on stream '" + stream + "'";
}
} // namespace

CommDType ExecutorImpl::commType(int id) const {
  if (packed(id))
    return CommDType::BF16;
  return plan.buffers(id).type().dtype() == plan::I32 ? CommDType::I32
                                                      : CommDType::F32;
}

Status ExecutorImpl::collective(int s, const Instruction &inst,
                                StepState &st) {
  const std::string &streamName = plan.streams(s).name();
  std::vector<int> ranks = memberRanks(inst);
  int position = static_cast<int>(
      std::find(ranks.begin(), ranks.end(), options.rank) - ranks.begin());
  CommKey key{streamName, ranks};
  const bool alone = ranks.size() < 2;
  auto input = [&](int i, TensorPtr &out) {
    return fetchStored(st, inst.inputs(i), out);
  };
  auto output = [&](int i) -> const TensorPtr & {
    return bufferViews[inst.outputs(i)];
  };

  switch (inst.kind()) {
  case Instruction::ALL_REDUCE: {
    std::string what = describe("all-reduce", ranks, streamName);
    for (int i = 0; i < inst.inputs_size(); ++i) {
      TensorPtr in;
      PIPER_RETURN_IF_ERROR(input(i, in));
      const TensorPtr &out = output(i);
      PIPER_RETURN_IF_ERROR(
          memory->copy(out->data, in->data, static_cast<size_t>(in->bytes))
              .withContext(what + ": copying its input"));
      if (!alone) {
        CommDType type = commType(inst.outputs(i));
        PIPER_RETURN_IF_ERROR(
            comm->allReduce(key, out->data,
                            static_cast<size_t>(out->bytes) /
                                commDTypeSize(type),
                            type)
                ->wait()
                .withContext(what));
      }
      PIPER_RETURN_IF_ERROR(publish(st, inst.outputs(i)));
    }
    return Status::ok();
  }
  case Instruction::REDUCE_SCATTER:
  case Instruction::ALL_GATHER: {
    bool scatter = inst.kind() == Instruction::REDUCE_SCATTER;
    TensorPtr in;
    PIPER_RETURN_IF_ERROR(input(0, in));
    const TensorPtr &out = output(0);
    CommDType type = commType(inst.inputs(0));
    size_t elem = commDTypeSize(type);
    std::vector<size_t> counts(inst.counts().begin(), inst.counts().end());
    size_t mine = counts[position];
    if (alone) {
      PIPER_RETURN_IF_ERROR(
          memory->copy(out->data, in->data, mine * elem)
              .withContext(describe(scatter ? "reduce-scatter" : "all-gather",
                                    ranks, streamName)));
    } else if (scatter) {
      PIPER_RETURN_IF_ERROR(
          comm->reduceScatter(key, in->data, out->data, counts, type)
              ->wait()
              .withContext(describe("reduce-scatter", ranks, streamName)));
    } else {
      PIPER_RETURN_IF_ERROR(
          comm->allGather(key, in->data, out->data, counts, type)
              ->wait()
              .withContext(describe("all-gather", ranks, streamName)));
    }
    // A short slice is followed by zeros, whatever the buffer held before.
    size_t written = scatter ? mine * elem
                             : std::accumulate(counts.begin(), counts.end(),
                                               size_t{0}) *
                                   elem;
    if (static_cast<size_t>(out->bytes) > written)
      PIPER_RETURN_IF_ERROR(
          memory
              ->zero(static_cast<char *>(out->data) + written,
                     static_cast<size_t>(out->bytes) - written)
              .withContext(
                  describe(scatter ? "reduce-scatter" : "all-gather", ranks,
                           streamName) +
                  ": zeroing the rest of its output"));
    return publish(st, inst.outputs(0));
  }
  case Instruction::ALL_TO_ALL:
    return allToAll(s, inst, st, key);
  default:
    return Status::error("internal: not a value collective");
  }
}

Status ExecutorImpl::allToAll(int s, const Instruction &inst, StepState &st,
                              const CommKey &key) {
  const std::vector<int> &ranks = key.ranks;
  const size_t members = ranks.size();
  std::string what = describe("all-to-all", ranks, plan.streams(s).name());
  TensorPtr in, sendCountsBuf;
  PIPER_RETURN_IF_ERROR(fetchStored(st, inst.inputs(0), in));
  PIPER_RETURN_IF_ERROR(fetchStored(st, inst.inputs(1), sendCountsBuf));
  const TensorPtr &out = bufferViews[inst.outputs(0)];
  const TensorPtr &recvCountsBuf = bufferViews[inst.outputs(1)];
  const plan::TensorType &inType = plan.buffers(inst.inputs(0)).type();
  const plan::TensorType &outType = plan.buffers(inst.outputs(0)).type();
  int64_t rowElements = 1;
  for (int d = 1; d < inType.shape_size(); ++d)
    rowElements *= inType.shape(d);
  CommDType type = commType(inst.inputs(0));
  size_t rowBytes = static_cast<size_t>(rowElements) * commDTypeSize(type);

  std::vector<int32_t> sendCounts(members), recvCounts;
  PIPER_RETURN_IF_ERROR(memory
                            ->copyToHost(sendCounts.data(), sendCountsBuf->data,
                                         members * sizeof(int32_t))
                            .withContext(what + ": reading the row counts"));
  PIPER_RETURN_IF_ERROR(exchangeRowCounts(comm, key, options.rank,
                                          inType.shape(0), outType.shape(0),
                                          sendCounts, recvCounts, what));
  int64_t recvRows = 0;
  for (int32_t c : recvCounts)
    recvRows += c;
  if (members < 2) {
    PIPER_RETURN_IF_ERROR(
        memory
            ->copy(out->data, in->data, static_cast<size_t>(recvRows) * rowBytes)
            .withContext(what));
  } else {
    size_t elems = static_cast<size_t>(rowElements);
    std::vector<size_t> sendElems(members), recvElems(members);
    for (size_t j = 0; j < members; ++j) {
      sendElems[j] = static_cast<size_t>(sendCounts[j]) * elems;
      recvElems[j] = static_cast<size_t>(recvCounts[j]) * elems;
    }
    PIPER_RETURN_IF_ERROR(comm->allToAll(key, in->data, sendElems, out->data,
                                         recvElems, type)
                              ->wait()
                              .withContext(what));
  }
  size_t written = static_cast<size_t>(recvRows) * rowBytes;
  if (static_cast<size_t>(out->bytes) > written)
    PIPER_RETURN_IF_ERROR(memory
                              ->zero(static_cast<char *>(out->data) + written,
                                     static_cast<size_t>(out->bytes) - written)
                              .withContext(what +
                                           ": zeroing the rest of its output"));
  PIPER_RETURN_IF_ERROR(
      memory
          ->copyFromHost(recvCountsBuf->data, recvCounts.data(),
                         members * sizeof(int32_t))
          .withContext(what + ": storing the received row counts"));
  PIPER_RETURN_IF_ERROR(publish(st, inst.outputs(0)));
  return publish(st, inst.outputs(1));
}

} // namespace piper::runtime

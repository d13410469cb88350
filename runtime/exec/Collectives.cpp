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
  default:
    return Status::error("internal: not a value collective");
  }
}

Status ExecutorImpl::allToAll(int s, int i, StepState &st) {
  const Instruction &inst = plan.streams(s).instructions(i);
  const CommKey key{plan.streams(s).name(), memberRanks(inst)};
  const std::vector<int> &ranks = key.ranks;
  const size_t members = ranks.size();
  std::string what = describe("all-to-all", ranks, plan.streams(s).name());
  if (!blockFaultOf.empty())
    return allToAllBlocks(s, i, st, key, what);
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

// A captured step's all-to-all. Its counts stay on the device, so the
// exchange cannot depend on them: each member is sent a block of
// ceil(input rows / members) rows whatever its count (the rows a member
// gets under expert parallelism and Ulysses attention, at most), the counts
// are exchanged beside them, and the receiver moves each block's first
// rows to the output in member order, zeroing the rest, as the exchange
// of the counted rows would have left it. Counts that do not fit leave
// their fault code on the device, read after the step
// (blockExchangeFaults), and move nothing.
namespace {
size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }
} // namespace

Status ExecutorImpl::allocateBlockExchanges() {
  blockFaultOf.assign(plan.streams_size(), {});
  blockExchanges.clear();
  blockExchanges.resize(plan.streams_size());
  blockedAllToAlls.clear();
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    blockFaultOf[s].assign(stream.instructions_size(), -1);
    size_t blocks = 0, counts = 0;
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const Instruction &inst = stream.instructions(i);
      if (inst.kind() != Instruction::ALL_TO_ALL)
        continue;
      blockFaultOf[s][i] = static_cast<int>(blockedAllToAlls.size());
      BlockedAllToAll call;
      hal::RowBlocks &b = call.blocks;
      b.members = static_cast<int64_t>(memberRanks(inst).size());
      b.rows = plan.buffers(inst.inputs(0)).type().shape(0);
      b.blockRows = (b.rows + b.members - 1) / b.members;
      b.rowBytes =
          bufferViews[inst.inputs(0)]->bytes / std::max<int64_t>(1, b.rows);
      call.outputRows = plan.buffers(inst.outputs(0)).type().shape(0);
      blockedAllToAlls.push_back(call);
      blocks = std::max(blocks, aligned(static_cast<size_t>(
                                    b.members * b.blockRows * b.rowBytes)));
      counts =
          std::max(counts, static_cast<size_t>(b.members) * sizeof(int32_t));
    }
    if (blocks + counts == 0)
      continue;
    BlockExchange &ex = blockExchanges[s];
    ex.receiveOffset = blocks;
    ex.sentOffset = 2 * blocks;
    const size_t bytes = 2 * blocks + aligned(counts);
    PIPER_RETURN_IF_ERROR(
        allocateDevice(ex.memory, bytes,
                       "allocating " + std::to_string(bytes) +
                           " bytes for the all-to-all blocks of stream '" +
                           stream.name() + "'"));
  }
  if (blockedAllToAlls.empty()) {
    blockFaultOf.clear();
    return Status::ok();
  }
  const size_t bytes = blockedAllToAlls.size() * sizeof(int32_t);
  PIPER_RETURN_IF_ERROR(allocateDevice(
      blockFaults, bytes, "allocating the all-to-alls' fault codes"));
  return memory->zero(blockFaults.data, bytes)
      .withContext("zeroing the all-to-alls' fault codes");
}

Status ExecutorImpl::allToAllBlocks(int s, int i, StepState &st,
                                    const CommKey &key,
                                    const std::string &what) {
  const Instruction &inst = plan.streams(s).instructions(i);
  const int f = blockFaultOf[s][i];
  hal::RowBlocks shape = blockedAllToAlls[f].blocks;
  TensorPtr in, sendCountsBuf;
  PIPER_RETURN_IF_ERROR(fetchStored(st, inst.inputs(0), in));
  PIPER_RETURN_IF_ERROR(fetchStored(st, inst.inputs(1), sendCountsBuf));
  const TensorPtr &out = bufferViews[inst.outputs(0)];
  const TensorPtr &recvCountsBuf = bufferViews[inst.outputs(1)];
  const CommDType type = commType(inst.inputs(0));

  BlockExchange &ex = blockExchanges[s];
  char *send = ex.memory.data, *receive = send + ex.receiveOffset;
  int32_t *sent = reinterpret_cast<int32_t *>(send + ex.sentOffset);
  int32_t *fault = reinterpret_cast<int32_t *>(blockFaults.data) + f;
  const int32_t *sendCounts = static_cast<const int32_t *>(sendCountsBuf->data);
  int32_t *recvCounts = static_cast<int32_t *>(recvCountsBuf->data);
  PIPER_RETURN_IF_ERROR(
      device->packRowBlocks(shape, in->data, sendCounts, send, sent, fault)
          .withContext(what + ": packing its blocks"));
  if (shape.members < 2) {
    PIPER_RETURN_IF_ERROR(
        memory->copy(recvCounts, sent, sizeof(int32_t)).withContext(what));
    receive = send;
  } else {
    const size_t members = static_cast<size_t>(shape.members);
    const std::vector<size_t> ones(members, 1),
        block(members, static_cast<size_t>(shape.blockRows * shape.rowBytes /
                                           commDTypeSize(type)));
    PIPER_RETURN_IF_ERROR(
        comm->allToAll(key, sent, ones, recvCounts, ones, CommDType::I32)
            ->wait()
            .withContext(what + " (counts)"));
    PIPER_RETURN_IF_ERROR(comm->allToAll(key, send, block, receive, block, type)
                              ->wait()
                              .withContext(what));
  }
  shape.rows = blockedAllToAlls[f].outputRows;
  PIPER_RETURN_IF_ERROR(
      device->unpackRowBlocks(shape, receive, recvCounts, out->data, fault)
          .withContext(what + ": unpacking its blocks"));
  PIPER_RETURN_IF_ERROR(publish(st, inst.outputs(0)));
  return publish(st, inst.outputs(1));
}

StatusOr<std::string> ExecutorImpl::blockExchangeFaults(int64_t step) {
  if (blockedAllToAlls.empty())
    return std::string();
  std::vector<int32_t> codes(blockedAllToAlls.size());
  PIPER_RETURN_IF_ERROR(memory
                            ->copyToHost(codes.data(), blockFaults.data,
                                         codes.size() * sizeof(int32_t))
                            .withContext("reading the all-to-alls' fault "
                                         "codes"));
  for (int s = 0; s < plan.streams_size(); ++s)
    for (int i = 0; i < plan.streams(s).instructions_size(); ++i) {
      const int f = blockFaultOf[s][i];
      if (f < 0 || codes[f] == 0)
        continue;
      const hal::RowBlocks &b = blockedAllToAlls[f].blocks;
      using Fault = hal::RowBlockFault;
      std::string why;
      switch (static_cast<Fault>(codes[f])) {
      case Fault::kCount:
        why = "a row count is negative or above the " +
              std::to_string(b.blockRows) +
              " rows a captured step moves per member (the input's " +
              std::to_string(b.rows) + " rows over " +
              std::to_string(b.members) +
              " members; piper-run --step-graph off moves any counts)";
        break;
      case Fault::kInput:
        why = "its send counts sum past the " + std::to_string(b.rows) +
              " rows of its input";
        break;
      case Fault::kPeer:
        why = "a member sent invalid counts (its own error says why)";
        break;
      case Fault::kOutput:
        why = "it receives more rows than the " +
              std::to_string(blockedAllToAlls[f].outputRows) + " of its output";
        break;
      default:
        why = "fault code " + std::to_string(codes[f]);
      }
      const plan::Instruction &inst = plan.streams(s).instructions(i);
      return who + ", " + instructionContext(plan, s, i) + ", step " +
             std::to_string(step) + ": " +
             describe("all-to-all", memberRanks(inst), plan.streams(s).name()) +
             ": " + why +
             " (the step's update ran on the zeros it moved instead)";
    }
  return std::string();
}

} // namespace piper::runtime

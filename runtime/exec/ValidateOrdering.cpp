// Ordering checks of one plan: single writers and recorded events, then a
// simulation of the streams that finds event deadlocks, reads not ordered
// after their write, and unordered cross-stream uses of parameter state.
#include <algorithm>
#include <map>

#include "proto/analysis/StreamOrder.h"
#include "runtime/exec/Validate.h"
#include "runtime/exec/ValidateInternal.h"

namespace piper::runtime::validate {

using plan::Instruction;
using plan::Operand;

using plan::Pos;

Status checkStreamOrdering(const plan::Plan &plan) {
  // Buffers are single-assignment within a step; events are recorded once.
  std::vector<Pos> writer(plan.buffers_size()), recordedAt(plan.num_events());
  std::vector<std::pair<int, Pos>> reads;
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const Instruction &inst = stream.instructions(i);
      for (int id : inst.outputs()) {
        if (writer[id].stream >= 0)
          return Status::error(
              instructionContext(plan, s, i) + ": writes " +
              bufferName(plan, id) + ", already written by " +
              instructionContext(plan, writer[id].stream, writer[id].inst) +
              " (a buffer has one writer per step)");
        writer[id] = {s, i};
      }
      for (int id : inst.inputs())
        reads.push_back({id, {s, i}});
      if (inst.kind() == Instruction::RECORD) {
        Pos &at = recordedAt[inst.event()];
        if (at.stream >= 0)
          return Status::error(
              instructionContext(plan, s, i) + ": records event " +
              std::to_string(inst.event()) + ", already recorded by " +
              instructionContext(plan, at.stream, at.inst));
        at = {s, i};
      }
    }
  }
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const Instruction &inst = stream.instructions(i);
      if (inst.kind() == Instruction::WAIT &&
          recordedAt[inst.event()].stream < 0)
        return Status::error(
            instructionContext(plan, s, i) + ": waits for event " +
            std::to_string(inst.event()) + ", which no instruction records");
    }
  }
  for (auto &[id, at] : reads)
    if (writer[id].stream < 0)
      return Status::error(instructionContext(plan, at.stream, at.inst) +
                           ": reads " + bufferName(plan, id) +
                           ", which no instruction writes");

  // The happens-before order shared with the compiler's memory planner.
  plan::StreamOrder order;
  std::string deadlock;
  if (!plan::StreamOrder::build(plan, order, deadlock))
    return Status::error(deadlock);

  for (auto &[id, at] : reads) {
    Pos w = writer[id];
    if (!order.happensBefore(w, at))
      return Status::error(
          instructionContext(plan, at.stream, at.inst) + ": reads " +
          bufferName(plan, id) + ", written by " +
          instructionContext(plan, w.stream, w.inst) +
          (w.stream == at.stream
               ? ", which comes later in the stream"
               : ", with no RECORD/WAIT ordering the write first"));
  }

  // Persistent state touched from two streams needs an event between the
  // accesses whenever one of them writes, or numerics depend on timing.
  struct Access {
    Pos at;
    bool write;
  };
  std::map<std::pair<int, int>, std::vector<Access>> accesses;
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const Instruction &inst = stream.instructions(i);
      std::map<std::pair<int, int>, bool> touched;
      if (inst.kind() == Instruction::CALL) {
        for (const plan::Kernel &k : plan.segments(inst.segment()).kernels()) {
          for (const Operand &op : k.inputs())
            if (op.kind() != Operand::VALUE)
              touched[{op.index(), op.kind()}] |= false;
          for (const Operand &op : k.outputs())
            if (op.kind() != Operand::VALUE)
              touched[{op.index(), op.kind()}] = true;
        }
      } else if (inst.kind() == Instruction::ALL_REDUCE) {
        for (int p : inst.params())
          touched[{p, Operand::GRAD}] = true;
      } else if (inst.kind() == Instruction::REDUCE_SCATTER_GRADS) {
        for (int p : inst.params())
          touched[{p, Operand::GRAD}] = true;
      } else if (inst.kind() == Instruction::ALL_GATHER_PARAMS) {
        for (int p : inst.params())
          touched[{p, Operand::PARAM}] |= inst.outputs_size() == 0;
      } else if (inst.kind() == Instruction::CLIP_GRADS) {
        for (int p = 0; p < plan.params_size(); ++p)
          touched[{p, Operand::GRAD}] = true;
      }
      for (auto &[key, write] : touched)
        accesses[key].push_back({{s, i}, write});
    }
  }
  for (auto &[key, list] : accesses) {
    for (size_t a = 0; a < list.size(); ++a) {
      for (size_t b = a + 1; b < list.size(); ++b) {
        const Access &x = list[a], &y = list[b];
        if (x.at.stream == y.at.stream || (!x.write && !y.write))
          continue;
        if (order.happensBefore(x.at, y.at) || order.happensBefore(y.at, x.at))
          continue;
        return Status::error(
            instructionContext(plan, y.at.stream, y.at.inst) + " and " +
            instructionContext(plan, x.at.stream, x.at.inst) +
            " both access the " + stateName(key.second) + " of " +
            paramName(plan, key.first) +
            ", at least one writing, with no RECORD/WAIT ordering them");
      }
    }
  }
  return Status::ok();
}

} // namespace piper::runtime::validate

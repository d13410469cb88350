// Vector clocks over a plan's streams and events (see StreamOrder.h).
#include "proto/analysis/StreamOrder.h"

#include <algorithm>

namespace piper::plan {

std::string describePosition(const Plan &plan, Pos pos) {
  if (pos.stream < 0 || pos.stream >= plan.streams_size())
    return "stream " + std::to_string(pos.stream) + " (out of range)";
  const Stream &s = plan.streams(pos.stream);
  std::string label;
  if (pos.inst >= 0 && pos.inst < s.instructions_size()) {
    const Instruction &inst = s.instructions(pos.inst);
    label = inst.label();
    if (label.empty())
      label = Instruction::Kind_IsValid(inst.kind())
                  ? Instruction::Kind_Name(inst.kind())
                  : "kind " + std::to_string(inst.kind());
  }
  return "stream '" + s.name() + "', instruction " + std::to_string(pos.inst) +
         " (" + label + ")";
}

bool StreamOrder::build(const Plan &plan, StreamOrder &order,
                        std::string &error) {
  int numStreams = plan.streams_size();
  int numEvents = std::max(0, plan.num_events());
  order.recorded.assign(numEvents, Pos{});
  for (int s = 0; s < numStreams; ++s) {
    const Stream &stream = plan.streams(s);
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const Instruction &inst = stream.instructions(i);
      if (inst.kind() == Instruction::RECORD && inst.event() >= 0 &&
          inst.event() < numEvents && !order.recorded[inst.event()].valid())
        order.recorded[inst.event()] = {s, i};
    }
  }

  std::vector<int> pc(numStreams, 0);
  std::vector<std::vector<int>> now(numStreams, std::vector<int>(numStreams));
  std::vector<std::vector<int>> eventClock(numEvents);
  std::vector<char> done(numEvents, 0);
  order.clock.assign(numStreams, {});
  for (int s = 0; s < numStreams; ++s)
    order.clock[s].resize(plan.streams(s).instructions_size());

  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < numStreams; ++s) {
      const Stream &stream = plan.streams(s);
      while (pc[s] < stream.instructions_size()) {
        const Instruction &inst = stream.instructions(pc[s]);
        bool hasEvent = inst.event() >= 0 && inst.event() < numEvents;
        if (inst.kind() == Instruction::WAIT && hasEvent) {
          if (!done[inst.event()])
            break;
          for (int t = 0; t < numStreams; ++t)
            now[s][t] = std::max(now[s][t], eventClock[inst.event()][t]);
        }
        order.clock[s][pc[s]] = now[s];
        now[s][s] = ++pc[s];
        if (inst.kind() == Instruction::RECORD && hasEvent) {
          done[inst.event()] = 1;
          eventClock[inst.event()] = now[s];
        }
        progress = true;
      }
    }
  }

  std::string blocked;
  for (int s = 0; s < numStreams; ++s) {
    if (pc[s] == plan.streams(s).instructions_size())
      continue;
    int event = plan.streams(s).instructions(pc[s]).event();
    Pos rec = order.recorded[event];
    blocked += (blocked.empty() ? "" : "; ") + describePosition(plan, {s, pc[s]}) +
               " waits for event " + std::to_string(event) +
               (rec.valid() ? ", recorded by " + describePosition(plan, rec)
                            : ", which no instruction records");
  }
  if (!blocked.empty()) {
    error = "the streams deadlock on events: " + blocked;
    return false;
  }
  return true;
}

} // namespace piper::plan

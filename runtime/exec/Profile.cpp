// The runtime profile table and the step tracer (see Profile.h).
#include "runtime/exec/Profile.h"

#include <algorithm>

namespace piper::runtime {

void Profiler::init(int numStreams) {
  names = {"CALL alloc", "CALL other", "WAIT_SENDS (end of step)",
           "LOSS_ALL_REDUCE (end of step)"};
  kindRow0 = static_cast<int>(names.size());
  const google::protobuf::EnumDescriptor *kinds =
      plan::Instruction::Kind_descriptor();
  int maxKind = 0;
  for (int i = 0; i < kinds->value_count(); ++i)
    maxKind = std::max(maxKind, kinds->value(i)->number());
  for (int k = 0; k <= maxKind; ++k) {
    const google::protobuf::EnumValueDescriptor *v =
        kinds->FindValueByNumber(k);
    names.push_back(v ? v->name() : "kind " + std::to_string(k));
  }
  kernelRow0 = static_cast<int>(names.size());
  for (const std::string &op : kernelNames())
    names.push_back(op);
  slots.assign(std::max(1, numStreams), std::vector<Slot>(names.size()));
}

std::vector<ProfileEntry> Profiler::entries() const {
  std::vector<ProfileEntry> out;
  for (size_t row = 0; row < names.size(); ++row) {
    ProfileEntry e;
    e.name = names[row];
    int64_t nanos = 0;
    for (const std::vector<Slot> &stream : slots) {
      e.count += stream[row].count;
      nanos += stream[row].nanos;
    }
    e.seconds = double(nanos) * 1e-9;
    if (e.count > 0)
      out.push_back(std::move(e));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ProfileEntry &l, const ProfileEntry &r) {
                     return l.seconds > r.seconds;
                   });
  return out;
}

void Profiler::reset() {
  for (std::vector<Slot> &stream : slots)
    std::fill(stream.begin(), stream.end(), Slot{});
}

void StepTracer::init(const plan::Plan &plan, int64_t step) {
  tracedStep = step >= 1 ? step : -1;
  if (tracedStep < 0)
    return;
  recorded.streams.resize(plan.streams_size());
  for (int s = 0; s < plan.streams_size(); ++s)
    recorded.streams[s].resize(plan.streams(s).instructions_size());
  streamEnds.assign(plan.streams_size(), 0);
}

void StepTracer::beginStep() {
  recorded.step = 0;
  for (std::vector<StepTrace::Span> &stream : recorded.streams)
    std::fill(stream.begin(), stream.end(), StepTrace::Span{});
  std::fill(streamEnds.begin(), streamEnds.end(), 0);
  recorded.startNs = steadyNowNs();
}

void StepTracer::endStep(int64_t step) {
  recorded.endNs = recorded.startNs;
  for (int64_t end : streamEnds)
    recorded.endNs = std::max(recorded.endNs, end);
  recorded.step = step;
}

} // namespace piper::runtime

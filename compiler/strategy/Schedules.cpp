// The schedule registry: each pipeline schedule is a pure function from
// (device group, pipeline shape, microbatches) to that group's order of
// (stage, microbatch, pass) slots, emitted as `order` directives. Published
// definitions: GPipe; 1F1B (PipeDream-Flush); Megatron-LM's interleaved
// 1F1B; ZB-H1, ZB-H2 and ZB-V ("Zero Bubble Pipeline Parallelism", Qi et
// al., ICLR 2024); DualPipe and DualPipeV (DeepSeek's DualPipe
// repository). The bubble each gives is checked against its formula by
// test/lit/plan/schedules.test; docs/schedules.md describes them all.
#include "compiler/strategy/Strategy.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <deque>

using namespace mlir::piper;

int64_t mlir::piper::deviceOfStage(StageLayout layout, int64_t stage,
                                   int64_t devices) {
  switch (layout) {
  case StageLayout::Linear:
    return stage;
  case StageLayout::Interleaved:
    return stage % devices;
  case StageLayout::V:
    return stage < devices ? stage : 2 * devices - 1 - stage;
  case StageLayout::Bidirectional:
    return stage;
  }
  return stage;
}

int64_t mlir::piper::deviceOfTask(StageLayout layout, int64_t stage, int64_t mb,
                                  int64_t devices, int64_t microbatches) {
  if (layout == StageLayout::Bidirectional && 2 * mb >= microbatches)
    return devices - 1 - stage;
  return deviceOfStage(layout, stage, devices);
}

namespace {
/// Builds one device group's order slot by slot.
class OrderBuilder {
public:
  void add(int64_t stage, int64_t mb, const char *pass) {
    order.push_back({ScheduledTask{stage, mb, pass}});
  }
  /// An overlap slot: `a` and `b` with no order between them.
  void overlap(ScheduledTask a, ScheduledTask b) {
    order.push_back({std::move(a), std::move(b)});
  }
  DeviceOrder take() { return std::move(order); }

private:
  DeviceOrder order;
};

std::string needStagesPerDevice(int64_t perDevice, int64_t want,
                                const char *layout) {
  if (perDevice == want)
    return "";
  return llvm::formatv("needs {0} stage{1} per device group ({2}), got {3}",
                       want, want == 1 ? "" : "s", layout, perDevice)
      .str();
}

std::string basics(int64_t devices, int64_t perDevice, int64_t microbatches) {
  if (devices < 1 || perDevice < 1 || microbatches < 1)
    return "needs at least one device group, stage and microbatch";
  return "";
}

//===----------------------------------------------------------------------===//
// One stage per device group
//===----------------------------------------------------------------------===//

std::string checkLinear(int64_t devices, int64_t perDevice, int64_t mbs) {
  if (std::string err = basics(devices, perDevice, mbs); !err.empty())
    return err;
  return needStagesPerDevice(perDevice, 1, "one stage each");
}

/// GPipe: every forward, then every backward.
DeviceOrder gpipe(int64_t d, int64_t, int64_t, int64_t mbs) {
  OrderBuilder o;
  for (int64_t m = 0; m < mbs; ++m)
    o.add(d, m, "F");
  for (int64_t m = 0; m < mbs; ++m)
    o.add(d, m, "B");
  return o.take();
}

/// 1F1B: stage d warms up with P-1-d forwards, then alternates one forward
/// and one backward, then drains the backwards.
DeviceOrder oneFOneB(int64_t d, int64_t devices, int64_t, int64_t mbs) {
  OrderBuilder o;
  int64_t warmup = std::min(devices - 1 - d, mbs);
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f)
    o.add(d, f, "F");
  while (f < mbs) {
    o.add(d, f++, "F");
    o.add(d, b++, "B");
  }
  while (b < mbs)
    o.add(d, b++, "B");
  return o.take();
}

/// The zero-bubble handcrafted schedules: `warmup` forwards, then 1F1B over
/// forwards and input gradients (BI), each weight gradient (BW) deferred
/// until `lag` more are pending, the rest drained at the end.
DeviceOrder zeroBubble(int64_t d, int64_t mbs, int64_t warmup, int64_t lag) {
  OrderBuilder o;
  std::deque<int64_t> pending;
  int64_t f = 0, b = 0;
  auto inputGradient = [&] {
    o.add(d, b, "BI");
    pending.push_back(b++);
    while (static_cast<int64_t>(pending.size()) > lag) {
      o.add(d, pending.front(), "BW");
      pending.pop_front();
    }
  };
  for (; f < std::min(warmup, mbs); ++f)
    o.add(d, f, "F");
  for (; f < mbs; ++f) {
    o.add(d, f, "F");
    inputGradient();
  }
  while (b < mbs)
    inputGradient();
  for (int64_t m : pending)
    o.add(d, m, "BW");
  return o.take();
}

/// ZB-H1: 1F1B's warm-up and memory; stage d defers its weight gradients by
/// d, which fills the cool-down: bubble (P-1)(F+B-W).
DeviceOrder zbH1(int64_t d, int64_t devices, int64_t, int64_t mbs) {
  return zeroBubble(d, mbs, devices - 1 - d, d);
}

/// ZB-H2: 2(P-1-d)+1 warm-up forwards fill the warm-up bubble and weight
/// gradients deferred by 2d fill the tail: bubble (P-1)(F+B-2W), with about
/// twice 1F1B's activations.
DeviceOrder zbH2(int64_t d, int64_t devices, int64_t, int64_t mbs) {
  return zeroBubble(d, mbs, 2 * (devices - 1 - d) + 1, 2 * d);
}

std::string checkZbH2(int64_t devices, int64_t perDevice, int64_t mbs) {
  if (std::string err = checkLinear(devices, perDevice, mbs); !err.empty())
    return err;
  if (mbs < 2 * devices - 1)
    return llvm::formatv("needs at least 2P-1 = {0} microbatches to fill its "
                         "warm-up, got {1}",
                         2 * devices - 1, mbs)
        .str();
  return "";
}

//===----------------------------------------------------------------------===//
// Interleaved 1F1B (Megatron-LM)
//===----------------------------------------------------------------------===//

std::string checkInterleaved(int64_t devices, int64_t perDevice, int64_t mbs) {
  if (std::string err = basics(devices, perDevice, mbs); !err.empty())
    return err;
  if (perDevice < 2)
    return llvm::formatv("needs at least 2 stages per device group (virtual "
                         "stages), got {0}",
                         perDevice)
        .str();
  if (mbs % devices != 0)
    return llvm::formatv("needs a multiple of the {0} pipeline device groups "
                         "as microbatches (Megatron's rule), got {1}",
                         devices, mbs)
        .str();
  return "";
}

/// Device group d holds stages d, d+P, ...; microbatches go through its
/// stages in rounds of P. Warm-up: 2(P-1-d) + (v-1)P forwards; then one
/// forward and one backward in turn; backwards visit the stages in reverse.
DeviceOrder interleaved(int64_t d, int64_t devices, int64_t v, int64_t mbs) {
  OrderBuilder o;
  int64_t round = devices * v, total = mbs * v;
  auto task = [&](int64_t k, bool forward) {
    int64_t r = k % round, chunk = r / devices;
    if (!forward)
      chunk = v - 1 - chunk;
    return std::make_pair(chunk * devices + d,
                          (k / round) * devices + r % devices);
  };
  int64_t warmup = std::min(2 * (devices - 1 - d) + (v - 1) * devices, total);
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f) {
    auto [s, m] = task(f, true);
    o.add(s, m, "F");
  }
  for (; f < total; ++f, ++b) {
    auto [s, m] = task(f, true);
    o.add(s, m, "F");
    auto [bs, bm] = task(b, false);
    o.add(bs, bm, "B");
  }
  for (; b < total; ++b) {
    auto [s, m] = task(b, false);
    o.add(s, m, "B");
  }
  return o.take();
}

//===----------------------------------------------------------------------===//
// V layout: device group d holds stages d and 2P-1-d
//===----------------------------------------------------------------------===//

std::string checkV(int64_t devices, int64_t perDevice, int64_t mbs,
                   int64_t minimum, const char *why) {
  if (std::string err = basics(devices, perDevice, mbs); !err.empty())
    return err;
  if (std::string err =
          needStagesPerDevice(perDevice, 2, "the V layout: d and 2P-1-d");
      !err.empty())
    return err;
  if (mbs < minimum)
    return llvm::formatv("needs at least {0} microbatches ({1}), got {2}",
                         minimum, why, mbs)
        .str();
  return "";
}

std::string checkZbv(int64_t devices, int64_t perDevice, int64_t mbs) {
  return checkV(devices, perDevice, mbs, 2 * devices - 1, "2P-1");
}

/// ZB-V (as in PyTorch's ScheduleZBVZeroBubble): forwards of the first
/// stage fill the warm-up, the second stage's forwards come back up, then
/// both stages run F, BI, BW in turn; weight gradients drain at the end.
DeviceOrder zbv(int64_t d, int64_t devices, int64_t, int64_t mbs) {
  OrderBuilder o;
  int64_t s0 = d, s1 = 2 * devices - 1 - d;
  int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  for (int64_t i = 0; i < 2 * (devices - d) - 1; ++i)
    o.add(s0, f0++, "F");
  for (int64_t i = 0; i < d; ++i) {
    o.add(s1, f1++, "F");
    o.add(s0, f0++, "F");
  }
  for (int64_t i = 0; i < devices - d; ++i) {
    o.add(s1, f1++, "F");
    o.add(s1, b1, "BI");
    o.add(s1, b1++, "BW");
  }
  while (f1 < f0 || f0 < mbs) {
    if (f0 < mbs)
      o.add(s0, f0++, "F");
    o.add(s0, b0, "BI");
    o.add(s0, b0++, "BW");
    o.add(s1, f1++, "F");
    o.add(s1, b1, "BI");
    o.add(s1, b1++, "BW");
  }
  int64_t w0 = b0, w1 = b1;
  for (int64_t i = 0; i < d; ++i) {
    o.add(s0, b0++, "BI");
    o.add(s1, b1++, "BI");
  }
  for (int64_t i = 0; i < devices - d; ++i) {
    o.add(s0, b0++, "BI");
    o.add(s0, w0++, "BW");
  }
  while (w1 < b1)
    o.add(s1, w1++, "BW");
  while (w0 < b0)
    o.add(s0, w0++, "BW");
  return o.take();
}

std::string checkDualPipeV(int64_t devices, int64_t perDevice, int64_t mbs) {
  return checkV(devices, perDevice, mbs, 2 * devices, "2P");
}

/// DeepSeek's DualPipe schedule of one rank, phase by phase (dualpipe.py
/// and dualpipev.py share it): rank `r` of a pipeline of `n` ranks runs
/// `chunks` microbatches in each of two phases; phase p is stage[p] over
/// microbatches offset[p], offset[p]+1, ... Forward warm-up of phase 0,
/// then both phases, then phase 1's backward with split weight gradients;
/// the main loop overlaps a forward of one phase with a backward of the
/// other in one slot; the tail splits half of the backwards into BI and BW
/// to fill the cool-down. `middle`: the rank where the two directions meet,
/// which does not overlap its first pair.
DeviceOrder dualPipeOrder(int64_t r, int64_t n, int64_t chunks,
                          const int64_t stage[2], const int64_t offset[2],
                          bool middle) {
  OrderBuilder o;
  int64_t f[2] = {0, 0}, b[2] = {0, 0};
  std::deque<std::pair<int64_t, int64_t>> weights; // (stage, microbatch)
  auto forward = [&](int p) { o.add(stage[p], offset[p] + f[p]++, "F"); };
  auto backward = [&](int p, bool split) {
    int64_t mb = offset[p] + b[p]++;
    if (!split) {
      o.add(stage[p], mb, "B");
      return;
    }
    o.add(stage[p], mb, "BI");
    weights.push_back({stage[p], mb});
  };
  auto weight = [&] {
    auto [s, m] = weights.front();
    weights.pop_front();
    o.add(s, m, "BW");
  };
  auto forwardBackward = [&](int pf, int pb) {
    o.overlap(ScheduledTask{stage[pf], offset[pf] + f[pf]++, "F"},
              ScheduledTask{stage[pb], offset[pb] + b[pb]++, "B"});
  };
  int64_t last = n - 1;
  for (int64_t i = 0; i < 2 * (last - r); ++i) // 1: nF0
    forward(0);
  for (int64_t i = 0; i < r + 1; ++i) { // 2: nF0F1
    forward(0);
    forward(1);
  }
  for (int64_t i = 0; i < last - r; ++i) { // 3: nB1W1F1
    backward(1, true);
    weight();
    forward(1);
  }
  for (int64_t i = 0; i < chunks - 2 * n + r + 1; ++i) { // 4: nF0B1F1B0
    if (i == 0 && middle) {
      forward(0); // not overlapped where the directions meet
      backward(1, false);
    } else {
      forwardBackward(0, 1);
    }
    forwardBackward(1, 0);
  }
  for (int64_t i = 0; i < last - r; ++i) { // 5: nB1F1B0
    backward(1, false);
    forwardBackward(1, 0);
  }
  bool split = false; // 6: nB1B0, the second half split
  for (int64_t i = 0; i < r + 1; ++i) {
    if (i == (r + 1) / 2 && r % 2 == 1)
      split = true;
    backward(1, split);
    if (i == (r + 1) / 2 && r % 2 == 0)
      split = true;
    backward(0, split);
  }
  for (int64_t i = 0; i < last - r; ++i) { // 7: nWB0
    weight();
    backward(0, true);
  }
  while (!weights.empty()) // 8: nW
    weight();
  return o.take();
}

/// DualPipeV: the V of device group d (stages d and 2P-1-d) as the two
/// phases, every microbatch through both.
DeviceOrder dualPipeV(int64_t d, int64_t devices, int64_t, int64_t mbs) {
  const int64_t stage[2] = {d, 2 * devices - 1 - d}, offset[2] = {0, 0};
  return dualPipeOrder(d, devices, mbs, stage, offset, d == devices - 1);
}

std::string checkDualPipe(int64_t devices, int64_t perDevice, int64_t mbs) {
  if (std::string err = basics(devices, perDevice, mbs); !err.empty())
    return err;
  if (std::string err = needStagesPerDevice(
          perDevice, 1, "two copies of the model, stage s on s and P-1-s");
      !err.empty())
    return err;
  if (devices % 2 != 0)
    return llvm::formatv("needs an even number of pipeline device groups, "
                         "got {0}",
                         devices)
        .str();
  if (mbs % 2 != 0 || mbs < 2 * devices)
    return llvm::formatv("needs an even number of at least 2P = {0} "
                         "microbatches (half go each way), got {1}",
                         2 * devices, mbs)
        .str();
  return "";
}

/// DualPipe: the first half of the microbatches flows from group 0 to group
/// P-1 through one copy of the model, the second half back through the
/// other. On group d the phase that starts nearer is phase 0.
DeviceOrder dualPipe(int64_t d, int64_t devices, int64_t, int64_t mbs) {
  int64_t half = devices / 2, r = std::min(d, devices - 1 - d);
  int64_t down = d, up = devices - 1 - d, upOffset = mbs / 2;
  int64_t stage[2], offset[2];
  if (d < half) {
    stage[0] = down, offset[0] = 0, stage[1] = up, offset[1] = upOffset;
  } else {
    stage[0] = up, offset[0] = upOffset, stage[1] = down, offset[1] = 0;
  }
  return dualPipeOrder(r, half, mbs / 2, stage, offset, r == half - 1);
}

} // namespace

llvm::ArrayRef<ScheduleBuilder> mlir::piper::getScheduleBuilders() {
  static const ScheduleBuilder builders[] = {
      {"gpipe", "every forward, then every backward (GPipe)",
       StageLayout::Linear, "any", checkLinear, gpipe},
      {"1f1b",
       "warm-up forwards, then one forward and one backward in turn "
       "(PipeDream-Flush)",
       StageLayout::Linear, "any", checkLinear, oneFOneB},
      {"interleaved-1f1b",
       "1F1B over v stages per device group, in rounds of P microbatches "
       "(Megatron-LM)",
       StageLayout::Interleaved, "v >= 2; microbatches a multiple of P",
       checkInterleaved, interleaved},
      {"zb-h1",
       "1F1B with split backward, weight gradients deferred into the "
       "cool-down (zero bubble ZB-H1)",
       StageLayout::Linear, "any", checkLinear, zbH1},
      {"zb-h2",
       "more warm-up forwards and deferred weight gradients: no bubble "
       "inside the pipeline when F+B = 2W (zero bubble ZB-H2)",
       StageLayout::Linear, "microbatches >= 2P-1", checkZbH2, zbH2},
      {"zbv", "zero bubble on the V layout (ZB-V)", StageLayout::V,
       "microbatches >= 2P-1", checkZbv, zbv},
      {"dualpipe",
       "DeepSeek's DualPipe: two copies of the model fed from both ends, "
       "overlapped forward/backward slots, the copies' gradients summed",
       StageLayout::Bidirectional, "P even; microbatches even, >= 2P",
       checkDualPipe, dualPipe},
      {"dualpipev",
       "DeepSeek's DualPipeV: DualPipe folded onto the two stages of a V, "
       "one copy of the model",
       StageLayout::V, "microbatches >= 2P", checkDualPipeV, dualPipeV},
  };
  return builders;
}

const ScheduleBuilder *mlir::piper::findSchedule(llvm::StringRef name) {
  for (const ScheduleBuilder &b : getScheduleBuilders())
    if (b.name == name)
      return &b;
  return nullptr;
}

std::string mlir::piper::scheduleNames() {
  return llvm::join(
      llvm::map_range(getScheduleBuilders(),
                      [](const ScheduleBuilder &b) { return b.name; }),
      ", ");
}

static llvm::StringRef layoutName(StageLayout layout) {
  switch (layout) {
  case StageLayout::Linear:
    return "linear";
  case StageLayout::Interleaved:
    return "interleaved";
  case StageLayout::V:
    return "V";
  case StageLayout::Bidirectional:
    return "both ways";
  }
  return "";
}

std::string mlir::piper::formatScheduleTable() {
  std::string out = llvm::formatv("{0,-17} {1,-12} {2,-37} {3}\n", "schedule",
                                  "layout", "needs", "what")
                        .str();
  for (const ScheduleBuilder &b : getScheduleBuilders())
    out += llvm::formatv("{0,-17} {1,-12} {2,-37} {3}\n", b.name,
                         layoutName(b.layout), b.needs, b.summary)
               .str();
  return out;
}

int64_t mlir::piper::defaultStagesPerDevice(const ScheduleBuilder &schedule) {
  return schedule.layout == StageLayout::V ||
                 schedule.layout == StageLayout::Interleaved
             ? 2
             : 1;
}

static Filter taskFilter(const ScheduledTask &t) {
  Filter f;
  f.entries["PP"] = {FilterValue::Index, t.stage, ""};
  f.entries["MB"] = {FilterValue::Index, t.mb, ""};
  f.entries["PASS"] = {FilterValue::Pass, 0, t.pass};
  return f;
}

std::vector<Directive>
mlir::piper::buildSchedule(const ScheduleBuilder &schedule, int64_t devices,
                           int64_t perDevice, int64_t microbatches) {
  std::vector<Directive> out;
  for (int64_t g = 0; g < devices; ++g) {
    OrderOptions order;
    for (const ScheduleSlot &slot :
         schedule.build(g, devices, perDevice, microbatches)) {
      std::vector<Filter> group;
      for (const ScheduledTask &t : slot)
        group.push_back(taskFilter(t));
      order.groups.push_back(std::move(group));
    }
    out.emplace_back(std::move(order),
                     llvm::formatv("order: {0} schedule of pipeline group {1}",
                                   schedule.name, g)
                         .str());
  }
  return out;
}

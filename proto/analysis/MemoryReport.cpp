// Reading a plan's memory plan: the text report of piper-plan --memory, the
// step's peak, and whether a plan fits a device (see MemoryPlan.h).
#include <algorithm>
#include <numeric>
#include <sstream>

#include "proto/analysis/MemoryPlan.h"

namespace piper::plan {

bool memoryReport(const Plan &plan, int largest, std::string &text,
                  const StorageBytes *sizes) {
  // Plans written before schema 2 carry no memory plan: lay one out here.
  Plan planned;
  const Plan *use = &plan;
  if (plan.arena_bytes() == 0) {
    planned = plan;
    if (!assignArena(planned, text))
      return false;
    use = &planned;
  }
  std::string error;
  if (!checkArena(*use, error, sizes ? &sizes->values : nullptr,
                  sizes ? &sizes->copies : nullptr)) {
    text = "invalid memory plan: " + error;
    return false;
  }
  StepBlocks step = stepBlocks(*use, /*recordedScratch=*/true);
  std::vector<int64_t> offsets = recordedOffsets(*use, step, 0);
  const std::vector<Block> &blocks = step.blocks;
  int buffers = use->buffers_size();
  int64_t summed = 0;
  for (const Block &b : blocks)
    summed += b.bytes;
  int64_t state = use->state_bytes(), arena = use->arena_bytes();
  std::ostringstream os;
  os << "memory class " << use->device_class() << ": arena " << arena
     << " bytes = state " << state << " + step " << arena - state << " ("
     << buffers << " buffers and " << blocks.size() - buffers
     << " scratch and staging areas, " << summed
     << " bytes if none shared); compiler estimate "
     << use->predicted_peak_bytes() << "\n";
  std::vector<int> bySize(blocks.size());
  std::iota(bySize.begin(), bySize.end(), 0);
  std::stable_sort(bySize.begin(), bySize.end(), [&](int a, int b) {
    return blocks[a].bytes > blocks[b].bytes;
  });
  for (int i = 0; i < largest && i < static_cast<int>(bySize.size()); ++i) {
    const Block &b = blocks[bySize[i]];
    os << "  offset " << offsets[bySize[i]] << ": " << b.bytes << " bytes, "
       << b.name << "\n";
  }
  // What may be live at the step's peak kernel call: the arena's step part
  // is at least this (more where the packing leaves gaps).
  StreamOrder order;
  std::string ignored;
  if (StreamOrder::build(*use, order, ignored)) {
    PeakPoint peak = findPeak(*use, order, blocks, /*callsOnly=*/true);
    if (peak.at.valid()) {
      os << "peak: " << peak.bytes << " bytes live at "
         << describePosition(*use, peak.at) << " (" << peak.blocks.size()
         << " blocks)\n";
      for (int i = 0; i < largest && i < static_cast<int>(peak.blocks.size());
           ++i) {
        const Block &b = blocks[peak.blocks[i]];
        os << "  live: " << b.bytes << " bytes, " << b.name << "\n";
      }
    }
  }
  text = os.str();
  return true;
}

namespace {

/// "512 B", "28.5 KiB", "3.4 MiB", "1.25 GiB".
std::string mib(int64_t bytes) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  double b = static_cast<double>(bytes);
  if (bytes < 1024) {
    os << bytes << " B";
  } else if (b < 1024.0 * 1024.0) {
    os.precision(1);
    os << b / 1024.0 << " KiB";
  } else if (b < 1024.0 * 1024.0 * 1024.0) {
    os.precision(1);
    os << b / (1024.0 * 1024.0) << " MiB";
  } else {
    os.precision(2);
    os << b / (1024.0 * 1024.0 * 1024.0) << " GiB";
  }
  return os.str();
}

/// Block `b` may hold live data while instruction `x` runs: it is defined
/// at or before `x` (not after it) and not every access of it is done.
bool liveAt(const Block &b, Pos x, const StreamOrder &order) {
  if (b.accesses.empty())
    return false;
  const Pos &def = b.accesses.front();
  if (!(def == x) && order.happensBefore(x, def))
    return false;
  if (b.untilStepEnd)
    return true;
  for (const Pos &a : b.accesses)
    if (a == x || !order.happensBefore(a, x))
      return true;
  return false;
}

} // namespace

PeakPoint findPeak(const Plan &plan, const StreamOrder &order,
                   const std::vector<Block> &blocks, bool callsOnly) {
  // On one stream, "may be live at instruction i" (liveAt) holds on an
  // interval of i: an instruction that happens before the definition is
  // followed on its stream only by more such instructions, and once every
  // access happens before an instruction it does before all later ones.
  // So each block adds its bytes to [born, dies) of each stream, found by
  // binary search, and one prefix sum per stream gives the live bytes at
  // every instruction: O(blocks * streams * (streams + log n)).
  auto firstTrue = [](int lo, int hi, auto pred) {
    while (lo < hi) {
      int mid = lo + (hi - lo) / 2;
      if (pred(mid))
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  };
  PeakPoint peak;
  std::vector<int> last;
  for (int s = 0; s < plan.streams_size(); ++s) {
    int len = plan.streams(s).instructions_size();
    std::vector<int64_t> delta(static_cast<size_t>(len) + 1, 0);
    for (const Block &b : blocks) {
      if (b.accesses.empty() || b.bytes == 0)
        continue;
      const Pos &def = b.accesses.front();
      int born = firstTrue(0, len, [&](int i) {
        Pos x{s, i};
        return x == def || !order.happensBefore(x, def);
      });
      int dies = len;
      if (!b.untilStepEnd) {
        dies = born;
        for (const Pos &a : b.accesses)
          if (a.stream == s)
            dies = std::max(dies, a.inst + 1);
        for (const Pos &a : b.accesses)
          if (a.stream != s && dies < len)
            dies = firstTrue(dies, len, [&](int i) {
              return order.happensBefore(a, Pos{s, i});
            });
      }
      if (born < dies) {
        delta[born] += b.bytes;
        delta[dies] -= b.bytes;
      }
    }
    int64_t bytes = 0;
    for (int i = 0; i < len; ++i) {
      bytes += delta[i];
      if (callsOnly &&
          plan.streams(s).instructions(i).kind() != Instruction::CALL)
        continue;
      if (bytes > peak.bytes) {
        peak.bytes = bytes;
        peak.at = Pos{s, i};
      }
    }
  }
  if (!peak.at.valid())
    return peak;
  for (int b = 0; b < static_cast<int>(blocks.size()); ++b)
    if (liveAt(blocks[b], peak.at, order))
      peak.blocks.push_back(b);
  std::stable_sort(peak.blocks.begin(), peak.blocks.end(), [&](int a, int b) {
    return blocks[a].bytes > blocks[b].bytes;
  });
  return peak;
}

namespace {

/// "ranks 4, 5 (device class 0)".
std::string describeRanks(const Plan &plan) {
  std::ostringstream os;
  os << "rank" << (plan.ranks_size() > 1 ? "s " : " ");
  for (int i = 0; i < plan.ranks_size(); ++i)
    os << (i ? ", " : "") << plan.ranks(i);
  os << " (device class " << plan.device_class() << ")";
  return os.str();
}

/// "480 B (state 256 B, step 224 B)".
std::string describeNeed(const Plan &plan) {
  return mib(plan.arena_bytes()) + " (state " + mib(plan.state_bytes()) +
         ", step " + mib(plan.arena_bytes() - plan.state_bytes()) + ")";
}

} // namespace

std::string fitVerdict(const Plan &plan, int64_t deviceBytes, bool &fits) {
  std::string error;
  fits = checkFits(plan, deviceBytes, error);
  if (!fits)
    return error;
  return describeRanks(plan) + (plan.ranks_size() > 1 ? " fit" : " fits") +
         ": need " + describeNeed(plan) + " of " + mib(deviceBytes) + ", " +
         mib(deviceBytes - plan.arena_bytes()) + " to spare";
}

bool checkFits(const Plan &plan, int64_t deviceBytes, std::string &error) {
  if (plan.arena_bytes() <= deviceBytes)
    return true;
  std::ostringstream os;
  os << describeRanks(plan) << " need" << (plan.ranks_size() > 1 ? " " : "s ")
     << describeNeed(plan) << " but the device has " << mib(deviceBytes);
  StreamOrder order;
  std::string ignored;
  if (StreamOrder::build(plan, order, ignored)) {
    StepBlocks step = stepBlocks(plan, /*recordedScratch=*/true);
    // At a kernel call: a wait on a loosely ordered stream would count
    // nearly every block as possibly live (findPeak).
    PeakPoint peak = findPeak(plan, order, step.blocks, /*callsOnly=*/true);
    if (peak.at.valid()) {
      os << "; the step peaks at " << describePosition(plan, peak.at)
         << " with " << mib(peak.bytes) << " live, the largest:";
      for (size_t i = 0; i < peak.blocks.size() && i < 3; ++i) {
        const Block &b = step.blocks[peak.blocks[i]];
        os << (i ? "," : "") << " " << b.name << " " << mib(b.bytes);
      }
    }
  }
  error = os.str();
  return false;
}

} // namespace piper::plan

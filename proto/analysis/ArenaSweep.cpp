// The arena layout of a step's blocks from their lifetimes, in one sweep
// over the step (packBlocks), and its check (verifyLayout); see
// MemoryPlan.h. The plan-level memory plan is in MemoryPlan.cpp.
#include "proto/analysis/MemoryPlan.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>

namespace piper::plan {

namespace {

/// Where a block's lifetime starts and ends, as seen by each stream. A block
/// is defined at accesses[0]; it dies for stream t at the first instruction
/// of t that every access of the block happens before (a block defined there
/// or later may reuse its bytes; one defined earlier may not). Blocks
/// without accesses are defined before everything; neither they nor blocks
/// live until the step ends ever die.
struct LifetimeEvent {
  int64_t rank; // StreamOrder::rank of the instruction
  int kind;     // 0: the block dies for `stream`, 1: it is defined on it
  int stream, inst, block;
  bool operator<(const LifetimeEvent &o) const {
    return std::tie(rank, kind, stream, inst, block) <
           std::tie(o.rank, o.kind, o.stream, o.inst, o.block);
  }
};

/// Every block's events in one execution order of the step, deaths before
/// definitions at the same instruction. Stream t is only ever asked about
/// its own instructions, in program order, so a sweep over these events
/// sees, at each definition on t, exactly the blocks placed before it that
/// have not died for t: the blocks it interferes with that are already
/// placed (see interfere). O(n s^2 log m) for n blocks, s streams, m
/// instructions a stream.
std::vector<LifetimeEvent> lifetimeEvents(const std::vector<Block> &blocks,
                                          const StreamOrder &order,
                                          int numStreams) {
  auto length = [&](int t) {
    return t < order.numStreams() ? order.numInstructions(t) : 0;
  };
  std::vector<LifetimeEvent> events;
  events.reserve(blocks.size() * 2);
  std::vector<int> last(numStreams);
  for (int b = 0; b < static_cast<int>(blocks.size()); ++b) {
    const Block &block = blocks[b];
    if (block.accesses.empty()) {
      events.push_back({-1, 1, -1, -1, b});
      continue;
    }
    const Pos &def = block.accesses.front();
    events.push_back({order.rank(def), 1, def.stream, def.inst, b});
    if (block.untilStepEnd)
      continue;
    std::fill(last.begin(), last.end(), -1);
    for (const Pos &p : block.accesses)
      last[p.stream] = std::max(last[p.stream], p.inst);
    for (int t = 0; t < numStreams; ++t) {
      int dies = 0, len = length(t);
      for (int u = 0; u < numStreams && dies < len; ++u) {
        if (last[u] < 0)
          continue;
        if (u == t) {
          dies = std::max(dies, last[u] + 1);
          continue;
        }
        // Once an instruction of t follows the access, all later ones do.
        Pos access{u, last[u]};
        int lo = dies, hi = len;
        while (lo < hi) {
          int mid = lo + (hi - lo) / 2;
          if (order.happensBefore(access, Pos{t, mid}))
            hi = mid;
          else
            lo = mid + 1;
        }
        dies = lo;
      }
      if (dies < len)
        events.push_back({order.rank(Pos{t, dies}), 0, t, dies, b});
    }
  }
  std::sort(events.begin(), events.end());
  return events;
}

int streamsOf(const std::vector<Block> &blocks, const StreamOrder &order) {
  int numStreams = order.numStreams();
  for (const Block &b : blocks)
    for (const Pos &p : b.accesses)
      numStreams = std::max(numStreams, p.stream + 1);
  return numStreams;
}

/// The bytes of the arena one stream must not use at the current point of
/// the sweep: those of the blocks placed so far that have not died for it.
/// Blocks may overlap here (two blocks may share bytes once one has died
/// for the other's stream, while both are still live for this one), so it
/// counts the blocks over each byte, and keeps the uncovered runs below the
/// top as gaps, by offset and by size for best-fit lookup. Every operation
/// is O(log n) plus the runs it touches.
class Occupancy {
public:
  Occupancy() { cover.emplace(0, 0); }

  /// The start of the smallest gap that holds `size` bytes (the lowest of
  /// equal ones), or the top of the covered bytes when none does.
  int64_t bestFit(int64_t size) const {
    auto it = bySize.lower_bound({size, INT64_MIN});
    return it != bySize.end() ? it->second : top;
  }
  /// Whether no block covers a byte of [begin, end).
  bool isFree(int64_t begin, int64_t end) const {
    auto it = std::prev(cover.upper_bound(begin));
    if (it->second != 0)
      return false;
    auto next = std::next(it);
    return next == cover.end() || next->first >= end;
  }
  /// The top: every byte from here up is free.
  int64_t end() const { return top; }

  void add(int64_t begin, int64_t end) { update(begin, end, +1); }
  void remove(int64_t begin, int64_t end) { update(begin, end, -1); }

private:
  using Runs = std::map<int64_t, int>;

  /// Splits the run holding `x` so that one starts at `x`.
  Runs::iterator split(int64_t x) {
    auto it = std::prev(cover.upper_bound(x));
    if (it->first == x)
      return it;
    return cover.emplace_hint(std::next(it), x, it->second);
  }
  /// Merges the run at `it` into the one before it when their counts match.
  void coalesce(Runs::iterator it) {
    if (it != cover.begin() && std::prev(it)->second == it->second)
      cover.erase(it);
  }

  void addGap(int64_t begin, int64_t end) {
    gaps.emplace(begin, end);
    bySize.emplace(end - begin, begin);
  }
  void eraseGap(std::map<int64_t, int64_t>::iterator g) {
    bySize.erase({g->second - g->first, g->first});
    gaps.erase(g);
  }
  /// [begin, end) was free and is now covered.
  void take(int64_t begin, int64_t end) {
    if (begin >= top) {
      if (begin > top)
        addGap(top, begin);
      top = end;
      return;
    }
    auto g = std::prev(gaps.upper_bound(begin)); // the gap holding begin
    int64_t gapBegin = g->first, gapEnd = g->second;
    eraseGap(g);
    if (gapBegin < begin)
      addGap(gapBegin, begin);
    if (end < gapEnd)
      addGap(end, gapEnd);
  }
  /// [begin, end) was covered and is now free.
  void release(int64_t begin, int64_t end) {
    auto next = gaps.find(end);
    if (next != gaps.end()) {
      end = next->second;
      eraseGap(next);
    }
    auto prev = gaps.lower_bound(begin);
    if (prev != gaps.begin() && std::prev(prev)->second == begin) {
      --prev;
      begin = prev->first;
      eraseGap(prev);
    }
    if (end == top)
      top = begin;
    else
      addGap(begin, end);
  }

  void update(int64_t begin, int64_t end, int delta) {
    if (begin >= end)
      return;
    auto first = split(begin);
    auto last = split(end);
    for (auto it = first; it != last; ++it) {
      int64_t runEnd = std::next(it)->first;
      if (delta > 0 && it->second == 0)
        take(it->first, runEnd);
      it->second += delta;
      if (delta < 0 && it->second == 0)
        release(it->first, runEnd);
    }
    coalesce(last);
    coalesce(first);
  }

  Runs cover;                      // run start -> blocks over the run
  std::map<int64_t, int64_t> gaps; // free runs below top: begin -> end
  std::set<std::pair<int64_t, int64_t>> bySize; // gaps as (size, begin)
  int64_t top = 0;
};

} // namespace

ArenaLayout packBlocks(const std::vector<Block> &blocks,
                       const StreamOrder &order, int64_t alignment) {
  int numStreams = streamsOf(blocks, order);
  std::vector<Occupancy> views(std::max(numStreams, 1));
  ArenaLayout layout;
  layout.offsets.assign(blocks.size(), -1);
  // Every block takes whole aligned units, at least one, so gaps stay
  // aligned.
  auto units = [&](int b) {
    return alignUp(std::max<int64_t>(blocks[b].bytes, 1), alignment);
  };
  for (const LifetimeEvent &e : lifetimeEvents(blocks, order, numStreams)) {
    int b = e.block;
    if (e.kind == 0) {
      views[e.stream].remove(layout.offsets[b], layout.offsets[b] + units(b));
      continue;
    }
    int64_t at = 0;
    if (e.stream >= 0) {
      at = views[e.stream].bestFit(units(b));
    } else { // live everywhere, all the time
      for (const Occupancy &v : views)
        at = std::max(at, v.end());
    }
    layout.offsets[b] = at;
    layout.bytes = std::max(layout.bytes, at + blocks[b].bytes);
    for (Occupancy &v : views)
      v.add(at, at + units(b));
  }
  return layout;
}

bool verifyLayout(const std::vector<Block> &blocks, const ArenaLayout &layout,
                  const StreamOrder &order, int64_t alignment,
                  std::string &error) {
  if (layout.offsets.size() != blocks.size()) {
    error = std::to_string(layout.offsets.size()) + " offsets for " +
            std::to_string(blocks.size()) + " blocks";
    return false;
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    int64_t off = layout.offsets[i];
    if (off < 0 || off % alignment != 0 || blocks[i].bytes < 0 ||
        off + blocks[i].bytes > layout.bytes) {
      error = blocks[i].name + " at offset " + std::to_string(off) + " (" +
              std::to_string(blocks[i].bytes) +
              " bytes) is misaligned or outside the arena of " +
              std::to_string(layout.bytes) + " bytes";
      return false;
    }
  }
  // The sweep packBlocks places blocks with: at each definition, the bytes
  // of the block must be free in its stream's view. Empty blocks take none.
  int numStreams = streamsOf(blocks, order);
  std::vector<Occupancy> views(std::max(numStreams, 1));
  auto range = [&](int b) {
    return std::make_pair(layout.offsets[b],
                          layout.offsets[b] + blocks[b].bytes);
  };
  for (const LifetimeEvent &e : lifetimeEvents(blocks, order, numStreams)) {
    int b = e.block;
    auto [begin, end] = range(b);
    if (begin == end)
      continue;
    if (e.kind == 0) {
      views[e.stream].remove(begin, end);
      continue;
    }
    if (!views[std::max(e.stream, 0)].isFree(begin, end)) {
      // Name the culprit: a block placed before that overlaps this one.
      for (int a = 0; a < static_cast<int>(blocks.size()); ++a) {
        auto [aBegin, aEnd] = range(a);
        if (a == b || aBegin == aEnd || aBegin >= end || begin >= aEnd ||
            !interfere(blocks[a], blocks[b], order))
          continue;
        int lo = a, hi = b;
        if (std::make_pair(begin, b) < std::make_pair(aBegin, a))
          std::swap(lo, hi);
        error = blocks[lo].name + " and " + blocks[hi].name +
                " share bytes at offset " + std::to_string(layout.offsets[hi]) +
                " but may be live at the same time";
        return false;
      }
      error = blocks[b].name + " shares bytes with a block that may be live "
                               "at the same time";
      return false;
    }
    for (Occupancy &v : views)
      v.add(begin, end);
  }
  return true;
}

} // namespace piper::plan

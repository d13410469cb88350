// Arena layout from lifetimes: the planner and the checker (see MemoryPlan.h).
#include "proto/analysis/MemoryPlan.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

namespace piper::plan {
namespace {

int64_t alignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/// First-fit packing of `sizes`, largest first, where `conflict(i, j)` says
/// that blocks i and j may not share bytes.
template <typename Conflict>
ArenaLayout pack(const std::vector<int64_t> &sizes, int64_t alignment,
                 const Conflict &conflict) {
  int n = static_cast<int>(sizes.size());
  std::vector<int> byId(n);
  std::iota(byId.begin(), byId.end(), 0);
  std::stable_sort(byId.begin(), byId.end(),
                   [&](int a, int b) { return sizes[a] > sizes[b]; });
  ArenaLayout layout;
  layout.offsets.assign(n, -1);
  std::vector<int> placed;
  std::vector<std::pair<int64_t, int64_t>> taken; // [begin, end)
  for (int i : byId) {
    int64_t size = alignUp(std::max<int64_t>(sizes[i], 1), alignment);
    taken.clear();
    for (int j : placed)
      if (conflict(i, j))
        taken.emplace_back(layout.offsets[j],
                           layout.offsets[j] + std::max<int64_t>(sizes[j], 1));
    std::sort(taken.begin(), taken.end());
    int64_t at = 0;
    for (auto [begin, end] : taken) {
      if (at + size <= begin)
        break;
      at = std::max(at, alignUp(end, alignment));
    }
    layout.offsets[i] = at;
    layout.bytes = std::max(layout.bytes, at + sizes[i]);
    placed.push_back(i);
  }
  return layout;
}

} // namespace

bool endsBefore(const Block &a, const Block &b, const StreamOrder &order) {
  if (a.untilStepEnd || a.accesses.empty() || b.accesses.empty())
    return false;
  const Pos &def = b.accesses.front();
  for (const Pos &x : a.accesses)
    if (!order.happensBefore(x, def))
      return false;
  return true;
}

namespace {

/// A block's lifetime reduced to what endsBefore needs, so that the
/// pairwise test costs O(streams), not O(accesses): its definition and, per
/// stream, the last instruction that touches it (-1: none).
class Lifetimes {
public:
  Lifetimes(const std::vector<Block> &blocks, const StreamOrder &order)
      : order(order) {
    int streams = 0;
    for (const Block &b : blocks)
      for (const Pos &p : b.accesses)
        streams = std::max(streams, p.stream + 1);
    numStreams = streams;
    def.resize(blocks.size());
    open.resize(blocks.size());
    last.assign(blocks.size() * static_cast<size_t>(streams), -1);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const Block &b = blocks[i];
      open[i] = b.untilStepEnd || b.accesses.empty();
      if (b.accesses.empty())
        continue;
      def[i] = b.accesses.front();
      for (const Pos &p : b.accesses) {
        int &l = last[i * streams + p.stream];
        l = std::max(l, p.inst);
      }
    }
  }
  /// Every access of block a happens before block b is defined.
  bool endsBefore(size_t a, size_t b) const {
    if (open[a] || !def[b].valid())
      return false;
    const int *l = &last[a * numStreams];
    for (int t = 0; t < numStreams; ++t)
      if (l[t] >= 0 && !order.happensBefore(Pos{t, l[t]}, def[b]))
        return false;
    return true;
  }
  bool interfere(size_t a, size_t b) const {
    return !endsBefore(a, b) && !endsBefore(b, a);
  }

private:
  const StreamOrder &order;
  int numStreams = 0;
  std::vector<Pos> def;
  std::vector<char> open;
  std::vector<int> last; // [block * numStreams + stream]
};

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
      Lifetimes lives(blocks, order);
      for (int a = 0; a < static_cast<int>(blocks.size()); ++a) {
        auto [aBegin, aEnd] = range(a);
        if (a == b || aBegin == aEnd || aBegin >= end || begin >= aEnd ||
            !lives.interfere(a, b))
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

int64_t storedTensorBytes(const TensorType &type) {
  int64_t n = type.dtype() == BF16 ? 2 : 4;
  for (int64_t d : type.shape())
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      return -1;
  return n;
}

KernelSpan valueKernelSpans(const Segment &seg) {
  int n = seg.values_size();
  KernelSpan span;
  span.first.assign(n, -1);
  span.last.assign(n, -1);
  for (int k = 0; k < seg.kernels_size(); ++k) {
    auto touch = [&](const Operand &op) {
      if (op.kind() != Operand::VALUE || op.index() < 0 || op.index() >= n)
        return;
      if (span.first[op.index()] < 0)
        span.first[op.index()] = k;
      span.last[op.index()] = k;
    };
    for (const Operand &op : seg.kernels(k).inputs())
      touch(op);
    for (const Operand &op : seg.kernels(k).outputs())
      touch(op);
  }
  return span;
}

namespace {

/// When each value of a segment call needs scratch: [first, last] in kernel
/// indices, or first = -1 when it needs none. In bf16 plans, packed
/// arguments are unpacked into float32 scratch for the whole call and
/// results are computed in scratch, then packed.
struct ValueLives {
  std::vector<int> first, last;
};

bool packedType(const TensorType &t, bool bf16) {
  return bf16 && t.dtype() == F32 && t.shape_size() > 0;
}

ValueLives segmentLives(const Segment &seg, bool bf16) {
  int n = seg.values_size();
  int end = seg.kernels_size();
  KernelSpan span = valueKernelSpans(seg);
  ValueLives lives{std::move(span.first), std::move(span.last)};
  std::vector<int> &first = lives.first, &last = lives.last;
  for (int a : seg.args()) {
    if (a < 0 || a >= n || first[a] < 0)
      continue;
    if (packedType(seg.values(a), bf16)) {
      first[a] = 0;
      last[a] = end;
    } else {
      first[a] = last[a] = -1; // bound to its step buffer
    }
  }
  for (int r : seg.results()) {
    if (r < 0 || r >= n || first[r] < 0)
      continue;
    if (packedType(seg.values(r), bf16))
      last[r] = end;
    else
      first[r] = last[r] = -1;
  }
  return lives;
}

} // namespace

int64_t planSegmentScratch(const Segment &seg, bool bf16,
                           std::vector<int64_t> *offsets, int64_t alignment) {
  int n = seg.values_size();
  ValueLives lives = segmentLives(seg, bf16);
  std::vector<int> ids;
  std::vector<int64_t> sizes;
  for (int v = 0; v < n; ++v) {
    if (lives.first[v] < 0)
      continue;
    TensorType f32 = seg.values(v);
    f32.set_dtype(F32);
    ids.push_back(v);
    sizes.push_back(std::max<int64_t>(storedTensorBytes(f32), 0));
  }
  const std::vector<int> &first = lives.first, &last = lives.last;
  ArenaLayout layout = pack(sizes, alignment, [&](int i, int j) {
    int a = ids[i], b = ids[j];
    return first[a] <= last[b] && first[b] <= last[a];
  });
  if (offsets) {
    offsets->assign(n, -1);
    for (size_t i = 0; i < ids.size(); ++i)
      (*offsets)[ids[i]] = layout.offsets[i];
  }
  return layout.bytes;
}

StepBlocks stepBlocks(const Plan &plan, bool recordedScratch) {
  StepBlocks out;
  bool bf16 = plan.training().compute_dtype() == BF16;
  int maxId = -1;
  for (const Buffer &b : plan.buffers())
    maxId = std::max(maxId, b.id());
  out.bufferBlock.assign(maxId + 1, -1);
  std::vector<Block> &blocks = out.blocks;
  for (const Buffer &b : plan.buffers()) {
    if (b.id() < 0 || out.bufferBlock[b.id()] >= 0)
      continue;
    out.bufferBlock[b.id()] = static_cast<int>(blocks.size());
    Block block;
    TensorType stored = b.type();
    if (packedType(stored, bf16))
      stored.set_dtype(BF16);
    block.bytes = std::max<int64_t>(storedTensorBytes(stored), 0);
    block.name = "buffer " + std::to_string(b.id()) + " (" + b.name() + ")";
    blocks.push_back(std::move(block));
  }
  auto blockFor = [&](int id) -> Block * {
    if (id < 0 || id > maxId || out.bufferBlock[id] < 0)
      return nullptr;
    return &blocks[out.bufferBlock[id]];
  };
  // Writers first, so accesses[0] is each buffer's definition.
  for (int s = 0; s < plan.streams_size(); ++s) {
    const Stream &stream = plan.streams(s);
    for (int i = 0; i < stream.instructions_size(); ++i)
      for (int id : stream.instructions(i).outputs())
        if (Block *b = blockFor(id))
          b->accesses.insert(b->accesses.begin(), Pos{s, i});
  }
  out.callBlock.resize(plan.streams_size());
  for (int s = 0; s < plan.streams_size(); ++s) {
    const Stream &stream = plan.streams(s);
    out.callBlock[s].assign(stream.instructions_size(), -1);
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const Instruction &inst = stream.instructions(i);
      for (int id : inst.inputs()) {
        if (Block *b = blockFor(id)) {
          b->accesses.push_back(Pos{s, i});
          if (inst.kind() == Instruction::SEND)
            b->untilStepEnd = true;
        }
      }
      if (inst.kind() == Instruction::ALL_REDUCE && inst.params_size() > 1) {
        // One flat staging buffer per instruction, so one collective covers
        // every parameter of the bucket; live during the instruction only
        // (the executor waits for the all-reduce before it moves on).
        Block staging;
        for (int p : inst.params())
          if (p >= 0 && p < plan.params_size()) {
            TensorType f32 = plan.params(p).type();
            f32.set_dtype(F32);
            staging.bytes += std::max<int64_t>(storedTensorBytes(f32), 0);
          }
        staging.accesses.push_back(Pos{s, i});
        staging.name =
            "all-reduce staging of " + describePosition(plan, {s, i});
        out.callBlock[s][i] = static_cast<int>(blocks.size());
        blocks.push_back(std::move(staging));
      }
      if (inst.kind() == Instruction::CALL && inst.segment() >= 0 &&
          inst.segment() < plan.segments_size()) {
        const Segment &seg = plan.segments(inst.segment());
        Block scratch;
        scratch.bytes = recordedScratch
                            ? seg.scratch_bytes()
                            : planSegmentScratch(seg, bf16, nullptr);
        scratch.accesses.push_back(Pos{s, i});
        scratch.name = "scratch of " + describePosition(plan, {s, i});
        out.callBlock[s][i] = static_cast<int>(blocks.size());
        blocks.push_back(std::move(scratch));
      }
    }
  }
  return out;
}

namespace {

int64_t f32Bytes(const TensorType &type) {
  TensorType f32 = type;
  f32.set_dtype(F32);
  return std::max<int64_t>(storedTensorBytes(f32), 0);
}

} // namespace

int stateTensorsPerParam(const Plan &plan) {
  return plan.training().compute_dtype() == BF16 ? 5 : 4;
}

bool assignArena(Plan &plan, std::string &error) {
  StreamOrder order;
  if (!StreamOrder::build(plan, order, error))
    return false;
  const int64_t align = 64;
  int64_t cursor = 0;
  int stateTensors = stateTensorsPerParam(plan);
  for (Parameter &p : *plan.mutable_params()) {
    p.clear_state_offsets();
    int64_t bytes = f32Bytes(p.type());
    for (int k = 0; k < stateTensors; ++k) {
      p.add_state_offsets(cursor);
      cursor = alignUp(cursor + std::max<int64_t>(bytes, 1), align);
    }
    ShardDescriptor *shard = p.mutable_shard();
    shard->clear_global_shape();
    shard->clear_start();
    for (int64_t d : p.type().shape()) {
      shard->add_global_shape(d);
      shard->add_start(0);
    }
  }
  int64_t state = cursor;
  bool bf16 = plan.training().compute_dtype() == BF16;
  for (Segment &seg : *plan.mutable_segments()) {
    std::vector<int64_t> offsets;
    seg.set_scratch_bytes(planSegmentScratch(seg, bf16, &offsets, align));
    seg.clear_value_offsets();
    for (int64_t o : offsets)
      seg.add_value_offsets(o);
  }
  StepBlocks step = stepBlocks(plan, /*recordedScratch=*/true);
  ArenaLayout layout = packBlocks(step.blocks, order, align);
  // Roles in one pass over the instructions per buffer would be quadratic
  // on huge plans; collect them first.
  std::vector<BufferRole> roles(step.bufferBlock.size(), ACTIVATION);
  for (const Stream &stream : plan.streams())
    for (const Instruction &inst : stream.instructions()) {
      auto mark = [&](int id, BufferRole role) {
        if (id < 0 || id >= static_cast<int>(roles.size()))
          return;
        if (role == BATCH || roles[id] == ACTIVATION)
          roles[id] = role;
      };
      if (inst.kind() == Instruction::LOAD_BATCH)
        for (int id : inst.outputs())
          mark(id, BATCH);
      if (inst.kind() == Instruction::RECV)
        for (int id : inst.outputs())
          mark(id, COMMUNICATION);
      if (inst.kind() == Instruction::SEND)
        for (int id : inst.inputs())
          mark(id, COMMUNICATION);
      if (inst.kind() == Instruction::ALL_REDUCE ||
          inst.kind() == Instruction::REDUCE_SCATTER ||
          inst.kind() == Instruction::ALL_GATHER ||
          inst.kind() == Instruction::ALL_TO_ALL)
        for (int id : inst.outputs())
          mark(id, COMMUNICATION);
    }
  for (Buffer &b : *plan.mutable_buffers()) {
    int block =
        b.id() >= 0 && b.id() < static_cast<int>(step.bufferBlock.size())
            ? step.bufferBlock[b.id()]
            : -1;
    b.set_offset(block >= 0 ? state + layout.offsets[block] : 0);
    b.set_role(block >= 0 ? roles[b.id()] : ACTIVATION);
  }
  for (int s = 0; s < plan.streams_size(); ++s) {
    Stream *stream = plan.mutable_streams(s);
    for (int i = 0; i < stream->instructions_size(); ++i) {
      int block = step.callBlock[s][i];
      stream->mutable_instructions(i)->set_scratch_offset(
          block >= 0 ? state + layout.offsets[block] : 0);
    }
  }
  plan.set_state_bytes(state);
  plan.set_arena_bytes(state + layout.bytes);
  return true;
}

std::vector<int64_t> recordedOffsets(const Plan &plan, const StepBlocks &step,
                                     int64_t base) {
  std::vector<int64_t> offsets(step.blocks.size(), -1);
  for (const Buffer &b : plan.buffers())
    if (b.id() >= 0 && b.id() < static_cast<int>(step.bufferBlock.size()) &&
        step.bufferBlock[b.id()] >= 0)
      offsets[step.bufferBlock[b.id()]] = b.offset() - base;
  for (int s = 0; s < plan.streams_size(); ++s)
    for (int i = 0; i < plan.streams(s).instructions_size(); ++i)
      if (step.callBlock[s][i] >= 0)
        offsets[step.callBlock[s][i]] =
            plan.streams(s).instructions(i).scratch_offset() - base;
  return offsets;
}

bool checkArena(const Plan &plan, std::string &error) {
  const int64_t align = 64;
  int64_t state = plan.state_bytes(), arena = plan.arena_bytes();
  if (state < 0 || arena < state) {
    error = "state_bytes " + std::to_string(state) + " and arena_bytes " +
            std::to_string(arena) + " are inconsistent";
    return false;
  }
  // Persistent state: all of it lives all the time.
  std::vector<std::pair<int64_t, int64_t>> taken;
  std::vector<std::string> names;
  static const char *kinds[] = {"value", "gradient", "first moment",
                                "second moment", "bf16 compute copy"};
  int stateTensors = stateTensorsPerParam(plan);
  for (const Parameter &p : plan.params()) {
    if (p.state_offsets_size() != stateTensors) {
      error = "parameter '" + p.name() + "' has " +
              std::to_string(p.state_offsets_size()) + " state offsets, not " +
              std::to_string(stateTensors);
      return false;
    }
    int64_t bytes = f32Bytes(p.type());
    for (int k = 0; k < stateTensors; ++k) {
      int64_t off = p.state_offsets(k);
      if (off < 0 || off % align != 0 || off + bytes > state) {
        error = "the " + std::string(kinds[k]) + " of parameter '" + p.name() +
                "' at offset " + std::to_string(off) +
                " is misaligned or outside the state region of " +
                std::to_string(state) + " bytes";
        return false;
      }
      taken.emplace_back(off, off + bytes);
      names.push_back("the " + std::string(kinds[k]) + " of parameter '" +
                      p.name() + "'");
    }
  }
  std::vector<int> idx(taken.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(),
            [&](int a, int b) { return taken[a] < taken[b]; });
  for (size_t i = 1; i < idx.size(); ++i) {
    const auto &prev = taken[idx[i - 1]], &cur = taken[idx[i]];
    if (cur.first < prev.second && cur.first < cur.second &&
        prev.first < prev.second) {
      error = names[idx[i]] + " overlaps " + names[idx[i - 1]];
      return false;
    }
  }
  // Segment scratch: values disjoint while both are live.
  bool bf16 = plan.training().compute_dtype() == BF16;
  for (const Segment &seg : plan.segments()) {
    if (seg.value_offsets_size() != seg.values_size()) {
      error = "segment '" + seg.name() + "' has " +
              std::to_string(seg.value_offsets_size()) + " value offsets for " +
              std::to_string(seg.values_size()) + " values";
      return false;
    }
    ValueLives lives = segmentLives(seg, bf16);
    const std::vector<int> &first = lives.first, &last = lives.last;
    int n = seg.values_size();
    std::vector<int> placed;
    for (int v = 0; v < n; ++v) {
      int64_t off = seg.value_offsets(v);
      if (first[v] < 0)
        continue;
      int64_t bytes = f32Bytes(seg.values(v));
      if (off < 0 || off % align != 0 || off + bytes > seg.scratch_bytes()) {
        error = "value " + std::to_string(v) + " of segment '" + seg.name() +
                "' at scratch offset " + std::to_string(off) +
                " is missing, misaligned or outside its " +
                std::to_string(seg.scratch_bytes()) + " bytes of scratch";
        return false;
      }
      for (int u : placed) {
        int64_t uo = seg.value_offsets(u), ub = f32Bytes(seg.values(u));
        bool bytesOverlap = off < uo + ub && uo < off + bytes;
        bool liveOverlap = first[u] <= last[v] && first[v] <= last[u];
        if (bytesOverlap && liveOverlap && bytes > 0 && ub > 0) {
          error = "values " + std::to_string(u) + " and " + std::to_string(v) +
                  " of segment '" + seg.name() +
                  "' share scratch bytes while both are live";
          return false;
        }
      }
      placed.push_back(v);
    }
  }
  // Step blocks.
  StreamOrder order;
  if (!StreamOrder::build(plan, order, error))
    return false;
  StepBlocks step = stepBlocks(plan, /*recordedScratch=*/true);
  ArenaLayout layout;
  layout.bytes = arena - state;
  layout.offsets = recordedOffsets(plan, step, state);
  if (!verifyLayout(step.blocks, layout, order, align, error)) {
    error = "memory plan: " + error;
    return false;
  }
  return true;
}

} // namespace piper::plan

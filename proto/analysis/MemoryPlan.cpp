// Arena layout from lifetimes (see MemoryPlan.h).
#include "proto/analysis/MemoryPlan.h"

#include <algorithm>
#include <numeric>
#include <sstream>
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

ArenaLayout packBlocks(const std::vector<Block> &blocks,
                       const StreamOrder &order, int64_t alignment) {
  std::vector<int64_t> sizes;
  sizes.reserve(blocks.size());
  for (const Block &b : blocks)
    sizes.push_back(b.bytes);
  return pack(sizes, alignment, [&](int i, int j) {
    return interfere(blocks[i], blocks[j], order);
  });
}

bool verifyLayout(const std::vector<Block> &blocks, const ArenaLayout &layout,
                  const StreamOrder &order, int64_t alignment,
                  std::string &error) {
  if (layout.offsets.size() != blocks.size()) {
    error = std::to_string(layout.offsets.size()) + " offsets for " +
            std::to_string(blocks.size()) + " blocks";
    return false;
  }
  std::vector<int> byOffset(blocks.size());
  std::iota(byOffset.begin(), byOffset.end(), 0);
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
  // Sweep by offset: only blocks whose byte ranges overlap are compared.
  std::sort(byOffset.begin(), byOffset.end(), [&](int a, int b) {
    return layout.offsets[a] < layout.offsets[b];
  });
  for (size_t x = 0; x < byOffset.size(); ++x) {
    int i = byOffset[x];
    int64_t end = layout.offsets[i] + blocks[i].bytes;
    for (size_t y = x + 1; y < byOffset.size(); ++y) {
      int j = byOffset[y];
      if (layout.offsets[j] >= end)
        break;
      if (blocks[i].bytes == 0 || blocks[j].bytes == 0)
        continue;
      if (interfere(blocks[i], blocks[j], order)) {
        error = blocks[i].name + " and " + blocks[j].name +
                " share bytes at offset " + std::to_string(layout.offsets[j]) +
                " but may be live at the same time";
        return false;
      }
    }
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

int64_t planSegmentScratch(const Segment &seg, bool resultsInScratch,
                           std::vector<int64_t> *offsets, int64_t alignment) {
  int n = seg.values_size();
  int end = seg.kernels_size();
  std::vector<int> first(n, -1), last(n, -1);
  for (int k = 0; k < seg.kernels_size(); ++k) {
    auto touch = [&](const Operand &op) {
      if (op.kind() != Operand::VALUE || op.index() < 0 || op.index() >= n)
        return;
      if (first[op.index()] < 0)
        first[op.index()] = k;
      last[op.index()] = k;
    };
    for (const Operand &op : seg.kernels(k).inputs())
      touch(op);
    for (const Operand &op : seg.kernels(k).outputs())
      touch(op);
  }
  std::vector<char> bound(n, 0);
  for (int a : seg.args())
    if (a >= 0 && a < n)
      bound[a] = 1;
  for (int r : seg.results()) {
    if (r < 0 || r >= n)
      continue;
    if (resultsInScratch)
      last[r] = end;
    else
      bound[r] = 1;
  }
  std::vector<int> ids;
  std::vector<int64_t> sizes;
  for (int v = 0; v < n; ++v) {
    if (bound[v] || first[v] < 0)
      continue;
    TensorType f32 = seg.values(v);
    f32.set_dtype(F32);
    ids.push_back(v);
    sizes.push_back(std::max<int64_t>(storedTensorBytes(f32), 0));
  }
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

std::vector<Block> stepBlocks(const Plan &plan, std::vector<int> *bufferBlock) {
  int maxId = -1;
  for (const Buffer &b : plan.buffers())
    maxId = std::max(maxId, b.id());
  std::vector<int> blockOf(maxId + 1, -1);
  std::vector<Block> blocks;
  for (const Buffer &b : plan.buffers()) {
    if (b.id() < 0 || blockOf[b.id()] >= 0)
      continue;
    blockOf[b.id()] = static_cast<int>(blocks.size());
    Block block;
    block.bytes = std::max<int64_t>(storedTensorBytes(b.type()), 0);
    block.name = "buffer " + std::to_string(b.id()) + " (" + b.name() + ")";
    blocks.push_back(std::move(block));
  }
  auto blockFor = [&](int id) -> Block * {
    if (id < 0 || id > maxId || blockOf[id] < 0)
      return nullptr;
    return &blocks[blockOf[id]];
  };
  // Writers first, so accesses[0] is each buffer's definition.
  for (int s = 0; s < plan.streams_size(); ++s) {
    const Stream &stream = plan.streams(s);
    for (int i = 0; i < stream.instructions_size(); ++i)
      for (int id : stream.instructions(i).outputs())
        if (Block *b = blockFor(id))
          b->accesses.insert(b->accesses.begin(), Pos{s, i});
  }
  bool bf16 = plan.training().compute_dtype() == BF16;
  for (int s = 0; s < plan.streams_size(); ++s) {
    const Stream &stream = plan.streams(s);
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const Instruction &inst = stream.instructions(i);
      for (int id : inst.inputs()) {
        if (Block *b = blockFor(id)) {
          b->accesses.push_back(Pos{s, i});
          if (inst.kind() == Instruction::SEND)
            b->untilStepEnd = true;
        }
      }
      if (inst.kind() == Instruction::CALL && inst.segment() >= 0 &&
          inst.segment() < plan.segments_size()) {
        Block scratch;
        scratch.bytes = planSegmentScratch(plan.segments(inst.segment()), bf16,
                                           nullptr);
        scratch.accesses.push_back(Pos{s, i});
        scratch.name = "scratch of " + describePosition(plan, {s, i});
        blocks.push_back(std::move(scratch));
      }
    }
  }
  if (bufferBlock)
    *bufferBlock = std::move(blockOf);
  return blocks;
}

bool memoryReport(const Plan &plan, int largest, std::string &text) {
  StreamOrder order;
  if (!StreamOrder::build(plan, order, text))
    return false;
  std::vector<Block> blocks = stepBlocks(plan, nullptr);
  ArenaLayout layout = packBlocks(blocks, order);
  std::string error;
  if (!verifyLayout(blocks, layout, order, 64, error)) {
    text = "invalid arena layout: " + error;
    return false;
  }
  int64_t state = 0;
  for (const Parameter &p : plan.params()) {
    TensorType f32 = p.type();
    f32.set_dtype(F32);
    state += 4 * std::max<int64_t>(storedTensorBytes(f32), 0);
  }
  int buffers = plan.buffers_size();
  int64_t summed = 0;
  for (const Block &b : blocks)
    summed += b.bytes;
  std::ostringstream os;
  os << "memory class " << plan.device_class() << ": state " << state
     << " bytes, arena " << layout.bytes << " bytes (" << buffers
     << " buffers and " << blocks.size() - buffers
     << " call scratch areas, " << summed << " bytes if none shared), total "
     << state + layout.bytes << "; compiler predicted peak "
     << plan.predicted_peak_bytes() << "\n";
  std::vector<int> bySize(blocks.size());
  std::iota(bySize.begin(), bySize.end(), 0);
  std::stable_sort(bySize.begin(), bySize.end(), [&](int a, int b) {
    return blocks[a].bytes > blocks[b].bytes;
  });
  for (int i = 0; i < largest && i < static_cast<int>(bySize.size()); ++i) {
    const Block &b = blocks[bySize[i]];
    os << "  offset " << layout.offsets[bySize[i]] << ": " << b.bytes
       << " bytes, " << b.name << "\n";
  }
  text = os.str();
  return true;
}

} // namespace piper::plan

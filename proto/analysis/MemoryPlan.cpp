// The memory plan of a plan (see MemoryPlan.h): step blocks, segment
// scratch, assignArena and checkArena. The block sweep is in ArenaSweep.cpp.
#include "proto/analysis/MemoryPlan.h"
#include "proto/PlanShards.h"
#include "proto/PlanTensors.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

namespace piper::plan {
namespace {

/// Bytes of a tensor of `type` held as float32 whatever its stored type: 4
/// bytes an element even in bf16 plans. Segment values (kernels compute in
/// fp32 and the executor rounds their outputs to bf16 values in place) and
/// all-reduce staging (gradients are fp32 state) are float32 in the arena;
/// only step buffers are stored packed (stepBlocks, plan::storedType).
int64_t f32Bytes(const TensorType &type) {
  TensorType f32 = type;
  f32.set_dtype(F32);
  return std::max<int64_t>(tensorBytes(f32), 0);
}

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

KernelSpan valueKernelSpans(const Segment &seg) {
  int n = seg.values_size();
  KernelSpan span;
  span.first.assign(n, -1);
  span.last.assign(n, -1);
  span.lastWrite.assign(n, -1);
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
    for (const Operand &op : seg.kernels(k).outputs()) {
      touch(op);
      if (op.kind() == Operand::VALUE && op.index() >= 0 && op.index() < n)
        span.lastWrite[op.index()] = k;
    }
  }
  return span;
}

namespace {

/// When each value of a segment call needs scratch: [first, last] in kernel
/// indices, or first = -1 when it needs none. In bf16 plans, a packed
/// argument is unpacked into float32 scratch just before its first reader
/// and lives until its last; a result is computed in scratch and packed
/// right after its last writer (the executor does), living until its last
/// reader; an argument that is also a result is packed when the call ends.
struct ValueLives {
  std::vector<int> first, last;
};

ValueLives segmentLives(const Segment &seg, bool bf16) {
  int n = seg.values_size();
  int end = seg.kernels_size();
  KernelSpan span = valueKernelSpans(seg);
  ValueLives lives{std::move(span.first), std::move(span.last)};
  std::vector<int> &first = lives.first, &last = lives.last;
  for (int a : seg.args()) {
    if (a < 0 || a >= n || first[a] < 0)
      continue;
    if (!packedBf16(seg.values(a), bf16)) {
      first[a] = last[a] = -1; // bound to its step buffer
    }
  }
  std::vector<char> isArg(n, 0);
  for (int a : seg.args())
    if (a >= 0 && a < n)
      isArg[a] = 1;
  for (int r : seg.results()) {
    if (r < 0 || r >= n || first[r] < 0)
      continue;
    if (!packedBf16(seg.values(r), bf16))
      first[r] = last[r] = -1;
    else if (isArg[r])
      last[r] = end;
  }
  return lives;
}

} // namespace

namespace {
/// Value v's scratch bytes: `bytes`' where it gives them, else float32.
int64_t valueBytes(const Segment &seg, int v,
                   const std::vector<int64_t> *bytes) {
  if (bytes && v < static_cast<int>(bytes->size()) && (*bytes)[v] >= 0)
    return (*bytes)[v];
  return f32Bytes(seg.values(v));
}
} // namespace

int64_t planSegmentScratch(const Segment &seg, bool bf16,
                           std::vector<int64_t> *offsets, int64_t alignment,
                           const std::vector<int64_t> *bytes) {
  int n = seg.values_size();
  ValueLives lives = segmentLives(seg, bf16);
  std::vector<int> ids;
  std::vector<int64_t> sizes;
  if (offsets)
    offsets->assign(n, -1);
  for (int v = 0; v < n; ++v) {
    if (lives.first[v] < 0)
      continue;
    const int64_t b = valueBytes(seg, v, bytes);
    if (b == 0 && bytes) {
      if (offsets)
        (*offsets)[v] = 0; // needs no bytes, but is not a bound argument
      continue;
    }
    ids.push_back(v);
    sizes.push_back(b);
  }
  const std::vector<int> &first = lives.first, &last = lives.last;
  ArenaLayout layout = pack(sizes, alignment, [&](int i, int j) {
    int a = ids[i], b = ids[j];
    return first[a] <= last[b] && first[b] <= last[a];
  });
  if (offsets)
    for (size_t i = 0; i < ids.size(); ++i)
      (*offsets)[ids[i]] = layout.offsets[i];
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
    block.bytes = std::max<int64_t>(tensorBytes(storedType(plan, b.type())), 0);
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
          if (p >= 0 && p < plan.params_size())
            staging.bytes += f32Bytes(plan.params(p).type());
        staging.accesses.push_back(Pos{s, i});
        staging.name =
            "all-reduce staging of " + describePosition(plan, {s, i});
        out.callBlock[s][i] = static_cast<int>(blocks.size());
        blocks.push_back(std::move(staging));
      }
      if (inst.kind() == Instruction::REDUCE_SCATTER_GRADS ||
          inst.kind() == Instruction::ALL_GATHER_PARAMS) {
        // ZeRO (runtime/exec/Zero.cpp): the whole tensors of the bucket,
        // flat and grouped by member, plus this member's part (float32);
        // a reduce-scatter of step buffers goes parameter by parameter and
        // needs one member range, plus one unpacked gradient in bf16.
        Block staging;
        int64_t range = 0, whole = 0;
        for (int p : inst.params())
          if (p >= 0 && p < plan.params_size()) {
            const Parameter &param = plan.params(p);
            int64_t n = paramElements(param);
            int64_t cap = shardCapacity(n, shardMembers(plan, param));
            staging.bytes += 4 * (n + cap);
            range = std::max(range, cap);
            whole = std::max(whole, n);
          }
        if (inst.kind() == Instruction::REDUCE_SCATTER_GRADS &&
            inst.inputs_size() > 0)
          staging.bytes = 4 * (range + (bf16 ? whole : 0));
        // A gather into new buffers goes straight from each shard into its
        // buffer (through one whole parameter in bf16).
        if (inst.kind() == Instruction::ALL_GATHER_PARAMS &&
            inst.outputs_size() > 0)
          staging.bytes = bf16 ? 4 * whole : 0;
        staging.accesses.push_back(Pos{s, i});
        staging.name = "ZeRO staging of " + describePosition(plan, {s, i});
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

int stateTensorsPerParam(const Plan &plan) {
  return plan.training().compute_dtype() == BF16 ? 5 : 4;
}

namespace {
// The bytes of state tensor k of parameter `index` (`copies`: the compute
// copy's where given).
int64_t stateTensorBytes(const Plan &plan, int index, int k,
                         const CopyBytes *copies) {
  if (k == 4 && copies && index < static_cast<int>(copies->size()) &&
      (*copies)[index] >= 0)
    return (*copies)[index];
  return 4 * stateElements(plan, plan.params(index), k);
}
} // namespace

void layOutState(Plan &plan, const CopyBytes *copies) {
  const int64_t align = 64;
  int64_t cursor = 0;
  int stateTensors = stateTensorsPerParam(plan);
  for (int i = 0; i < plan.params_size(); ++i) {
    Parameter &p = *plan.mutable_params(i);
    p.clear_state_offsets();
    for (int k = 0; k < stateTensors; ++k) {
      p.add_state_offsets(cursor);
      int64_t bytes = stateTensorBytes(plan, i, k, copies);
      cursor = alignUp(cursor + std::max<int64_t>(bytes, 1), align);
    }
  }
  plan.set_state_bytes(cursor);
}

bool assignArena(Plan &plan, std::string &error) {
  layOutState(plan);
  for (Parameter &p : *plan.mutable_params()) {
    ShardDescriptor *shard = p.mutable_shard();
    shard->clear_global_shape();
    shard->clear_start();
    for (int64_t d : p.type().shape()) {
      shard->add_global_shape(d);
      shard->add_start(0);
    }
  }
  return relayoutStep(plan, nullptr, error);
}

bool relayoutStep(Plan &plan, const ValueBytes *bytes, std::string &error) {
  StreamOrder order;
  if (!StreamOrder::build(plan, order, error))
    return false;
  const int64_t align = 64;
  const int64_t state = plan.state_bytes();
  bool bf16 = plan.training().compute_dtype() == BF16;
  for (int g = 0; g < plan.segments_size(); ++g) {
    Segment &seg = *plan.mutable_segments(g);
    std::vector<int64_t> offsets;
    const std::vector<int64_t> *sizes =
        bytes && g < static_cast<int>(bytes->size()) ? &(*bytes)[g] : nullptr;
    seg.set_scratch_bytes(
        planSegmentScratch(seg, bf16, &offsets, align, sizes));
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
          inst.kind() == Instruction::ALL_TO_ALL ||
          inst.kind() == Instruction::ALL_GATHER_PARAMS)
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

bool checkArena(const Plan &plan, std::string &error,
                const ValueBytes *valueSizes, const CopyBytes *copies) {
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
  for (int i = 0; i < plan.params_size(); ++i) {
    const Parameter &p = plan.params(i);
    if (p.state_offsets_size() != stateTensors) {
      error = "parameter '" + p.name() + "' has " +
              std::to_string(p.state_offsets_size()) + " state offsets, not " +
              std::to_string(stateTensors);
      return false;
    }
    for (int k = 0; k < stateTensors; ++k) {
      int64_t bytes = stateTensorBytes(plan, i, k, copies);
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
  for (int g = 0; g < plan.segments_size(); ++g) {
    const Segment &seg = plan.segments(g);
    const std::vector<int64_t> *sizes =
        valueSizes && g < static_cast<int>(valueSizes->size())
            ? &(*valueSizes)[g]
            : nullptr;
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
      int64_t bytes = valueBytes(seg, v, sizes);
      if (off < 0 || off % align != 0 || off + bytes > seg.scratch_bytes()) {
        error = "value " + std::to_string(v) + " of segment '" + seg.name() +
                "' at scratch offset " + std::to_string(off) +
                " is missing, misaligned or outside its " +
                std::to_string(seg.scratch_bytes()) + " bytes of scratch";
        return false;
      }
      for (int u : placed) {
        int64_t uo = seg.value_offsets(u), ub = valueBytes(seg, u, sizes);
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

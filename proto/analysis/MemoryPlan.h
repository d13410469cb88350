// Arena offsets from lifetimes: the memory plan of one device's step. Blocks
// (step buffers, per-call segment scratch) that may be live at the same time
// never share a byte; blocks whose lifetimes are ordered by the plan's
// happens-before relation may. The compiler lays the arena out; the runtime
// checks the layout with verifyLayout before it trusts it.
#ifndef PIPER_PROTO_ANALYSIS_MEMORYPLAN_H
#define PIPER_PROTO_ANALYSIS_MEMORYPLAN_H

#include <cstdint>
#include <string>
#include <vector>

#include "proto/analysis/StreamOrder.h"
#include "proto/plan.pb.h"

namespace piper::plan {

/// Something that needs `bytes` of arena while the plan runs the positions in
/// `accesses`. accesses[0] defines it (its first write) and happens before
/// every other access. With `untilStepEnd` it stays live from its definition
/// to the end of the step (e.g. a buffer an asynchronous send still reads).
struct Block {
  int64_t bytes = 0;
  std::vector<Pos> accesses;
  bool untilStepEnd = false;
  std::string name; // for diagnostics
};

/// Where each block lives in the arena, and the arena's size.
struct ArenaLayout {
  std::vector<int64_t> offsets; // by block index
  int64_t bytes = 0;
};

/// `x` rounded up to a multiple of `a`.
inline int64_t alignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/// True when every access of `a` happens before `b` is defined, so `b` may
/// reuse `a`'s bytes.
bool endsBefore(const Block &a, const Block &b, const StreamOrder &order);

/// True when neither block ends before the other is defined.
inline bool interfere(const Block &a, const Block &b,
                      const StreamOrder &order) {
  return !endsBefore(a, b, order) && !endsBefore(b, a, order);
}

/// Lays the blocks out in one sweep over the step in execution order: each
/// block, when defined, takes the smallest `alignment`-aligned gap (the
/// lowest of equal ones) between the interfering blocks already placed, or
/// goes above them; its bytes become free for a stream at the first
/// instruction of that stream that all its accesses happen before.
/// O(n log n) for n blocks (times the number of streams); deterministic.
ArenaLayout packBlocks(const std::vector<Block> &blocks,
                       const StreamOrder &order, int64_t alignment = 64);

/// Checks a layout: offsets aligned and non-negative, every block inside the
/// arena, and no two interfering blocks sharing a byte (the sweep of
/// packBlocks, O(n log n)). On failure `error` names the two blocks.
bool verifyLayout(const std::vector<Block> &blocks, const ArenaLayout &layout,
                  const StreamOrder &order, int64_t alignment,
                  std::string &error);

/// For each local value of `segment`, the first and the last kernel that
/// reads or writes it, and the last that writes it (-1 for none).
struct KernelSpan {
  std::vector<int> first, last, lastWrite;
};
KernelSpan valueKernelSpans(const Segment &segment);

/// The local values of a segment call that need scratch, each live from the
/// kernel that first touches it to the one that last does; values are
/// float32 containers, 4 bytes an element. Arguments and results are bound
/// to their step buffers, except in bf16 plans (`bf16`), whose float32 step
/// buffers are stored packed: such an argument is unpacked into scratch from
/// its first reader to its last, and such a result is computed in scratch
/// and packed right after its last writer (an argument that is also a
/// result stays until the call ends, when it is packed). Lays the values out,
/// largest first, each at the lowest aligned offset free of the values live
/// with it, in a scratch area whose size is returned; `offsets` (by value id,
/// -1 for values without scratch) may be null. With `bytes` (by value id),
/// a value with bytes[v] >= 0 needs that many instead of its float32 bytes
/// (a device that stores it packed: half; or none, where it is written to
/// or read from its step buffer as stored: 0, at offset 0).
int64_t planSegmentScratch(const Segment &segment, bool bf16,
                           std::vector<int64_t> *offsets,
                           int64_t alignment = 64,
                           const std::vector<int64_t> *bytes = nullptr);

/// Per segment, per value: the scratch bytes a device's storage needs
/// (planSegmentScratch's `bytes`; -1: the float32 bytes).
using ValueBytes = std::vector<std::vector<int64_t>>;
/// Per parameter: the bytes of its bf16 compute copy where a device stores
/// it packed (2 per element); -1: the float32 bytes.
using CopyBytes = std::vector<int64_t>;
/// Both: what a device's layout of a plan sized otherwise than the plan
/// file (empty: nothing).
struct StorageBytes {
  ValueBytes values;
  CopyBytes copies;
};

/// The blocks of one plan's step: one per step buffer (defined by the
/// instruction that writes it, accessed by every reader; a buffer read by a
/// SEND stays live until the step ends), then one per CALL for its segment's
/// scratch (live during that call only), sized by planSegmentScratch or,
/// with `recordedScratch`, by the segment's recorded scratch_bytes, and one
/// per ALL_REDUCE of several parameters for its flat float32 staging buffer
/// (live during the instruction). An instruction's block is placed at its
/// `scratch_offset`.
struct StepBlocks {
  std::vector<Block> blocks;
  std::vector<int> bufferBlock;            // by buffer id; -1: no buffer
  std::vector<std::vector<int>> callBlock; // by stream, instruction; -1
};
StepBlocks stepBlocks(const Plan &plan, bool recordedScratch = false);

/// Float32 state tensors per parameter: value, gradient, AdamW first and
/// second moment, and in bf16 plans the bf16-rounded compute copy kernels
/// read (refreshed once per step).
int stateTensorsPerParam(const Plan &plan);

/// Writes the memory plan into `plan` (schema 2): the persistent state of
/// every parameter from offset 0 (stateTensorsPerParam float32 tensors,
/// 64-byte aligned), then the step blocks laid out by packBlocks; every
/// buffer's offset and role, every CALL's scratch_offset, every segment's
/// scratch_bytes and value_offsets, unsharded shard descriptors, state_bytes
/// and arena_bytes. Fails, with the reason in `error`, when the plan's
/// streams deadlock on events.
bool assignArena(Plan &plan, std::string &error);

/// Lays out `plan`'s state region from offset 0, as assignArena does (each
/// parameter's stateTensorsPerParam tensors in order, 64-byte aligned,
/// sharded ones at their shards' capacity), the compute copies at
/// `copies`' bytes where given, and sets state_bytes. The runtime does
/// this for a device that stores some compute copies packed; the step must
/// then be laid out again above it (relayoutStep).
void layOutState(Plan &plan, const CopyBytes *copies = nullptr);

/// Lays out `plan`'s step again above its state region (kept as it is,
/// sharded or not): every segment's scratch and value offsets with the
/// values sized by `bytes` (null: float32), then the step blocks: every
/// buffer's offset, every instruction's scratch_offset and arena_bytes.
/// The runtime does this for a device that stores some values packed
/// (runtime/exec: the plan file stays device-agnostic). Fails, with the
/// reason in `error`, when the plan's streams deadlock on events.
bool relayoutStep(Plan &plan, const ValueBytes *bytes, std::string &error);

/// The offsets `plan` records for the blocks of `step` (buffer offsets, and
/// the scratch_offset of instructions that own a block), minus `base`; -1
/// for blocks the plan gives no place.
std::vector<int64_t> recordedOffsets(const Plan &plan, const StepBlocks &step,
                                     int64_t base);

/// Checks the memory plan recorded in `plan` without trusting it: state
/// offsets disjoint and inside state_bytes, step blocks above the state, no
/// two blocks that may be live at the same time sharing a byte, every
/// segment's values inside its scratch and disjoint while both live, and
/// everything inside arena_bytes (values sized by `bytes` and compute
/// copies by `copies` where given, as relayoutStep and layOutState laid
/// them out). On failure `error` names what is wrong.
bool checkArena(const Plan &plan, std::string &error,
                const ValueBytes *bytes = nullptr,
                const CopyBytes *copies = nullptr);

/// Where a plan's step needs the most memory: the instruction at which the
/// step blocks that may be live together add up to the most bytes, those
/// bytes, and the blocks live there (largest first).
struct PeakPoint {
  Pos at;
  int64_t bytes = 0;
  std::vector<int> blocks;
};
/// With `callsOnly`, only CALL instructions are candidates: a wait or a
/// transfer on a stream ordered loosely against the compute stream may see
/// nearly every block as possibly live, a kernel call the blocks that
/// really meet it.
PeakPoint findPeak(const Plan &plan, const StreamOrder &order,
                   const std::vector<Block> &blocks, bool callsOnly = false);

/// Checks that every rank of `plan` fits in `deviceBytes` of memory (its
/// recorded arena_bytes). Otherwise `error` names the ranks, what they need
/// (state and step), the position of the step's peak and the largest blocks
/// live there.
bool checkFits(const Plan &plan, int64_t deviceBytes, std::string &error);
/// "Will it fit?" for every rank of `plan` on a device of `deviceBytes`, in
/// one line: when it fits, "ranks 0, 1 (device class 0) fit: need 1.2 MiB
/// (state ..., step ...) of 80.0 GiB, 79.9 GiB to spare"; otherwise
/// checkFits's error. `fits` says which.
std::string fitVerdict(const Plan &plan, int64_t deviceBytes, bool &fits);

/// Lays out the arena of `plan` (stepBlocks + packBlocks), checks it with
/// verifyLayout and renders it as text: the persistent state (four float32
/// tensors per parameter: value, gradient, AdamW moments), the arena, their
/// sum beside the compiler's predicted peak, the `largest` largest blocks
/// with their offsets, and the step's peak (findPeak): where, how many bytes
/// are live there and the `largest` largest of them. Returns false, with the
/// reason in `text`, when the plan's streams deadlock or the layout fails its
/// check.
bool memoryReport(const Plan &plan, int largest, std::string &text,
                  const StorageBytes *sizes = nullptr);

} // namespace piper::plan

#endif // PIPER_PROTO_ANALYSIS_MEMORYPLAN_H

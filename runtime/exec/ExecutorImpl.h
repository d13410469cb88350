// Internal to runtime/exec: the executor's state and the methods its files
// share. Executor.cpp loads a plan; Streams.cpp runs a step on the stream
// workers; Instructions.cpp executes one instruction; Segments.cpp runs a
// CALL's kernels; Gradients.cpp holds all-reduce, clipping and the gradient
// norm; StateIO.cpp checkpoints (docs/runtime.md has the map).
#ifndef PIPER_RUNTIME_EXEC_EXECUTORIMPL_H
#define PIPER_RUNTIME_EXEC_EXECUTORIMPL_H

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "proto/PlanShards.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/Profile.h"
#include "runtime/exec/Tensor.h"
#include "runtime/hal/Hal.h"

namespace piper::runtime {

/// When each local value of a segment comes to life: it is zeroed in its
/// arena slot before its first kernel (arguments are never zeroed, nor
/// values their first kernel overwrites whole: Kernels.h
/// kernelReadsOutputs); a
/// packed bf16 argument is unpacked into its slot before its first reader.
struct SegmentLifetimes {
  std::vector<std::vector<int>> allocBefore; // per kernel: value ids
  std::vector<std::vector<int>> argsBefore;  // per kernel: argument positions
  /// Per kernel: the result positions whose value it writes last (a packed
  /// bf16 result is packed into its step buffer right after it).
  std::vector<std::vector<int>> resultsAfter;
};
SegmentLifetimes computeLifetimes(const plan::Segment &seg);

/// A kernel of a segment, resolved once when the plan loads: the call path
/// does no string lookup and no allocation for operand views.
struct ResolvedKernel {
  const KernelInfo *info = nullptr;
  /// The kernel's attributes, decoded once here (calls read them by id).
  KernelAttrs attrs;
  /// Mixed precision: reads bf16 parameter copies and rounds its outputs
  /// (every kernel but the optimizer and the gradient accumulators).
  bool lowPrecision = false;
  /// Mixed precision: the device's kernel rounds its outputs to bf16
  /// itself (Device::roundsOutputs; they are all values): the call does
  /// not round them after it.
  bool roundsOutputs = false;
  /// An `adamw` update (the gradient norm is taken just before it).
  bool adamw = false;
  /// An `adamw` of a ZeRO-sharded parameter: its operands are this rank's
  /// range of each piece of state (ExecutorImpl::rangeOf).
  bool onRange = false;
  /// Mixed precision, an `adamw` of a whole parameter: that parameter,
  /// whose bf16 copy the update writes (the next step reads it as it is);
  /// -1 otherwise (a ZeRO range is gathered after its update, and the copy
  /// is refreshed from the gathered master when first read).
  int writesCopyOf = -1;
  /// The first of two or more consecutive `adamw` kernels: the index past
  /// the last (Device::runAdamwCalls runs them together); 0 otherwise.
  int groupEnd = 0;
  int profileRow = 0;
  /// Per input: a value the kernel takes as packed bf16 where it is a
  /// packed argument of the segment (Device::readsPackedInput).
  std::vector<char> packedInputs;
  /// Per output: the kernel stores it packed where the segment stores that
  /// value so (PackedStorage).
  std::vector<char> packedOutputs;
  /// Operand views with dtypes and shapes filled in; a call sets `data`.
  std::vector<TensorRef> inputs, outputs;
};

/// Which of a segment's values a mixed-precision call keeps packed bf16
/// (docs/runtime.md, "Packed step buffers and values"), decided once when
/// the plan loads from its kernels' packedInputs and packedOutputs.
struct PackedStorage {
  /// Per argument: a packed one is unpacked into its slot before its first
  /// reader: some reader takes it as fp32, or it is also a result (stored
  /// from its slot when the call ends). Otherwise every reader takes the
  /// step buffer as it is and the slot goes unused.
  std::vector<char> unpacksArg;
  /// Per result: its one writer stores it packed, straight into its step
  /// buffer where that is packed, and every reader takes it packed.
  std::vector<char> packsResult;
  /// The other values so written and read: packed in the first half of
  /// their slot.
  std::vector<int> packedSlots;
};
PackedStorage planPackedStorage(const plan::Segment &seg,
                                const std::vector<ResolvedKernel> &resolved);

/// Per-stream scratch of segment calls, reused so that the call path does
/// not allocate once warm.
struct CallScratch {
  std::vector<void *> values; // by value id: its place in the arena
  /// By argument position: the packed bf16 step buffer to unpack into the
  /// argument's slot before its first reader, or null.
  std::vector<TensorPtr> packed;
  /// By value id: a packed bf16 argument's step buffer, which kernels
  /// taking it packed (ResolvedKernel::packedInputs) read; else null.
  std::vector<void *> packedValues;
  /// By result position: already packed into its step buffer.
  std::vector<char> stored;

  std::vector<TensorRef> inputs, outputs;
  /// A run of `adamw` kernels: their calls, and their gradients' spans.
  std::vector<AdamwCall> adamwCalls;
  std::vector<hal::SquaresSpan> spans;
};

/// One step buffer. No lock: a buffer is written once per step and its
/// readers are ordered after the write by stream order or events (checked by
/// validatePlan); the atomics carry that order.
struct BufferSlot {
  TensorPtr tensor;
  std::atomic<bool> written{false};
  std::atomic<int> readersLeft{0};
};

/// Everything shared by the streams of one step.
struct StepState {
  int64_t step = 0;
  /// Whether the step's device work is a capture launched (steps as
  /// graphs): the host issued none of its kernels.
  bool launched = false;
  std::unique_ptr<BufferSlot[]> buffers;
  std::atomic<bool> failed{false};
  std::mutex errorMu; // taken only when a stream fails
  Status error;
};

/// A started SEND: the plan keeps its buffer's arena bytes intact until the
/// step ends (the executor waits for sends before then).
struct PendingSend {
  TensorPtr tensor;
  CommWorkPtr work;
  std::string what; // "send of buffer ... to rank R (tag T)"
};

class ExecutorImpl {
public:
  /// First member: destroyed last, after every tensor it allocated.
  std::unique_ptr<hal::Device> device;
  hal::Allocator *memory = nullptr;
  /// One allocation of `allocator` (allocate, or allocateHost when
  /// `host`), freed with the executor, before the device.
  struct Block {
    hal::Allocator *allocator = nullptr;
    char *data = nullptr;
    size_t bytes = 0;
    bool host = false;
    ~Block() {
      if (data && host)
        allocator->deallocateHost(data, bytes);
      else if (data)
        allocator->deallocate(data, bytes);
    }
  };
  /// The one device allocation of the executor: plan.arena_bytes() bytes,
  /// where every tensor lives at the offset of the plan's memory plan
  /// (state from 0, step buffers at Buffer.offset, segment scratch and
  /// all-reduce staging at Instruction.scratch_offset).
  Block arena;
  char *at(int64_t offset) const { return arena.data + offset; }
  /// LOAD_BATCH's host staging (Allocator::allocateHost: page-locked on
  /// CUDA, so its copies are queued without the host waiting), in two
  /// halves of batchHalfBytes: step t's batches are in half t % 2, filled
  /// on the host before the step's streams start (prefetchBatches; during
  /// step t - 1 where it ran), so that LOAD_BATCH only queues their copies.
  /// A half is rewritten only for the step after next, after the
  /// end-of-step synchronization of the step that copied from it.
  Block batchStaging;
  size_t batchHalfBytes = 0;
  /// The plan's LOAD_BATCH instructions, in stream order: where each is,
  /// and its slot in each half (its tokens, then its targets).
  struct BatchLoad {
    int stream = 0, instruction = 0;
    size_t offset = 0;
  };
  std::vector<BatchLoad> batchLoads;
  /// batchLoads' index of each instruction, by stream (-1: not a
  /// LOAD_BATCH).
  std::vector<std::vector<int>> batchLoadOf;
  /// Per half: the step whose batches it holds (0: none), and per
  /// LOAD_BATCH (batchLoads order) the status of its fill, which its
  /// instruction returns (a data error fails the stream that loads it).
  int64_t batchStep[2] = {0, 0};
  std::vector<Status> batchFilled[2];
  /// Load `load`'s slot in half `half` of the staging.
  char *batchSlot(int half, const BatchLoad &load) const {
    return batchStaging.data + half * batchHalfBytes + load.offset;
  }
  /// Per buffer id: its view at Buffer.offset, as stored (packed bf16 in
  /// mixed precision).
  std::vector<TensorPtr> bufferViews;
  Communicator *comm = nullptr;
  /// One persistent stream (worker) and one event per plan stream / event.
  std::vector<std::unique_ptr<hal::Stream>> streams;
  std::vector<std::unique_ptr<hal::Event>> events;
  // Steps as graphs (StepGraphs.cpp).
  /// Why steps are not captured ("" : they are; "off": not asked).
  std::string graphRefusal = "off";
  /// Per parity of the step (the half of the batch staging it reads): the
  /// step captured, null until then.
  std::unique_ptr<hal::StepGraph> stepGraphs[2];
  /// Whether a step has run as usual since the captures were dropped
  /// (creation, invalidateCopies): the steps after it are steady.
  bool graphsWarm = false;
  int64_t captured = 0, replayed = 0;
  /// Where steps are captured, the all-to-alls move their rows through
  /// blocks of a fixed size (hal::Device::packRowBlocks), the same every
  /// step: per stream, device memory for its all-to-alls' send and receive
  /// blocks and sent counts (one all-to-all at a time on a stream: the
  /// next starts after the previous one's exchange has completed).
  struct BlockExchange {
    Block memory;
    size_t receiveOffset = 0, sentOffset = 0;
  };
  std::vector<BlockExchange> blockExchanges;
  /// Each all-to-all's blocks (`rows`: its input's) and its output's rows,
  /// in the order of their fault codes (device memory, one i32 each, zero
  /// until one fails); each instruction's index there by stream (-1: none).
  struct BlockedAllToAll {
    hal::RowBlocks blocks;
    int64_t outputRows = 0;
  };
  std::vector<BlockedAllToAll> blockedAllToAlls;
  Block blockFaults;
  std::vector<std::vector<int>> blockFaultOf;

  int64_t stateBytes = 0;
  /// The plan's arena_bytes as its file gave them (planStorage may lay the
  /// step out again, smaller).
  int64_t fileArenaBytes = 0;
  plan::Plan plan;
  ExecutorOptions options;
  std::string who; // "rank R"
  int replica = 0;
  std::unique_ptr<DataSource> ownedData;
  DataSource *data = nullptr;
  /// Per param: PARAM, GRAD, ADAM_M, ADAM_V at Operand::Kind - 1 (a ZeRO
  /// shard's piece is a buffer of shardCapacity elements).
  std::vector<std::array<TensorPtr, 4>> state;
  /// Per param: this rank's ZeRO range of its flattened elements (the whole
  /// tensor when it is not sharded); the member index is the replica index.
  std::vector<plan::ShardRange> shard;
  /// Piece `kind` (an Operand kind) of param `p` at this rank's range: the
  /// start of its shard buffer, or the range inside the whole tensor.
  float *rangeOf(int p, int kind) const {
    float *base = static_cast<float *>(stateOf(p, kind)->data);
    return plan::stateSharded(plan.params(p), kind - 1) ? base
                                                        : base + shard[p].start;
  }
  /// Whether param `p`'s optimizer state is sharded (its update, gradient
  /// norm and clipping see only this rank's range).
  bool zeroSharded(int p) const { return plan.params(p).has_sharding(); }
  std::vector<SegmentLifetimes> lifetimes;
  std::vector<std::vector<ResolvedKernel>> kernels; // [segment][kernel]
  std::vector<PackedStorage> packedStorage;         // [segment]
  std::vector<CallScratch> scratch;                 // [stream]
  /// distinctInputs[s][i]: the buffers instruction i of stream s reads,
  /// each once; a buffer dies after its last such read.
  std::vector<std::vector<std::vector<int>>> distinctInputs;
  std::vector<int> readerCount;
  /// Sends of a failed step: the communicator may still read them (the
  /// arena lives as long as the executor; a failed executor runs no more
  /// steps).
  std::mutex abandonedMu;
  std::vector<TensorPtr> abandoned;
  bool broken = false;

  // Gradients (Gradients.cpp).
  /// The global gradient norm of the last step, -1 before any.
  double lastGradNorm = -1;
  /// Whether the plan clips (CLIP_GRADS computes the norm); otherwise the
  /// executor computes it itself (see gradSquares).
  bool clips = false;
  /// Per param: whether an `adamw` kernel consumes its gradient (the norm is
  /// then taken just before the update, which zeroes the gradient after).
  std::vector<char> updated;
  /// Per param: whether a `zero` kernel of the plan clears its gradient;
  /// the others are cleared before every step but the first.
  std::vector<char> zeroedByPlan;
  /// Per param (slot p): the sum of squares of its gradient, kept on the
  /// device until the step reads them all at once (gpu-review C.12): one
  /// device-to-host copy per step, no host synchronization per parameter.
  /// Without CLIP_GRADS an updated parameter's slot is measured by the one
  /// stream updating it, just before the update.
  std::unique_ptr<hal::SquareSums> squares;
  /// The slots as read back (host memory).
  std::vector<double> gradSquares;
  /// The step's loss, one accumulator per stream in device memory (the
  /// kernels of stream s add to slot s): zeroed before each step, read once
  /// after it into StepState::loss.
  std::unique_ptr<hal::LossSums> lossSums;
  /// Whether a step has run (gradient accumulators may be dirty).
  bool ranStep = false;
  /// The number of the last step run (0: none).
  int64_t lastStep = 0;

  /// Mixed precision (training.compute_dtype == BF16): kernels read bf16
  /// copies of the fp32 master parameters. The `adamw` updating a whole
  /// parameter writes its copy for the next step; any other copy (the first
  /// step's, a ZeRO-gathered parameter's, one loaded from a checkpoint) is
  /// refreshed from the master once per step by the first stream that reads
  /// it (on that stream: asynchronous on a GPU).
  bool bf16 = false;
  std::mutex bf16Mu;
  std::vector<TensorPtr> bf16Params;
  /// Per param: whether its bf16 copy is stored packed (in a slot of its
  /// bf16 bytes), as every kernel reading it takes it (planPackedParams).
  std::vector<char> packedParam;
  /// The sizes planStorage laid the plan out with (empty or -1: float32).
  plan::StorageBytes storageBytes;
  /// Per param: the step whose copy bf16Params holds (0: none; the copy is
  /// refreshed when first read).
  std::vector<int64_t> bf16Step;
  /// Per stream and param: the last step whose copy the stream has (it
  /// refreshed it, or waited for it); each stream touches only its own row.
  std::vector<std::vector<int64_t>> bf16Seen;
  /// Per param (plans with several streams): an event the refreshing
  /// stream signals after the refresh, which the other streams reading the
  /// copy wait for (gpu-review B.7).
  std::vector<std::unique_ptr<hal::Event>> bf16Ready;

  Profiler profiler;
  StepTracer tracer;

  // Live position (Executor::position, for a watchdog): relaxed atomics,
  // two stores per instruction. streamAt points into streamAtStore once the
  // first step allocates it: per stream the instruction reached, then per
  // stream the instruction whose execution began (2 x plan.streams_size()).
  std::unique_ptr<std::atomic<int>[]> streamAtStore;
  std::atomic<std::atomic<int> *> streamAt{nullptr};
  std::atomic<int64_t> posStep{0};
  std::atomic<int> posPhase{0};
  std::atomic<int64_t> posFilling{0};
  std::atomic<int> failedStream{-1};

  // Loading (Executor.cpp, Segments.cpp).
  Status init(uint64_t seed);
  /// `bytes` of device memory into `block`; an error says `context` first.
  Status allocateDevice(Block &block, size_t bytes, const std::string &context);
  Status resolveKernels();
  /// Kernel k of segment g's device entry and mixed-precision storage:
  /// info, lowPrecision, roundsOutputs, packedInputs and packedOutputs.
  Status resolveStorage(int g, int k, ResolvedKernel &r) const;
  /// Each kernel's device entry and storage (kernels, resolveStorage; the
  /// rest by resolveKernels), which values each segment keeps packed on
  /// this device (packedStorage)
  /// and, where it keeps some, the step's memory plan laid out again for
  /// that storage (plan::relayoutStep: a packed value in half its float32
  /// bytes, one written to or read from its step buffer as stored in
  /// none; plan::layOutState: the packed parameter copies in half theirs),
  /// before the arena is allocated, with those sizes in storageBytes. The
  /// plan file stays device-agnostic.
  Status planStorage();
  /// Device::prepareKernel for every kernel of every segment a stream
  /// calls, on that stream (after resolveKernels and the streams).
  Status prepareKernels();
  void analyzeGradients();

  // A step (Streams.cpp).
  Status runStep(int64_t step, double &loss);
  void runStream(int s, StepState &st);
  /// Why this plan's steps cannot be captured on this device with these
  /// options, "" when they can.
  std::string stepGraphRefusal() const;
  /// Runs step st.step's streams: their instructions issued by the host
  /// (runStream), captured as they are issued, then launched, or the
  /// step's capture launched (ExecutorOptions::stepGraphs). Returns once
  /// the host has issued its work, after prefetching the next step's
  /// batches; failures go to fail().
  void issueStep(StepState &st);
  /// Enqueues every stream's instructions for step st.step (runStream).
  void issueStreams(StepState &st);
  /// Captures step st.step into `graph` as the host issues it, then
  /// launches it; failures go to fail().
  void captureStep(StepState &st, std::unique_ptr<hal::StepGraph> &graph);
  /// Launches the capture `graph` for step st.step: its batches' fills
  /// checked as LOAD_BATCH checks them, then the step's constants written;
  /// false after a failure (fail()).
  bool replayStep(hal::StepGraph &graph, StepState &st);
  /// Drops the captures (the next step runs as usual, then captures).
  void dropStepGraphs();
  /// Records the first failure of the step and wakes every waiter.
  void fail(StepState &st, const Status &status);
  /// Records stream `s` as the failed one, unless one already is.
  void markFailed(int s);
  ExecPosition position() const;

  // Instructions (Instructions.cpp).
  Status execute(int s, int i, StepState &st,
                 std::vector<PendingSend> &pendingSends);
  /// The buffer as stored (packed bf16 in mixed precision).
  Status fetchStored(StepState &st, int id, TensorPtr &out);
  /// Marks buffer `id` written (its bytes are at its arena offset).
  Status publish(StepState &st, int id);
  /// Whether buffer `id` is stored as packed bf16.
  bool packed(int id) const;
  void release(StepState &st, const std::vector<int> &ids);

  // Segment calls (Segments.cpp). `accounted`: with profiling, the
  // nanoseconds spent in kernels and allocations (the rest of the CALL is
  // the executor's own overhead).
  Status call(int s, const plan::Instruction &inst, StepState &st,
              int64_t &accounted);
  /// Packs result position `r` of a CALL from its scratch value into its
  /// packed bf16 step buffer; false in `packed` when the result is not
  /// such a one.
  Status packResult(const plan::Instruction &inst, const plan::Segment &seg,
                    const std::vector<void *> &values, int r, bool &packed);
  /// Stores a CALL's results (`values`, by value id) into its step buffers,
  /// except those `stored` says are packed already, and publishes them.
  Status storeResults(const plan::Instruction &inst, const plan::Segment &seg,
                      const std::vector<void *> &values,
                      const std::vector<char> &stored, StepState &st);
  /// The bf16 copy of parameter `p` for stream `s` in this step: refreshed
  /// on `s` when it is the first to read it, else ordered after the
  /// refresh.
  Status computeParam(int s, int p, StepState &st, void *&out);
  /// Mixed precision, with packed step buffers: packedParam, the copies
  /// every low-precision reader takes packed (Device::readsPackedInput:
  /// GEMM weights on the GPU backends), which their update or refresh
  /// writes packed (bf16Params is viewed so), no GEMM packs again per call
  /// and the state region gives half their float32 bytes (planStorage).
  void planPackedParams();
  /// Copies parameter `p` into its bf16 copy and rounds it there.
  Status refreshParam(int p);
  /// After an `adamw` on stream `s` of step `step` wrote parameter p's bf16
  /// copy: it is the copy of step + 1 (signalled for the other streams).
  Status copyWritten(int p, int64_t step);
  /// The parameters were written from outside a step (a checkpoint loaded):
  /// every bf16 copy is refreshed when next read.
  void invalidateCopies();

  // Value-level collectives (Collectives.cpp): ALL_REDUCE of buffers,
  // REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL.
  Status collective(int s, const plan::Instruction &inst, StepState &st);
  /// ALL_TO_ALL, instruction i of stream s: its counts read on the host, or
  /// where steps are captured its rows moved through fixed blocks.
  Status allToAll(int s, int i, StepState &st);
  Status allToAllBlocks(int s, int i, StepState &st, const CommKey &key,
                        const std::string &what);
  /// Where steps are captured: the staging of the plan's all-to-alls and
  /// their fault codes (allocated when the executor is created).
  Status allocateBlockExchanges();
  /// The all-to-alls' fault codes after a step: "" when none failed, else
  /// what the first one that failed says.
  StatusOr<std::string> blockExchangeFaults(int64_t step);
  /// How buffer `id` is communicated: bf16 when packed, else its dtype.
  CommDType commType(int id) const;

  // Gradients (Gradients.cpp).
  Status allReduce(int s, const plan::Instruction &inst);
  /// ZeRO (Zero.cpp): REDUCE_SCATTER_GRADS and ALL_GATHER_PARAMS.
  Status reduceScatterGrads(int s, const plan::Instruction &inst,
                            StepState &st);
  Status allGatherParams(int s, const plan::Instruction &inst, StepState &st);
  /// Elements of the largest member range among the instruction's params.
  int64_t zeroRangeStaging(const plan::Instruction &inst) const;
  /// CLIP_GRADS on stream `s`: the norm and the clip factor computed and
  /// applied on the device, with no host read (hal::SquareSums).
  Status clipGrads(int s);
  /// Zeroes the gradients no plan kernel clears (before steps 2, 3, ...).
  Status clearGradients();
  /// batchStaging and batchLoads, for the plan's LOAD_BATCH instructions
  /// (after bufferViews).
  Status allocateBatchStaging();
  /// Fills step `step`'s batches into half step % 2 of batchStaging, on
  /// the calling (host) thread, unless that half holds them already.
  void prefetchBatches(int64_t step);
  /// This rank's share of the squared gradient norm when the plan does not
  /// clip (0 when it does); finishGradNorm takes the world sum.
  Status localGradSquares(double &sum);
  /// Measures the squared gradient of every parameter (but those updated
  /// this step, with `skipUpdated`) into its slot of `squares`, queued on
  /// the calling stream.
  Status measureGradSquares(bool skipUpdated);
  /// The gradient of param `p` the norm and clipping see: the whole
  /// accumulator, or this rank's range of it under ZeRO; its weight in the
  /// world sum of squares.
  float *gradOf(int p) const;
  /// gradOf(p) as a span measured into slot p.
  hal::SquaresSpan gradSpan(int p) const;
  int64_t gradElements(int p) const;
  double shareWeight(int p) const;
  void finishGradNorm(double worldSquares);
  /// "non-finite <what> at step <step> (<value>): the training diverged
  /// ...": the one message of a diverged run.
  static std::string divergedMessage(const char *what, int64_t step,
                                     double value);
  /// A diverged error (Status::diverged) when the step's world loss or
  /// gradient norm is not finite.
  Status checkDivergence(int64_t step, double loss) const;

  int peerOf(const plan::Instruction &inst) const {
    return plan.groups(inst.peer_group()).ranks(replica);
  }
  /// The ranks this rank runs collective `inst` with (its group, or its
  /// subgroup of it), in increasing order.
  std::vector<int> memberRanks(const plan::Instruction &inst) const;
  const TensorPtr &stateOf(int index, int kind) const {
    return state[index][kind - 1];
  }
  std::string describeBuffer(int id) const;
};

} // namespace piper::runtime

#endif // PIPER_RUNTIME_EXEC_EXECUTORIMPL_H

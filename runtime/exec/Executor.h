// The plan executor: runs the streams of one plan on one rank, step by step.
#ifndef PIPER_RUNTIME_EXEC_EXECUTOR_H
#define PIPER_RUNTIME_EXEC_EXECUTOR_H

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "proto/analysis/MemoryPlan.h"
#include "proto/plan.pb.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/Data.h"
#include "runtime/formats/Safetensors.h"
#include "runtime/hal/Hal.h"
#include "runtime/kernels/Kernels.h"
#include "support/Status.h"

namespace piper::runtime {

/// How an Executor runs: who it is and what it talks to.
struct ExecutorOptions {
  /// This process's world rank; must be one of plan.ranks.
  int rank = 0;
  /// Keys parameter initialization and the synthetic data.
  uint64_t seed = 0;
  /// The id of the run (runtime/formats/Integrity.h), recorded as
  /// piper.run_id in every safetensors file the executor writes; empty
  /// records none. Executor::setRunId changes it.
  std::string runId;
  /// Not owned. May be null only when world_size is 1 and the plan has no
  /// communication with other ranks.
  Communicator *comm = nullptr;
  /// Not owned. Null means SyntheticData(seed, training.vocab_size).
  DataSource *data = nullptr;
  /// Called on the failing stream's thread as soon as any stream fails,
  /// before other streams are stopped. A launcher uses it to report the
  /// error and exit at once rather than wait for peers to time out.
  std::function<void(const Status &)> onStreamError;
  /// Creates the device the executor runs on, given `comm`; null means the
  /// CPU backend (hal::createCpuDevice). Another backend plugs in here.
  std::function<std::unique_ptr<hal::Device>(Communicator *comm)> createDevice;
  /// Times every kernel (by op name) and every other instruction (by kind),
  /// per stream; read with Executor::profile(). Off, no clock is read.
  bool profile = false;
  /// Mixed precision: kernels that take a packed bf16 step buffer as it is
  /// stored (hal::Device::readsPackedInput: the GPU backends' GEMMs) get
  /// it so, and kernels that store a result packed (writesPackedOutput:
  /// the fused classifier's dlogits) write it into its step buffer; off
  /// (piper-run --unpack-step-buffers), every packed argument is unpacked
  /// to fp32 first and every result packed from fp32 after its writer, as
  /// before: the same bits, more passes.
  bool packedStepBuffers = true;
  /// Whether steps run as captured graphs (piper-run --step-graph; docs/
  /// runtime.md, "Steps as graphs"): after a step run as usual, the next
  /// two (one per half of the batch staging) are captured as they run, and
  /// later steps launch the capture of their parity, the host issuing no
  /// kernel. `On` refuses, when the executor is created, a plan or device
  /// that cannot (stepGraphRefusal says why); `Auto` then runs steps as
  /// usual.
  enum class StepGraphs { Off, Auto, On };
  StepGraphs stepGraphs = StepGraphs::Off;
  /// A cap on the device memory this rank may use (piper-run
  /// --device-memory), in bytes; -1: none. The plan is refused before
  /// anything is allocated when its arena exceeds the cap or what the
  /// device reports free (hal::Allocator::availableBytes).
  int64_t deviceMemory = -1;
  /// Records when every instruction of 1-based step `traceStep` starts and
  /// ends, on every stream (piper-run --trace); read with
  /// Executor::stepTrace(). -1 records nothing and reads no clock.
  int64_t traceStep = -1;
  /// A test aid (PIPER_FAULT, docs/operations.md): `onFault` runs on the
  /// thread of stream `faultStream` just before instruction
  /// `faultInstruction` of step `faultStep` (after the position shows it).
  /// -1 never matches.
  int64_t faultStep = -1;
  int faultStream = -1;
  int faultInstruction = -1;
  /// Whether `onFault` runs just after the position shows the instruction
  /// begun (ExecPosition::entered) rather than just before.
  bool faultInside = false;
  std::function<void()> onFault;
  /// `onDataFault` runs on the thread that fills the batches, just before
  /// it fills those of step `faultDataStep` (after the position shows it:
  /// ExecPosition::filling). -1 never matches.
  int64_t faultDataStep = -1;
  std::function<void()> onDataFault;
};

/// Where an executor is, read from another thread (a watchdog) with relaxed
/// atomic loads: the executor stores one int per instruction.
struct ExecPosition {
  enum Phase { kIdle = 0, kStreams = 1, kLossAllReduce = 2 };
  /// The step running, or the last one run (0 before the first).
  int64_t step = 0;
  /// kStreams while the plan streams run, kLossAllReduce in the step's
  /// final loss all-reduce over all ranks, kIdle between steps.
  int phase = kIdle;
  /// Per plan stream: the instruction running (or last run) in this step;
  /// the stream's instruction count when it has run them all (then it waits
  /// for its sends, or is done); -1 before its first instruction.
  std::vector<int> instruction;
  /// Per plan stream: the instruction whose execution began (-1 before the
  /// first). Below `instruction` while a stream has reached an instruction
  /// but not started it: a rank stuck there has not entered that
  /// communication, so it waits on nobody; its peers, which entered it,
  /// wait on it (the watchdog's culprit).
  std::vector<int> entered;
  /// The stream whose failure was reported first, -1 if none.
  int failedStream = -1;
  /// The step whose batches the executor is filling from the data source
  /// (on the thread running the steps: before a step's streams start, or
  /// the next step's while they run), 0 when it is not.
  int64_t filling = 0;
};

/// One row of the runtime profile (ExecutorOptions::profile): a kernel op
/// such as "linear", an instruction kind such as "SEND" or "WAIT", or the
/// executor's own work inside CALL instructions ("CALL alloc", the zeroed
/// allocation of segment values; "CALL other", the rest outside kernels).
struct ProfileEntry {
  std::string name;
  int64_t count = 0;
  double seconds = 0; // wall time summed over calls and streams
};

/// The measured timeline of one step (ExecutorOptions::traceStep). Times
/// are steady_clock nanoseconds since its epoch: CLOCK_MONOTONIC, which the
/// processes of one host share.
struct StepTrace {
  struct Span {
    int64_t startNs = -1; // -1: the instruction did not run
    int64_t endNs = -1;
  };
  /// The step recorded; 0 until it has run to the end.
  int64_t step = 0;
  /// When runStep started the streams, and when the last of them finished
  /// (its asynchronous sends completed; before the step's loss all-reduce).
  int64_t startNs = 0;
  int64_t endNs = 0;
  /// [stream][instruction], in plan order.
  std::vector<std::vector<Span>> streams;
};

class ExecutorImpl;

/// Whole tensors read by flat element ranges: a sharded checkpoint, whose
/// files hold slices written by different ranks.
class StateSource {
public:
  virtual ~StateSource() = default;
  /// Fills `out` with elements [start, start + count) of the flattened
  /// tensor `name`; an error when the source does not hold all of them.
  virtual Status read(const std::string &name, int64_t start, int64_t count,
                      float *out) const = 0;
};

/// The learning-rate multiplier of 1-based `step`: linear warmup over
/// warmup_steps, then cosine decay from lr to min_lr at decay_steps (see
/// plan.proto TrainingConfig).
double scheduleScale(const plan::TrainingConfig &training, int64_t step);

/// Runs one plan on one rank, on a HAL device (runtime/hal; the CPU backend
/// today). It owns the persistent state (each parameter, its gradient
/// accumulator and AdamW moments, all fp32) and, per step, the transient
/// buffers. Gradient accumulators hold the last step's gradients: those no
/// plan kernel clears are zeroed before every step but the first. After
/// runStep returns an error, the executor must not run again.
class Executor {
public:
  /// Validates `plan` (against the kernels runKernel knows), allocates the
  /// persistent state and initializes the parameters. Returns null and sets
  /// `status` on error.
  static std::unique_ptr<Executor>
  create(plan::Plan plan, const ExecutorOptions &options, Status &status);
  /// `plan` (validated) as an executor on `options.createDevice`'s device
  /// (made without a communicator; null: the CPU) lays it out when it
  /// loads: where the device stores values or parameter copies packed, the
  /// state and the step laid out again at those sizes (plan(),
  /// docs/runtime.md, "Packed step buffers and values"); else unchanged.
  /// Nothing is allocated, no kernel prepared: "how much memory on that
  /// backend?" without its hardware (piper-plan --backend). `sizes`
  /// receives what the layout sized otherwise than the plan file (for
  /// plan::checkArena and plan::memoryReport).
  static StatusOr<plan::Plan> deviceLayout(plan::Plan plan,
                                           const ExecutorOptions &options,
                                           plan::StorageBytes &sizes);
  ~Executor();

  /// The communicators this plan needs: one per (stream, peer pair) of
  /// SEND/RECV and one per (stream, group) of ALL_REDUCE over two or more
  /// ranks.
  std::vector<CommKey> commKeys() const;
  /// Connects every communicator of commKeys(); call once before runStep.
  Status connect();

  /// Runs 1-based step `step`: every plan stream on its persistent device
  /// stream (created once, at create), concurrently; then sums the loss
  /// accumulators of all ranks into `loss`. Errors read
  /// "rank R, stream 'S', instruction I (LABEL): message". Steps must
  /// increase from one call to the next (they may skip: a step's data and
  /// its learning rate depend on its number alone); the plan's events count
  /// steps, so an earlier step is refused.
  Status runStep(int64_t step, double &loss);

  /// The global gradient norm of the last step (before clipping), computed
  /// every step with CLIP_GRADS's definition whether or not the plan clips;
  /// -1 before the first step.
  double lastGradNorm() const;

  /// The live position of every stream (cheap; any thread, any time).
  ExecPosition position() const;

  /// With ExecutorOptions::profile: the time accumulated since creation or
  /// the last resetProfile(), one entry per op or instruction kind that ran,
  /// sorted by decreasing time. Call between steps only.
  std::vector<ProfileEntry> profile() const;
  /// With ExecutorOptions::profile and a device created with
  /// DeviceOptions::timeLaunches (--profile=gpu): the device time of its
  /// launches since the same reset; empty otherwise.
  hal::LaunchTimes launchTimes() const;
  void resetProfile();
  /// With ExecutorOptions::traceStep: that step's timeline once it has run
  /// (StepTrace::step is 0 before). Call between steps only.
  const StepTrace &stepTrace() const;
  /// Why steps are not captured (ExecutorOptions::stepGraphs), "" where
  /// they are; "off" when the options did not ask.
  const std::string &stepGraphRefusal() const;
  /// How many steps were captured, and how many launched a capture made
  /// before (ExecutorOptions::stepGraphs), so far.
  int64_t capturedSteps() const;
  int64_t replayedSteps() const;

  /// What this device stores as packed bf16 in a mixed-precision plan
  /// (docs/runtime.md, "Packed step buffers and values", "Packed parameter
  /// copies"), counted over the plan's segments as written (not per call):
  /// results that their kernel writes straight into their packed step
  /// buffer, other values stored packed in their slot, arguments that every
  /// reader takes as their step buffer is stored (not unpacked), and
  /// parameters whose bf16 copy is kept packed. All 0 in fp32 plans and
  /// with ExecutorOptions::packedStepBuffers off.
  struct PackedCounts {
    int64_t results = 0, values = 0, arguments = 0, paramCopies = 0;
  };
  PackedCounts packedCounts() const;

  /// Bytes of tensor storage alive now / at most so far (persistent state
  /// plus every step buffer and segment value, as allocated), and the bytes
  /// of the persistent state alone (parameters, gradients, AdamW moments).
  int64_t liveBytes() const;
  int64_t peakBytes() const;
  int64_t stateBytes() const;
  /// The learning-rate multiplier of 1-based `step` from the plan's schedule.
  double lrScale(int64_t step) const;
  /// The device's peak FLOP/s (hal::Device::peakFlops); 0 when unknown.
  double peakFlops() const;

  /// The run id its files record (ExecutorOptions::runId), and a change of
  /// it before the first save (it is agreed on once the ranks connect).
  const std::string &runId() const;
  void setRunId(const std::string &runId);

  /// This rank's position in plan.ranks.
  int replicaIndex() const;
  /// The plan as this executor runs it: the plan file's, with the step's
  /// memory plan laid out again where the device stores values packed
  /// (docs/runtime.md, "Packed step buffers and values").
  const plan::Plan &plan() const;
  /// The plan file's arena_bytes (before any such layout).
  int64_t fileArenaBytes() const;
  /// A piece of the persistent state of Plan.params[index]; `kind` is PARAM,
  /// GRAD, ADAM_M or ADAM_V.
  /// Its data is device memory: read it on the host with stateToHost.
  /// Read-only: state is written by steps and the load functions (which
  /// also renew the bf16 copies a mixed-precision step reads).
  TensorRef state(int index, plan::Operand::Kind kind) const;
  /// Copies state(index, kind) to host memory, into `out` (resized; its
  /// capacity is reused; empty for a bad index); an error when the device
  /// copy fails.
  Status stateToHost(int index, plan::Operand::Kind kind,
                     std::vector<float> &out) const;
  /// Writes every parameter to DIR/<name>.bin (raw little-endian fp32),
  /// creating DIR if needed. Replica 0 writes; under ZeRO-3 every replica
  /// must call it (each contributes its shards).
  Status saveParams(const std::string &dir) const;
  /// The name and shape of every parameter, in plan order.
  std::vector<ParamSpec> paramSpecs() const;
  /// The same as this rank holds them: a tensor-parallel slice or an
  /// expert block in its local shape (what state() holds).
  std::vector<ParamSpec> heldParamSpecs() const;
  /// Writes every parameter to the safetensors file `path` (F32, the plan's
  /// names and shapes, in plan order, checkpointMetadata(step, runId) and
  /// every tensor's CRC-32) atomically.
  Status saveCheckpoint(const std::string &path, int64_t step) const;
  /// Writes every gradient accumulator instead of the parameters (same
  /// names), e.g. after a step of a plan compiled with --no-optimizer.
  Status saveGradients(const std::string &path, int64_t step) const;
  /// Replaces the value of every parameter by the tensor of the same name in
  /// `reader`; call before the first step. A missing tensor or one of
  /// another dtype or shape is an error naming it; tensors that are not
  /// parameters of this plan are ignored (other device classes hold them).
  /// Gradients and AdamW moments stay zero.
  Status loadCheckpoint(const SafetensorsReader &reader);
  /// Writes the AdamW moments of every parameter to the safetensors file
  /// `path`: "<name>.exp_avg" (ADAM_M) and "<name>.exp_avg_sq" (ADAM_V),
  /// F32, in plan order, with the metadata saveCheckpoint writes, atomically.
  Status saveOptimizerState(const std::string &path, int64_t step) const;
  /// Replaces the AdamW moments of every parameter by the tensors
  /// saveOptimizerState names in `reader`; call before the first step. A
  /// missing tensor or one of another dtype or shape is an error naming it;
  /// others are ignored.
  Status loadOptimizerState(const SafetensorsReader &reader);
  /// Replaces the parameters (from `model`) and AdamW moments (from
  /// `optimizer`, named as saveOptimizerState names them) by tensors of
  /// heldParamSpecs' shapes, copied as they are: the state a replica that
  /// holds the same slices wrote (--standby's handoffs). Not for ZeRO
  /// ranges (an error). A missing tensor or one of another dtype or shape
  /// is an error naming it.
  Status loadHeldState(const SafetensorsReader &model,
                       const SafetensorsReader &optimizer);

  /// A sharded checkpoint file: the parameters and AdamW moments this rank
  /// alone holds (its ZeRO ranges, its expert block when it is in the first
  /// expert group, the whole tensors on replica 0), each a 1-D tensor of
  /// the full name with metadata "piper.slices" = {"<tensor>": [start,
  /// global shape...]} and saveCheckpoint's metadata. Writes nothing (and
  /// returns ok) when this rank holds nothing of its own. Every rank calls
  /// it; no collective.
  Status saveShards(const std::string &path, int64_t step) const;
  /// Loads the parameters and, with `moments`, the AdamW moments (this
  /// rank's ranges of them) from `source`; call before the first step.
  Status loadShards(const StateSource &source, bool moments = true);

  /// Whether the plan holds ZeRO-sharded state: then every replica of the
  /// class must call the save functions together (each contributes its
  /// shards; replica 0 writes whole tensors), and the others return without
  /// writing.
  bool shardsState() const;
  /// The stream name of the communicators that gather ZeRO shards for a
  /// checkpoint (one per shard group, in commKeys()).
  static constexpr const char *kStateStream = "zero_state";

private:
  /// Piece `kind` of param `p` as one whole tensor on replica 0 (`out`
  /// stays empty elsewhere); under ZeRO every replica must call it.
  Status wholeState(int p, int kind, std::vector<char> &out) const;
  Status saveState(const std::string &path, int64_t step,
                   const std::vector<int> &kinds) const;
  Status loadState(const SafetensorsReader &reader, int kind);
  explicit Executor(std::unique_ptr<ExecutorImpl> impl);
  std::unique_ptr<ExecutorImpl> impl;
};

} // namespace piper::runtime

#endif // PIPER_RUNTIME_EXEC_EXECUTOR_H

// The plan executor: persistent parameter state, per-step buffers, one thread
// per stream, events, kernels and communication.
#include "runtime/exec/Executor.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>

#include "runtime/exec/Init.h"
#include "runtime/exec/Precision.h"
#include "runtime/exec/Validate.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "--save-params writes the host's floats as little endian");

namespace piper::runtime {

using plan::Instruction;
using plan::Operand;

namespace {

using Clock = std::chrono::steady_clock;

int64_t nanosSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() -
                                                              start)
      .count();
}

/// Bytes of tensor storage alive in one executor and their high-water mark,
/// and the storage of freed tensors kept for reuse. Shared by every tensor it
/// allocates, so that a tensor outliving a step (an abandoned send) still
/// reports its release.
///
/// Every step allocates the same buffers in the same order, so freed blocks
/// are kept by exact size and handed out again: after the first step no
/// large allocation goes back to the kernel (page faults and zeroing of fresh
/// pages, about 6% of a GPT-2 small step). `live` and `peak` count tensors
/// only, not the kept blocks (the process RSS includes them).
struct MemoryTracker {
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};

  std::mutex mu;
  std::unordered_map<size_t, std::vector<void *>> kept; // by block size
  size_t keptBytes = 0;

  ~MemoryTracker() {
    for (auto &[size, blocks] : kept)
      for (void *block : blocks)
        std::free(block);
  }

  void add(int64_t bytes) {
    int64_t now = live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t seen = peak.load(std::memory_order_relaxed);
    while (now > seen &&
           !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  void sub(int64_t bytes) { live.fetch_sub(bytes, std::memory_order_relaxed); }

  /// A 64-byte aligned block of `size` bytes (a multiple of 64), reused when
  /// one is kept; null when out of memory.
  void *acquire(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = kept.find(size);
      if (it != kept.end() && !it->second.empty()) {
        void *block = it->second.back();
        it->second.pop_back();
        keptBytes -= size;
        return block;
      }
    }
    return std::aligned_alloc(64, size);
  }
  /// Keeps `block` for reuse, unless the kept blocks would then outgrow the
  /// peak of live tensors (a bound a repeating step never reaches).
  void release(void *block, size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (keptBytes + size <= static_cast<size_t>(peak.load())) {
        kept[size].push_back(block);
        keptBytes += size;
        return;
      }
    }
    std::free(block);
  }
};

/// Owned, zero-filled, 64-byte aligned storage of one dense tensor. Buffers
/// are shared: a SEND keeps its tensor alive until the step's sends are
/// waited for, even after the buffer's last reader has let go of it.
struct HostTensor {
  plan::DType dtype = plan::F32;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  void *data = nullptr;
  size_t blockSize = 0;                   // bytes of `data`'s block
  std::shared_ptr<MemoryTracker> tracker; // null: plain free, not counted

  HostTensor() = default;
  HostTensor(const HostTensor &) = delete;
  HostTensor &operator=(const HostTensor &) = delete;
  ~HostTensor() {
    if (!tracker) {
      std::free(data);
    } else if (data) {
      tracker->sub(bytes);
      tracker->release(data, blockSize);
    }
  }
  TensorRef ref() const { return TensorRef{dtype, shape, data}; }
};
using TensorPtr = std::shared_ptr<HostTensor>;

/// Allocates a zeroed tensor of `type` (already validated), counted by
/// `tracker`, or returns an error naming what `describe()` returns (called
/// only then: segment values are allocated hundreds of times per step).
template <typename Describe>
Status allocateTensorAs(const plan::TensorType &type, const Describe &describe,
                        const std::shared_ptr<MemoryTracker> &tracker,
                        TensorPtr &out) {
  auto t = std::make_shared<HostTensor>();
  t->dtype = type.dtype();
  t->shape.assign(type.shape().begin(), type.shape().end());
  t->bytes = tensorBytes(type);
  if (t->bytes < 0)
    return Status::error(describe() + " has an invalid shape");
  size_t size = (static_cast<size_t>(t->bytes) + 63) / 64 * 64;
  if (size == 0)
    size = 64;
  t->data = tracker ? tracker->acquire(size) : std::aligned_alloc(64, size);
  if (!t->data)
    return Status::error("out of memory allocating " + describe() + " (" +
                         std::to_string(t->bytes) + " bytes)");
  zeroBytes(t->data, static_cast<int64_t>(size));
  t->blockSize = size;
  t->tracker = tracker;
  if (tracker)
    tracker->add(t->bytes);
  out = std::move(t);
  return Status::ok();
}

Status allocateTensor(const plan::TensorType &type, const std::string &what,
                      const std::shared_ptr<MemoryTracker> &tracker,
                      TensorPtr &out) {
  return allocateTensorAs(
      type, [&] { return what; }, tracker, out);
}

/// Wall time and count of one profile row, owned by one stream's thread.
struct ProfileSlot {
  int64_t count = 0;
  int64_t nanos = 0;
  void add(int64_t ns) {
    ++count;
    nanos += ns;
  }
};

/// When each local value of a segment comes to life and dies, so that a
/// call holds only the values it still needs.
struct SegmentLifetimes {
  std::vector<std::vector<int>> allocBefore; // per kernel
  std::vector<std::vector<int>> freeAfter;   // per kernel
};

SegmentLifetimes computeLifetimes(const plan::Segment &seg) {
  int n = seg.values_size();
  std::vector<int> first(n, -1), last(n, -1);
  std::vector<char> pinned(n, 0); // args and results outlive the kernels
  for (int a : seg.args())
    pinned[a] = 1;
  for (int r : seg.results())
    pinned[r] = 1;
  for (int k = 0; k < seg.kernels_size(); ++k) {
    auto touch = [&](const Operand &op) {
      if (op.kind() != Operand::VALUE)
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
  std::vector<char> isArg(n, 0);
  for (int a : seg.args())
    isArg[a] = 1;
  SegmentLifetimes lt;
  lt.allocBefore.resize(seg.kernels_size());
  lt.freeAfter.resize(seg.kernels_size());
  for (int v = 0; v < n; ++v) {
    if (isArg[v] || first[v] < 0)
      continue;
    lt.allocBefore[first[v]].push_back(v);
    if (!pinned[v])
      lt.freeAfter[last[v]].push_back(v);
  }
  return lt;
}

/// A started SEND: its buffer stays alive until the work completes.
struct PendingSend {
  TensorPtr tensor;
  CommWorkPtr work;
  std::string what; // "send of buffer ... to rank R (tag T)"
};

/// Everything shared by the stream threads of one step.
struct StepState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> recorded;
  std::vector<TensorPtr> buffers;
  std::vector<char> written;
  std::vector<int> readersLeft;
  bool failed = false;
  Status error;
  std::vector<double> loss; // per stream, so kernels never share an adder
};

// strerror() capitalizes; runtime messages are lowercase.
std::string errnoText(int err) {
  std::string s = std::strerror(err);
  if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z')
    s[0] = static_cast<char>(s[0] - 'A' + 'a');
  return s;
}

} // namespace

double scheduleScale(const plan::TrainingConfig &t,
                     int64_t step) {
  const double peak = t.lr();
  if (t.warmup_steps() > 0 && step <= t.warmup_steps())
    return double(step) / double(t.warmup_steps());
  if (peak <= 0 || t.decay_steps() <= t.warmup_steps())
    return 1.0;
  double progress = double(step - t.warmup_steps()) /
                    double(t.decay_steps() - t.warmup_steps());
  progress = std::min(1.0, std::max(0.0, progress));
  const double pi = 3.14159265358979323846;
  double lr = t.min_lr() + 0.5 * (1.0 + std::cos(pi * progress)) *
                               (peak - t.min_lr());
  return lr / peak;
}

namespace {

std::string describeBuffer(const plan::Plan &plan, int id) {
  const std::string &name = plan.buffers(id).name();
  return name.empty() ? "buffer " + std::to_string(id)
                      : "buffer '" + name + "' (id " + std::to_string(id) + ")";
}

} // namespace

class ExecutorImpl {
public:
  /// First member: destroyed last, after every tensor that reports to it.
  std::shared_ptr<MemoryTracker> memory = std::make_shared<MemoryTracker>();
  int64_t stateBytes = 0;
  plan::Plan plan;
  ExecutorOptions options;
  std::string who; // "rank R"
  int replica = 0;
  std::unique_ptr<DataSource> ownedData;
  DataSource *data = nullptr;
  /// Per param: PARAM, GRAD, ADAM_M, ADAM_V at Operand::Kind - 1.
  std::vector<std::array<TensorPtr, 4>> state;
  std::vector<SegmentLifetimes> lifetimes;
  /// distinctInputs[s][i]: the buffers instruction i of stream s reads,
  /// each once; a buffer dies after its last such read.
  std::vector<std::vector<std::vector<int>>> distinctInputs;
  std::vector<int> readerCount;
  /// Sends of a failed step: Gloo may still read them, so they are never
  /// freed while the executor lives.
  std::mutex abandonedMu;
  std::vector<TensorPtr> abandoned;
  bool broken = false;

  Status init(uint64_t seed);
  int peerOf(const Instruction &inst) const {
    return plan.groups(inst.peer_group()).ranks(replica);
  }
  std::vector<int> groupRanks(int group) const {
    const plan::DeviceGroup &g = plan.groups(group);
    std::vector<int> ranks(g.ranks().begin(), g.ranks().end());
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  }
  const TensorPtr &stateOf(int index, int kind) const {
    return state[index][kind - 1];
  }

  void fail(StepState &st, const Status &status);
  void runStream(int s, int64_t step, StepState &st);
  Status execute(int s, int i, int64_t step, StepState &st,
                 std::vector<PendingSend> &pendingSends);
  /// The buffer as stored (packed bf16 in mixed precision).
  Status fetchStored(StepState &st, int id, TensorPtr &out);
  /// The buffer as float32 values for kernels.
  Status fetch(StepState &st, int id, TensorPtr &out);
  Status publish(StepState &st, int id, TensorPtr t);
  /// Whether buffer `id` is stored as packed bf16.
  bool packed(int id) const;
  void release(StepState &st, const std::vector<int> &ids);
  /// `accounted`: with profiling, the nanoseconds spent in kernels and
  /// allocations (the rest of the CALL is the executor's own overhead).
  Status call(int s, const Instruction &inst, int64_t step, StepState &st,
              int64_t &accounted);
  Status allReduce(int s, const Instruction &inst);
  Status clipGrads();
  /// The global gradient norm of the last step, -1 before any.
  double lastGradNorm = -1;
  /// Whether the plan clips (CLIP_GRADS computes the norm); otherwise the
  /// executor computes it itself (see gradSquares).
  bool clips = false;
  /// Per param: whether an `adamw` kernel consumes its gradient (the norm is
  /// then taken just before the update, which zeroes the gradient after).
  std::vector<char> updated;
  /// Per param: whether a `zero` kernel of the plan clears its gradient;
  /// the others are cleared by runStep before every step but the first.
  std::vector<char> zeroedByPlan;
  /// Per param: sum of squares of its gradient this step (plans without
  /// CLIP_GRADS); each entry is written by the one stream updating it.
  std::vector<double> gradSquares;
  /// Whether a step has run (gradient accumulators may be dirty).
  bool ranStep = false;
  /// Mixed precision (training.compute_dtype == BF16): kernels read bf16
  /// copies of the fp32 master parameters, refreshed once per step.
  bool bf16 = false;
  std::mutex bf16Mu;
  std::vector<TensorPtr> bf16Params;
  std::vector<int64_t> bf16Step;
  /// The bf16 copy of parameter `p` for `step`.
  Status computeParam(int p, int64_t step, TensorPtr *&out);

  // Profile (options.profile): rows are the kernel ops, then the fixed
  // rows below; each stream thread adds to its own copy.
  enum FixedRow {
    kCallAlloc,
    kCallOther,
    kWaitSends,
    kLossAllReduce,
    kNumFixedRows
  };
  std::vector<std::string> profileNames;
  int kernelRow0 = 0;    // row of the first kernel op
  int kindRow0 = 0;      // row of Instruction::Kind 0
  std::vector<std::vector<int>> kernelRows; // [segment][kernel]
  std::vector<std::vector<ProfileSlot>> profile; // [stream][row]
  void initProfile();
  void addProfile(int s, int row, int64_t ns) {
    profile[s][row].add(ns);
  }
};

void ExecutorImpl::initProfile() {
  profileNames = {"CALL alloc", "CALL other", "WAIT_SENDS (end of step)",
                  "LOSS_ALL_REDUCE (end of step)"};
  kindRow0 = static_cast<int>(profileNames.size());
  const google::protobuf::EnumDescriptor *kinds =
      plan::Instruction::Kind_descriptor();
  int maxKind = 0;
  for (int i = 0; i < kinds->value_count(); ++i)
    maxKind = std::max(maxKind, kinds->value(i)->number());
  for (int k = 0; k <= maxKind; ++k) {
    const google::protobuf::EnumValueDescriptor *v =
        kinds->FindValueByNumber(k);
    profileNames.push_back(v ? v->name() : "kind " + std::to_string(k));
  }
  kernelRow0 = static_cast<int>(profileNames.size());
  std::unordered_map<std::string, int> rowOf;
  for (const std::string &op : kernelNames()) {
    rowOf[op] = static_cast<int>(profileNames.size());
    profileNames.push_back(op);
  }
  kernelRows.clear();
  for (const plan::Segment &seg : plan.segments()) {
    std::vector<int> rows;
    for (const plan::Kernel &kernel : seg.kernels()) {
      auto it = rowOf.find(kernel.op());
      if (it == rowOf.end()) { // validated plans never get here
        it = rowOf.emplace(kernel.op(), static_cast<int>(profileNames.size()))
                 .first;
        profileNames.push_back(kernel.op());
      }
      rows.push_back(it->second);
    }
    kernelRows.push_back(std::move(rows));
  }
  profile.assign(std::max(1, plan.streams_size()),
                 std::vector<ProfileSlot>(profileNames.size()));
}

Status ExecutorImpl::computeParam(int p, int64_t step, TensorPtr *&out) {
  std::lock_guard<std::mutex> lock(bf16Mu);
  TensorPtr &copy = bf16Params[p];
  if (bf16Step[p] != step) {
    const TensorPtr &master = stateOf(p, Operand::PARAM);
    if (!copy)
      PIPER_RETURN_IF_ERROR(allocateTensor(plan.params(p).type(),
                                           plan.params(p).name() + " (bf16)",
                                           memory, copy));
    std::memcpy(copy->data, master->data, static_cast<size_t>(master->bytes));
    roundToBf16(static_cast<float *>(copy->data), copy->bytes / 4);
    bf16Step[p] = step;
  }
  out = &copy;
  return Status::ok();
}

Status ExecutorImpl::init(uint64_t seed) {
  bf16 = plan.training().compute_dtype() == plan::BF16;
  bf16Params.assign(plan.params_size(), nullptr);
  bf16Step.assign(plan.params_size(), 0);
  int numParams = plan.params_size();
  state.resize(numParams);
  for (int p = 0; p < numParams; ++p) {
    const plan::Parameter &param = plan.params(p);
    for (int k = 0; k < 4; ++k) {
      PIPER_RETURN_IF_ERROR(allocateTensor(param.type(),
                                           "state of param '" + param.name() +
                                               "'",
                                           memory, state[p][k]));
      stateBytes += state[p][k]->bytes;
    }
    const TensorPtr &value = state[p][0];
    fillInitializer(param.init(), param.name(), seed, 0,
                    static_cast<float *>(value->data), value->bytes / 4);
  }

  for (const plan::Segment &seg : plan.segments())
    lifetimes.push_back(computeLifetimes(seg));
  initProfile();

  updated.assign(numParams, 0);
  zeroedByPlan.assign(numParams, 0);
  gradSquares.assign(numParams, 0.0);
  std::vector<char> called(plan.segments_size(), 0);
  for (const plan::Stream &stream : plan.streams())
    for (const Instruction &inst : stream.instructions())
      if (inst.kind() == Instruction::CALL)
        called[inst.segment()] = 1;
  for (int g = 0; g < plan.segments_size(); ++g)
    for (const plan::Kernel &kernel : plan.segments(g).kernels()) {
      if (!called[g])
        continue;
      if (kernel.op() == "adamw" && kernel.inputs_size() > 0 &&
          kernel.inputs(0).kind() == Operand::GRAD)
        updated[kernel.inputs(0).index()] = 1;
      if (kernel.op() == "zero")
        for (const Operand &op : kernel.outputs())
          if (op.kind() == Operand::GRAD)
            zeroedByPlan[op.index()] = 1;
    }
  for (const plan::Stream &stream : plan.streams())
    for (const Instruction &inst : stream.instructions())
      clips |= inst.kind() == Instruction::CLIP_GRADS;

  readerCount.assign(plan.buffers_size(), 0);
  distinctInputs.resize(plan.streams_size());
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    distinctInputs[s].resize(stream.instructions_size());
    for (int i = 0; i < stream.instructions_size(); ++i) {
      std::vector<int> ids(stream.instructions(i).inputs().begin(),
                           stream.instructions(i).inputs().end());
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      for (int id : ids)
        ++readerCount[id];
      distinctInputs[s][i] = std::move(ids);
    }
  }
  return Status::ok();
}

void ExecutorImpl::fail(StepState &st, const Status &status) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.failed) {
      st.failed = true;
      st.error = status;
      first = true;
    }
  }
  st.cv.notify_all();
  if (first && options.onStreamError)
    options.onStreamError(status);
}

Status ExecutorImpl::fetchStored(StepState &st, int id, TensorPtr &out) {
  std::lock_guard<std::mutex> lock(st.mu);
  if (!st.written[id])
    return Status::error(describeBuffer(plan, id) +
                         " is read before it is written in this step");
  out = st.buffers[id];
  if (!out)
    return Status::error("internal: " + describeBuffer(plan, id) +
                         " was freed before its last reader");
  return Status::ok();
}

Status ExecutorImpl::fetch(StepState &st, int id, TensorPtr &out) {
  PIPER_RETURN_IF_ERROR(fetchStored(st, id, out));
  if (out->dtype != plan::BF16)
    return Status::ok();
  // A packed bf16 step buffer: kernels get it back as float32 values.
  TensorPtr wide;
  PIPER_RETURN_IF_ERROR(allocateTensor(plan.buffers(id).type(),
                                       describeBuffer(plan, id), memory, wide));
  const uint16_t *src = static_cast<const uint16_t *>(out->data);
  float *dst = static_cast<float *>(wide->data);
  for (int64_t i = 0, n = wide->bytes / 4; i < n; ++i)
    dst[i] = bf16ToFloat(src[i]);
  out = std::move(wide);
  return Status::ok();
}

bool ExecutorImpl::packed(int id) const {
  const plan::TensorType &type = plan.buffers(id).type();
  return bf16 && type.dtype() == plan::F32 && type.shape_size() > 0;
}

Status ExecutorImpl::publish(StepState &st, int id, TensorPtr t) {
  if (packed(id) && t->dtype == plan::F32) {
    // Mixed precision stores step buffers (what tasks pass on and what is
    // sent) as bf16: half the bytes, the same values the kernels produced.
    plan::TensorType type = plan.buffers(id).type();
    type.set_dtype(plan::BF16);
    TensorPtr narrow;
    PIPER_RETURN_IF_ERROR(
        allocateTensor(type, describeBuffer(plan, id), memory, narrow));
    const float *src = static_cast<const float *>(t->data);
    uint16_t *dst = static_cast<uint16_t *>(narrow->data);
    for (int64_t i = 0, n = t->bytes / 4; i < n; ++i)
      dst[i] = floatToBf16(src[i]);
    t = std::move(narrow);
  }
  std::lock_guard<std::mutex> lock(st.mu);
  st.written[id] = 1;
  // A buffer nobody reads dies at once.
  if (st.readersLeft[id] > 0)
    st.buffers[id] = std::move(t);
  return Status::ok();
}

void ExecutorImpl::release(StepState &st, const std::vector<int> &ids) {
  std::lock_guard<std::mutex> lock(st.mu);
  for (int id : ids)
    if (--st.readersLeft[id] == 0)
      st.buffers[id].reset();
}

Status ExecutorImpl::call(int s, const Instruction &inst, int64_t step,
                          StepState &st, int64_t &accounted) {
  const plan::Segment &seg = plan.segments(inst.segment());
  const SegmentLifetimes &lt = lifetimes[inst.segment()];
  std::vector<TensorPtr> values(seg.values_size());
  for (int a = 0; a < inst.inputs_size(); ++a)
    PIPER_RETURN_IF_ERROR(fetch(st, inst.inputs(a), values[seg.args(a)]));

  KernelContext ctx;
  ctx.lossAccumulator = &st.loss[s];
  ctx.step = step;
  ctx.lrScale = scheduleScale(plan.training(), step);
  auto resolve = [&](const Operand &op) {
    return op.kind() == Operand::VALUE ? values[op.index()]->ref()
                                       : stateOf(op.index(), op.kind())->ref();
  };
  // Built only for an error message: most kernels take microseconds.
  auto where = [&](int k) {
    return "segment '" + seg.name() + "', kernel " + std::to_string(k);
  };
  const bool profiling = options.profile;
  const int segIndex = inst.segment();
  std::vector<TensorRef> ins, outs;
  for (int k = 0; k < seg.kernels_size(); ++k) {
    const plan::Kernel &kernel = seg.kernels(k);
    Clock::time_point start;
    if (profiling && !lt.allocBefore[k].empty())
      start = Clock::now();
    for (int v : lt.allocBefore[k]) {
      Status status = allocateTensorAs(
          seg.values(v), [v] { return "value " + std::to_string(v); }, memory,
          values[v]);
      if (!status)
        return status.withContext(where(k));
    }
    if (profiling && !lt.allocBefore[k].empty()) {
      int64_t ns = nanosSince(start);
      addProfile(s, kCallAlloc, ns);
      accounted += ns;
    }
    ins.clear();
    outs.clear();
    // Mixed precision: compute kernels read bf16 weights; the optimizer and
    // the gradient accumulators stay in fp32.
    const bool lowPrecision =
        bf16 && kernel.op() != "accumulate" && kernel.op() != "zero" &&
        kernel.op() != "adamw";
    for (const Operand &op : kernel.inputs()) {
      if (lowPrecision && op.kind() == Operand::PARAM) {
        TensorPtr *copy = nullptr;
        PIPER_RETURN_IF_ERROR(
            computeParam(op.index(), step, copy).withContext(where(k)));
        ins.push_back((*copy)->ref());
      } else {
        ins.push_back(resolve(op));
      }
    }
    for (const Operand &op : kernel.outputs())
      outs.push_back(resolve(op));
    // Without CLIP_GRADS, the norm is taken of the final gradient just
    // before the update reads (and a later `zero` clears) it.
    if (!clips && kernel.op() == "adamw" && !ins.empty())
      gradSquares[kernel.inputs(0).index()] =
          sumOfSquares(ins[0].f32(), ins[0].numel());
    if (profiling)
      start = Clock::now();
    Status status = runKernel(kernel, ins, outs, ctx);
    if (profiling) {
      int64_t ns = nanosSince(start);
      addProfile(s, kernelRows[segIndex][k], ns);
      accounted += ns;
    }
    if (!status)
      return status.withContext(where(k));
    // bf16 activations and activation gradients; scalar losses stay fp32.
    if (lowPrecision)
      for (size_t o = 0; o < outs.size(); ++o)
        if (kernel.outputs(int(o)).kind() == Operand::VALUE &&
            outs[o].dtype == plan::F32 && !outs[o].shape.empty())
          roundToBf16(outs[o].f32(), outs[o].numel());
    for (int v : lt.freeAfter[k])
      values[v].reset();
  }
  // Buffers are immutable once written and arguments are never written, so
  // a result (even one that is an argument) is handed over, not copied.
  for (int r = 0; r < inst.outputs_size(); ++r)
    PIPER_RETURN_IF_ERROR(publish(st, inst.outputs(r), values[seg.results(r)]));
  return Status::ok();
}

Status ExecutorImpl::clipGrads() {
  // Each class holds data-parallel-reduced gradients, identical across its
  // replicas: the world sum of squares counts every gradient num_replicas
  // times.
  double local = 0;
  for (int p = 0; p < plan.params_size(); ++p) {
    const TensorPtr &g = stateOf(p, Operand::GRAD);
    // A parameter held by several classes (tied) holds the same summed
    // gradient in each: count it once.
    local += sumOfSquares(static_cast<const float *>(g->data), g->bytes / 4) /
             std::max(1, plan.params(p).copies());
  }
  double total = local;
  if (options.comm)
    PIPER_RETURN_IF_ERROR(options.comm->allReduceSumWorld(&total, 1).withContext(
        "summing the squared gradient norm over ranks"));
  int replicas = std::max(1, plan.training().num_replicas());
  double norm = std::sqrt(total / replicas);
  lastGradNorm = norm;
  double maxNorm = plan.training().clip_grad_norm();
  if (!std::isfinite(norm))
    return Status::error("the global gradient norm is not finite (" +
                         std::to_string(norm) + ")");
  if (maxNorm <= 0 || norm <= maxNorm)
    return Status::ok();
  float scale = static_cast<float>(maxNorm / (norm + 1e-6));
  for (int p = 0; p < plan.params_size(); ++p) {
    const TensorPtr &g = stateOf(p, Operand::GRAD);
    scaleFloats(static_cast<float *>(g->data), scale, g->bytes / 4);
  }
  return Status::ok();
}

Status ExecutorImpl::allReduce(int s, const Instruction &inst) {
  std::vector<int> ranks = groupRanks(inst.group());
  if (ranks.size() < 2)
    return Status::ok(); // a sum over one rank is the identity
  const std::string &stream = plan.streams(s).name();
  std::string what = "all-reduce over ranks [";
  for (size_t i = 0; i < ranks.size(); ++i)
    what += (i ? ", " : "") + std::to_string(ranks[i]);
  what += "]";

  CommKey key{stream, ranks};
  if (inst.params_size() == 1) {
    const TensorPtr &g = stateOf(inst.params(0), Operand::GRAD);
    return options.comm
        ->allReduce(key, g->data, static_cast<size_t>(g->bytes / 4),
                    CommDType::F32)
        ->wait()
        .withContext(what);
  }
  // One flat buffer means one collective per instruction, however many
  // parameters it covers.
  size_t count = 0;
  for (int p : inst.params())
    count += static_cast<size_t>(stateOf(p, Operand::GRAD)->bytes / 4);
  std::vector<float> flat(count);
  size_t at = 0;
  for (int p : inst.params()) {
    const TensorPtr &g = stateOf(p, Operand::GRAD);
    std::memcpy(flat.data() + at, g->data, static_cast<size_t>(g->bytes));
    at += static_cast<size_t>(g->bytes / 4);
  }
  PIPER_RETURN_IF_ERROR(
      options.comm->allReduce(key, flat.data(), count, CommDType::F32)
          ->wait()
          .withContext(what));
  at = 0;
  for (int p : inst.params()) {
    const TensorPtr &g = stateOf(p, Operand::GRAD);
    std::memcpy(g->data, flat.data() + at, static_cast<size_t>(g->bytes));
    at += static_cast<size_t>(g->bytes / 4);
  }
  return Status::ok();
}

Status ExecutorImpl::execute(int s, int i, int64_t step, StepState &st,
                             std::vector<PendingSend> &pendingSends) {
  const plan::Stream &stream = plan.streams(s);
  const Instruction &inst = stream.instructions(i);
  const bool profiling = options.profile;
  Clock::time_point start;
  if (profiling)
    start = Clock::now();
  int64_t accounted = 0; // CALL: time in kernels and allocations
  switch (inst.kind()) {
  case Instruction::CALL:
    PIPER_RETURN_IF_ERROR(call(s, inst, step, st, accounted));
    break;
  case Instruction::SEND: {
    TensorPtr t;
    PIPER_RETURN_IF_ERROR(fetchStored(st, inst.inputs(0), t));
    int peer = peerOf(inst);
    CommWorkPtr work =
        options.comm->isend(stream.name(), t->data,
                            static_cast<size_t>(t->bytes), peer,
                            static_cast<uint32_t>(inst.tag()));
    pendingSends.push_back(
        PendingSend{std::move(t), work,
                    "send of " + describeBuffer(plan, inst.inputs(0)) +
                        " to rank " + std::to_string(peer) + " (tag " +
                        std::to_string(inst.tag()) + ")"});
    break;
  }
  case Instruction::RECV: {
    int id = inst.outputs(0);
    TensorPtr t;
    plan::TensorType type = plan.buffers(id).type();
    if (packed(id))
      type.set_dtype(plan::BF16);
    PIPER_RETURN_IF_ERROR(
        allocateTensor(type, describeBuffer(plan, id), memory, t));
    int peer = peerOf(inst);
    PIPER_RETURN_IF_ERROR(
        options.comm
            ->irecv(stream.name(), t->data, static_cast<size_t>(t->bytes),
                    peer, static_cast<uint32_t>(inst.tag()))
            ->wait()
            .withContext("receive of " + describeBuffer(plan, id) +
                         " from rank " + std::to_string(peer) + " (tag " +
                         std::to_string(inst.tag()) + ")"));
    PIPER_RETURN_IF_ERROR(publish(st, id, std::move(t)));
    break;
  }
  case Instruction::ALL_REDUCE:
    PIPER_RETURN_IF_ERROR(allReduce(s, inst));
    break;
  case Instruction::CLIP_GRADS:
    PIPER_RETURN_IF_ERROR(clipGrads());
    break;
  case Instruction::RECORD: {
    {
      std::lock_guard<std::mutex> lock(st.mu);
      st.recorded[inst.event()] = 1;
    }
    st.cv.notify_all();
    break;
  }
  case Instruction::WAIT: {
    std::unique_lock<std::mutex> lock(st.mu);
    st.cv.wait(lock, [&] { return st.recorded[inst.event()] || st.failed; });
    if (!st.recorded[inst.event()])
      return Status::error("stopped while waiting for event " +
                           std::to_string(inst.event()) +
                           ": another stream failed");
    break;
  }
  case Instruction::LOAD_BATCH: {
    const plan::TrainingConfig &t = plan.training();
    TensorPtr tokens, targets;
    PIPER_RETURN_IF_ERROR(
        allocateTensor(plan.buffers(inst.outputs(0)).type(), "tokens", memory,
                       tokens));
    PIPER_RETURN_IF_ERROR(allocateTensor(plan.buffers(inst.outputs(1)).type(),
                                         "targets", memory, targets));
    int64_t global = static_cast<int64_t>(replica) * t.num_microbatches() +
                     inst.microbatch();
    PIPER_RETURN_IF_ERROR(data->fill(step, global, t.microbatch_size(),
                                     t.seq_len(),
                                     static_cast<int32_t *>(tokens->data),
                                     static_cast<int32_t *>(targets->data)));
    PIPER_RETURN_IF_ERROR(publish(st, inst.outputs(0), std::move(tokens)));
    PIPER_RETURN_IF_ERROR(publish(st, inst.outputs(1), std::move(targets)));
    break;
  }
  default:
    return Status::error("unsupported instruction kind " +
                         std::to_string(inst.kind()));
  }
  release(st, distinctInputs[s][i]);
  if (profiling) {
    int64_t ns = nanosSince(start);
    if (inst.kind() == Instruction::CALL)
      addProfile(s, kCallOther, std::max<int64_t>(0, ns - accounted));
    else
      addProfile(s, kindRow0 + inst.kind(), ns);
  }
  return Status::ok();
}

void ExecutorImpl::runStream(int s, int64_t step, StepState &st) {
  const plan::Stream &stream = plan.streams(s);
  std::vector<PendingSend> pendingSends;
  auto abandonSends = [&] {
    std::lock_guard<std::mutex> lock(abandonedMu);
    for (PendingSend &send : pendingSends)
      abandoned.push_back(std::move(send.tensor));
    pendingSends.clear();
  };
  int i = 0;
  try {
    for (; i < stream.instructions_size(); ++i) {
      {
        std::lock_guard<std::mutex> lock(st.mu);
        if (st.failed)
          break;
      }
      Status status = execute(s, i, step, st, pendingSends);
      if (!status) {
        fail(st,
             status.withContext(who + ", " + instructionContext(plan, s, i)));
        abandonSends();
        return;
      }
    }
    if (i < stream.instructions_size()) {
      abandonSends();
      return;
    }
    if (!pendingSends.empty()) {
      Clock::time_point start;
      if (options.profile)
        start = Clock::now();
      // Waits for every send, even after a failure, so that no buffer is
      // still in use afterwards; reports the first error.
      Status status;
      for (PendingSend &send : pendingSends) {
        Status sent = send.work->wait();
        if (status.isOk() && !sent.isOk())
          status = sent.withContext(send.what);
      }
      if (options.profile)
        addProfile(s, kWaitSends, nanosSince(start));
      if (!status) {
        fail(st, status.withContext(who + ", stream '" + stream.name() +
                                    "', end of step: waiting for sends"));
        abandonSends();
        return;
      }
    }
  } catch (const std::exception &e) {
    fail(st, Status::error(who + ", " + instructionContext(plan, s, i) +
                           ": internal error: " + e.what()));
    abandonSends();
  }
}

Executor::Executor(std::unique_ptr<ExecutorImpl> impl)
    : impl(std::move(impl)) {}

Executor::~Executor() = default;

std::unique_ptr<Executor> Executor::create(plan::Plan plan,
                                           const ExecutorOptions &options,
                                           Status &status) {
  std::string who = "rank " + std::to_string(options.rank);
  status = validatePlan(plan, kernelNames())
               .withContext(who + ": invalid plan for device class " +
                            std::to_string(plan.device_class()));
  if (!status)
    return nullptr;

  auto impl = std::make_unique<ExecutorImpl>();
  impl->who = who;
  auto it = std::find(plan.ranks().begin(), plan.ranks().end(), options.rank);
  if (it == plan.ranks().end()) {
    std::string ranks;
    for (int r : plan.ranks())
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    status = Status::error(who + ": not one of the ranks [" + ranks +
                           "] of the plan of device class " +
                           std::to_string(plan.device_class()));
    return nullptr;
  }
  impl->replica = static_cast<int>(it - plan.ranks().begin());
  if (options.comm) {
    if (options.comm->rank() != options.rank ||
        options.comm->worldSize() != plan.world_size()) {
      status = Status::error(who + ": the communicator is rank " +
                             std::to_string(options.comm->rank()) + " of " +
                             std::to_string(options.comm->worldSize()) +
                             " but the plan expects world_size " +
                             std::to_string(plan.world_size()));
      return nullptr;
    }
  } else if (plan.world_size() != 1) {
    status = Status::error(who + ": world_size is " +
                           std::to_string(plan.world_size()) +
                           " but no communicator was given");
    return nullptr;
  }

  impl->plan = std::move(plan);
  impl->options = options;
  if (options.data) {
    impl->data = options.data;
  } else {
    impl->ownedData = std::make_unique<SyntheticData>(
        options.seed, impl->plan.training().vocab_size());
    impl->data = impl->ownedData.get();
  }
  status = impl->init(options.seed).withContext(who);
  if (!status)
    return nullptr;
  return std::unique_ptr<Executor>(new Executor(std::move(impl)));
}

std::vector<CommKey> Executor::commKeys() const {
  const plan::Plan &plan = impl->plan;
  int me = impl->options.rank;
  std::set<std::pair<std::string, std::vector<int>>> keys;
  for (const plan::Stream &stream : plan.streams()) {
    for (const Instruction &inst : stream.instructions()) {
      if (inst.kind() == Instruction::SEND ||
          inst.kind() == Instruction::RECV) {
        int peer = impl->peerOf(inst);
        keys.insert({stream.name(), {std::min(me, peer), std::max(me, peer)}});
      } else if (inst.kind() == Instruction::ALL_REDUCE) {
        std::vector<int> ranks = impl->groupRanks(inst.group());
        if (ranks.size() >= 2)
          keys.insert({stream.name(), ranks});
      }
    }
  }
  std::vector<CommKey> out;
  for (auto &[stream, ranks] : keys)
    out.push_back(CommKey{stream, ranks});
  return out;
}

Status Executor::connect() {
  std::vector<CommKey> keys = commKeys();
  if (!impl->options.comm) {
    if (keys.empty())
      return Status::ok();
    return Status::error(impl->who +
                         ": the plan communicates but no communicator was "
                         "given");
  }
  return impl->options.comm->connect(std::move(keys))
      .withContext(impl->who + ": connecting communicators");
}

Status Executor::runStep(int64_t step, double &loss) {
  ExecutorImpl &x = *impl;
  if (x.broken)
    return Status::error(x.who +
                         ": the executor cannot run after a failed step");
  const plan::Plan &plan = x.plan;
  int numStreams = plan.streams_size();
  // Gradients are this step's alone, as after optimizer.zero_grad(): plans
  // clear the accumulators they update; the others (--no-optimizer) are
  // cleared here, so that an all-reduce never re-sums an earlier step.
  if (x.ranStep)
    for (int p = 0; p < plan.params_size(); ++p)
      if (!x.zeroedByPlan[p]) {
        const TensorPtr &g = x.stateOf(p, Operand::GRAD);
        zeroBytes(g->data, g->bytes);
      }
  x.ranStep = true;
  StepState st;
  st.recorded.assign(plan.num_events(), 0);
  st.buffers.assign(plan.buffers_size(), nullptr);
  st.written.assign(plan.buffers_size(), 0);
  st.readersLeft = x.readerCount;
  st.loss.assign(numStreams, 0.0);

  if (numStreams == 1) {
    x.runStream(0, step, st);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(numStreams);
    for (int s = 0; s < numStreams; ++s) {
      try {
        threads.emplace_back([&x, s, step, &st] { x.runStream(s, step, st); });
      } catch (const std::exception &e) {
        x.fail(st, Status::error(x.who +
                                 ": cannot start a thread for "
                                 "stream '" +
                                 plan.streams(s).name() + "': " + e.what()));
        break;
      }
    }
    for (std::thread &t : threads)
      t.join();
  }
  if (st.failed) {
    x.broken = true;
    return st.error;
  }

  loss = 0;
  for (double l : st.loss)
    loss += l;
  // The global gradient norm when the plan does not clip: the same
  // definition as CLIP_GRADS, reduced together with the loss.
  double squares = 0;
  if (!x.clips) {
    for (int p = 0; p < plan.params_size(); ++p) {
      if (!x.updated[p]) {
        const TensorPtr &g = x.stateOf(p, Operand::GRAD);
        x.gradSquares[p] = sumOfSquares(static_cast<const float *>(g->data), g->bytes / 4);
      }
      squares += x.gradSquares[p] / std::max(1, plan.params(p).copies());
    }
  }
  double sums[2] = {loss, squares};
  if (x.options.comm) {
    Clock::time_point start;
    if (x.options.profile)
      start = Clock::now();
    Status status = x.options.comm->allReduceSumWorld(sums, 2);
    // The stream threads are joined: stream 0's rows are free to use.
    if (x.options.profile)
      x.addProfile(0, ExecutorImpl::kLossAllReduce, nanosSince(start));
    if (!status) {
      x.broken = true;
      return status.withContext(x.who + ": summing the step loss over ranks");
    }
  }
  loss = sums[0];
  if (!x.clips)
    x.lastGradNorm =
        std::sqrt(sums[1] / std::max(1, plan.training().num_replicas()));
  return Status::ok();
}

int Executor::replicaIndex() const { return impl->replica; }

double Executor::lastGradNorm() const { return impl->lastGradNorm; }

std::vector<ProfileEntry> Executor::profile() const {
  std::vector<ProfileEntry> out;
  for (size_t row = 0; row < impl->profileNames.size(); ++row) {
    ProfileEntry e;
    e.name = impl->profileNames[row];
    int64_t nanos = 0;
    for (const std::vector<ProfileSlot> &stream : impl->profile) {
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

void Executor::resetProfile() {
  for (std::vector<ProfileSlot> &stream : impl->profile)
    std::fill(stream.begin(), stream.end(), ProfileSlot{});
}

int64_t Executor::liveBytes() const { return impl->memory->live.load(); }
int64_t Executor::peakBytes() const { return impl->memory->peak.load(); }
int64_t Executor::stateBytes() const { return impl->stateBytes; }

double Executor::lrScale(int64_t step) const {
  return scheduleScale(impl->plan.training(), step);
}

const plan::Plan &Executor::plan() const { return impl->plan; }

TensorRef Executor::state(int index, plan::Operand::Kind kind) const {
  if (index < 0 || index >= impl->plan.params_size() || kind < Operand::PARAM ||
      kind > Operand::ADAM_V)
    return TensorRef{};
  return impl->stateOf(index, kind)->ref();
}

Status Executor::saveParams(const std::string &dir) const {
  // mkdir -p: create each component, tolerating the ones that exist.
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/')
      continue;
    std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::error(impl->who + ": cannot create directory '" + prefix +
                           "': " + errnoText(errno));
  }
  for (int p = 0; p < impl->plan.params_size(); ++p) {
    const std::string &name = impl->plan.params(p).name();
    std::string path = dir + "/" + name + ".bin";
    std::string tmp = path + ".tmp";
    const TensorPtr &t = impl->stateOf(p, Operand::PARAM);
    FILE *f = std::fopen(tmp.c_str(), "wb");
    if (!f)
      return Status::error(impl->who + ": cannot write '" + tmp +
                           "': " + errnoText(errno));
    size_t n = std::fwrite(t->data, 1, static_cast<size_t>(t->bytes), f);
    bool ok = n == static_cast<size_t>(t->bytes);
    ok = (std::fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::remove(tmp.c_str());
      return Status::error(impl->who + ": cannot write '" + path + "'");
    }
  }
  return Status::ok();
}

std::vector<ParamSpec> Executor::paramSpecs() const {
  std::vector<ParamSpec> specs;
  for (const plan::Parameter &p : impl->plan.params())
    specs.push_back(
        ParamSpec{p.name(), std::vector<int64_t>(p.type().shape().begin(),
                                                 p.type().shape().end())});
  return specs;
}

Status Executor::saveCheckpoint(const std::string &path, int64_t step) const {
  return saveState(path, step, Operand::PARAM);
}

Status Executor::saveGradients(const std::string &path, int64_t step) const {
  return saveState(path, step, Operand::GRAD);
}

Status Executor::saveState(const std::string &path, int64_t step,
                           int kind) const {
  std::vector<SafetensorsTensor> tensors;
  for (int p = 0; p < impl->plan.params_size(); ++p) {
    const TensorPtr &t = impl->stateOf(p, kind);
    tensors.push_back(SafetensorsTensor{impl->plan.params(p).name(), "F32",
                                        t->shape, t->data});
  }
  return writeSafetensors(path, tensors, checkpointMetadata(step))
      .withContext(impl->who);
}

Status Executor::loadCheckpoint(const SafetensorsReader &reader) {
  PIPER_RETURN_IF_ERROR(
      checkCheckpointParams(reader, paramSpecs(), /*rejectExtra=*/false)
          .withContext(impl->who));
  for (int p = 0; p < impl->plan.params_size(); ++p) {
    const SafetensorsEntry *e = reader.find(impl->plan.params(p).name());
    const TensorPtr &t = impl->stateOf(p, Operand::PARAM);
    if (!e || static_cast<int64_t>(e->end - e->begin) != t->bytes)
      return Status::error(impl->who + ": internal: checkpoint tensor '" +
                           impl->plan.params(p).name() + "' has a bad size");
    PIPER_RETURN_IF_ERROR(reader.read(*e, t->data).withContext(impl->who));
  }
  return Status::ok();
}

} // namespace piper::runtime

// The plan executor's public API and plan loading: validation, the device
// and its persistent streams and events, parameter state, kernel
// resolution, and the communicator keys a plan needs.
#include "runtime/exec/Executor.h"

#include <algorithm>
#include <set>

#include "proto/KernelIds.h"
#include "proto/PlanGroups.h"
#include "proto/analysis/MemoryPlan.h"
#include "runtime/exec/ExecutorImpl.h"
#include "runtime/exec/Init.h"
#include "runtime/exec/Validate.h"
#include "runtime/hal/cpu/CpuDevice.h"

namespace piper::runtime {

using plan::Instruction;
using plan::Operand;

std::vector<int> ExecutorImpl::memberRanks(const Instruction &inst) const {
  // Validated at load: the group exists and a subgroup holds this rank.
  const plan::DeviceGroup &g = *plan::memberGroup(plan, inst, options.rank);
  std::vector<int> ranks(g.ranks().begin(), g.ranks().end());
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

std::string ExecutorImpl::describeBuffer(int id) const {
  const std::string &name = plan.buffers(id).name();
  return name.empty() ? "buffer " + std::to_string(id)
                      : "buffer '" + name + "' (id " + std::to_string(id) + ")";
}

/// Whether the plan's arena fits what the device reports free and the
/// --device-memory cap: an error naming the plan's need, the budget, where
/// it came from and the step's peak (plan::checkFits) otherwise.
static Status checkDeviceFits(const plan::Plan &plan,
                              const hal::Allocator &memory, int64_t cap) {
  StatusOr<int64_t> available = memory.availableBytes();
  int64_t budget = available ? *available : -1;
  std::string source = "free on the device";
  if (cap >= 0 && (budget < 0 || cap < budget)) {
    budget = cap;
    source = "--device-memory";
  }
  std::string error;
  if (budget < 0 || plan::checkFits(plan, budget, error))
    return Status::ok();
  return Status::error("the plan does not fit this device's memory (" + source +
                       "), nothing was allocated: " + error);
}

Status ExecutorImpl::init(uint64_t seed) {
  memory = &device->allocator();
  comm = device->communicator();
  bf16 = plan.training().compute_dtype() == plan::BF16;
  fileArenaBytes = plan.arena_bytes();
  PIPER_RETURN_IF_ERROR(planStorage());
  PIPER_RETURN_IF_ERROR(checkDeviceFits(plan, *memory, options.deviceMemory));
  bf16Params.assign(plan.params_size(), nullptr);
  bf16Step.assign(plan.params_size(), 0);
  bf16Seen.assign(bf16 ? plan.streams_size() : 0,
                  std::vector<int64_t>(plan.params_size(), 0));
  int numParams = plan.params_size();
  state.resize(numParams);
  // One arena, allocated once: every tensor is a view at its planned offset
  // (validatePlan has checked the layout with plan::checkArena).
  if (plan.arena_bytes() > 0) {
    PIPER_RETURN_IF_ERROR(
        allocateDevice(arena, static_cast<size_t>(plan.arena_bytes()),
                       "allocating the arena of " +
                           std::to_string(plan.arena_bytes()) + " bytes"));
    // Gradients and optimizer moments start at zero, as freshly allocated
    // tensors did.
    PIPER_RETURN_IF_ERROR(
        memory->zero(arena.data, arena.bytes).withContext("zeroing the arena"));
  }
  stateBytes = plan.state_bytes();
  std::vector<float> host;
  shard.resize(numParams);
  for (int p = 0; p < numParams; ++p) {
    const plan::Parameter &param = plan.params(p);
    int64_t bytes = tensorBytes(param.type());
    int64_t elements = plan::paramElements(param);
    shard[p] = plan::shardRange(elements, plan::shardMembers(plan, param),
                                plan::shardMember(plan, param, replica));
    for (int k = 0; k < 4; ++k) {
      if (plan::stateSharded(param, k)) {
        // A shard buffer: this rank's range first, zeros after it.
        plan::TensorType flat;
        flat.set_dtype(plan::F32);
        flat.add_shape(plan::stateElements(plan, param, k));
        state[p][k] = viewTensor(plan::F32, flat, 4 * flat.shape(0),
                                 at(param.state_offsets(k)));
      } else {
        state[p][k] = viewTensor(param.type().dtype(), param.type(), bytes,
                                 at(param.state_offsets(k)));
      }
    }
    if (bf16 && !plan::stateSharded(param, 0)) {
      // Packed where every kernel reading it takes it so (planPackedParams).
      plan::TensorType type = param.type();
      if (packedParam[p])
        type.set_dtype(plan::BF16);
      bf16Params[p] = viewTensor(type.dtype(), type, tensorBytes(type),
                                 at(param.state_offsets(4)));
    }
    // The counter-based initializer gives a shard exactly its slice.
    bool valueSharded = plan::stateSharded(param, 0);
    // An expert or tensor-parallel parameter holds its member's slice of
    // the global tensor: one or more runs of its elements.
    // A ZeRO-3 shard holds its range of that.
    int64_t count = valueSharded ? shard[p].count : elements;
    host.assign(static_cast<size_t>(count), 0.0f);
    for (const plan::SliceRun &run :
         plan::rangeRuns(param, plan::sliceMember(plan, param, replica),
                         valueSharded ? shard[p].start : 0, count))
      fillInitializer(param.init(), param.name(), seed, run.global,
                      host.data() + run.local, run.count);
    PIPER_RETURN_IF_ERROR(
        memory
            ->copyFromHost(state[p][0]->data, host.data(),
                           static_cast<size_t>(4 * count))
            .withContext("initializing parameter '" + param.name() + "'"));
  }
  bufferViews.assign(plan.buffers_size(), nullptr);
  for (int id = 0; id < plan.buffers_size(); ++id) {
    const plan::Buffer &b = plan.buffers(id);
    plan::TensorType type = b.type();
    if (packed(id))
      type.set_dtype(plan::BF16);
    bufferViews[id] =
        viewTensor(type.dtype(), type, tensorBytes(type), at(b.offset()));
  }

  PIPER_RETURN_IF_ERROR(allocateBatchStaging());

  for (const plan::Segment &seg : plan.segments())
    lifetimes.push_back(computeLifetimes(seg));
  profiler.init(plan.streams_size());
  tracer.init(plan, options.traceStep);
  PIPER_RETURN_IF_ERROR(resolveKernels());
  analyzeGradients();

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

  // Created once: no thread is started per step.
  for (const plan::Stream &stream : plan.streams()) {
    streams.emplace_back();
    PIPER_RETURN_IF_ERROR(
        device->createStream(stream.name(), streams.back())
            .withContext("creating stream '" + stream.name() + "'"));
  }
  for (int e = 0; e < plan.num_events(); ++e) {
    events.emplace_back();
    PIPER_RETURN_IF_ERROR(
        device->createEvent(events.back())
            .withContext("creating event " + std::to_string(e)));
  }
  if (options.stepGraphs != ExecutorOptions::StepGraphs::Off) {
    graphRefusal = stepGraphRefusal();
    if (!graphRefusal.empty() &&
        options.stepGraphs == ExecutorOptions::StepGraphs::On)
      return Status::error("steps cannot run as graphs (--step-graph on): " +
                           graphRefusal);
    if (graphRefusal.empty())
      PIPER_RETURN_IF_ERROR(allocateBlockExchanges());
  }
  PIPER_RETURN_IF_ERROR(prepareKernels());
  PIPER_RETURN_IF_ERROR(
      device->createLossSums(std::max(1, plan.streams_size()), lossSums)
          .withContext("creating the loss accumulators"));
  // A plan that clips keeps the norm and the clip factor on the device
  // (Gradients.cpp), also on a rank without parameters, which still takes
  // part in the world's sum.
  if (numParams > 0 || clips) {
    PIPER_RETURN_IF_ERROR(device->createSquareSums(numParams, squares)
                              .withContext("creating the gradient norm's "
                                           "sums of squares"));
    std::vector<double> weights(numParams);
    for (int p = 0; p < numParams; ++p)
      weights[p] = shareWeight(p);
    PIPER_RETURN_IF_ERROR(squares->setWeights(weights).withContext(
        "setting the gradient norm's weights"));
  }
  if (bf16 && plan.streams_size() > 1) {
    bf16Ready.resize(plan.params_size());
    for (int p = 0; p < plan.params_size(); ++p)
      if (bf16Params[p])
        PIPER_RETURN_IF_ERROR(device->createEvent(bf16Ready[p])
                                  .withContext("creating the bf16 event of "
                                               "parameter '" +
                                               plan.params(p).name() + "'"));
  }
  return Status::ok();
}

Executor::Executor(std::unique_ptr<ExecutorImpl> impl)
    : impl(std::move(impl)) {}

Executor::~Executor() = default;

std::unique_ptr<Executor> Executor::create(plan::Plan plan,
                                           const ExecutorOptions &options,
                                           Status &status) {
  std::string who = "rank " + std::to_string(options.rank);
  status =
      validatePlan(plan).withContext(who + ": invalid plan for device class " +
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

  impl->device = options.createDevice ? options.createDevice(options.comm)
                                      : hal::createCpuDevice(options.comm);
  if (!impl->device) {
    status = Status::error(who + ": no device was created");
    return nullptr;
  }
  // Every backend implements exactly the kernel table, whatever this plan
  // uses: a missing kernel is a load-time error naming it.
  std::string registryError = plan::checkBackendKernels(
      impl->device->name(), impl->device->kernelNames());
  if (!registryError.empty()) {
    status = Status::error(who + ": " + registryError);
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

StatusOr<plan::Plan> Executor::deviceLayout(plan::Plan plan,
                                            const ExecutorOptions &options,
                                            plan::StorageBytes &sizes) {
  PIPER_RETURN_IF_ERROR(validatePlan(plan).withContext(
      "invalid plan for device class " + std::to_string(plan.device_class())));
  ExecutorImpl impl;
  impl.device = options.createDevice ? options.createDevice(nullptr)
                                     : hal::createCpuDevice(nullptr);
  if (!impl.device)
    return Status::error("no device was created");
  impl.bf16 = plan.training().compute_dtype() == plan::BF16;
  impl.plan = std::move(plan);
  impl.options = options;
  PIPER_RETURN_IF_ERROR(impl.planStorage());
  sizes = std::move(impl.storageBytes);
  return std::move(impl.plan);
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
      } else if (plan::isGroupCollective(inst.kind())) {
        std::vector<int> ranks = impl->memberRanks(inst);
        if (ranks.size() >= 2)
          keys.insert({stream.name(), ranks});
      }
    }
  }
  // Checkpoints gather ZeRO shards over each shard group, and expert blocks
  // and tensor-parallel slices over each expert- or tensor-parallel group
  // (StateIO.cpp).
  for (const plan::Parameter &p : plan.params()) {
    if (std::vector<int> g = plan::shardGroup(plan, p, impl->replica);
        g.size() >= 2)
      keys.insert({kStateStream, g});
    if (plan::sliceMembers(p) >= 2) {
      std::vector<int> ranks = plan::sliceGroup(plan, p, impl->replica);
      std::sort(ranks.begin(), ranks.end());
      keys.insert({kStateStream, ranks});
    }
  }
  std::vector<CommKey> out;
  for (auto &[stream, ranks] : keys)
    out.push_back(CommKey{stream, ranks});
  return out;
}

Status Executor::connect() {
  std::vector<CommKey> keys = commKeys();
  if (!impl->comm) {
    if (keys.empty())
      return Status::ok();
    return Status::error(impl->who +
                         ": the plan communicates but no communicator was "
                         "given");
  }
  return impl->comm->connect(std::move(keys))
      .withContext(impl->who + ": connecting communicators");
}

Status Executor::runStep(int64_t step, double &loss) {
  return impl->runStep(step, loss);
}

int Executor::replicaIndex() const { return impl->replica; }

double Executor::lastGradNorm() const { return impl->lastGradNorm; }

Status ExecutorImpl::allocateDevice(Block &block, size_t bytes,
                                    const std::string &context) {
  void *data = nullptr;
  PIPER_RETURN_IF_ERROR(memory->allocate(bytes, data).withContext(context));
  block.allocator = memory;
  block.data = static_cast<char *>(data);
  block.bytes = bytes;
  return Status::ok();
}

Status ExecutorImpl::allocateBatchStaging() {
  batchLoadOf.assign(plan.streams_size(), {});
  batchLoads.clear();
  size_t bytes = 0;
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    batchLoadOf[s].assign(stream.instructions_size(), -1);
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const Instruction &inst = stream.instructions(i);
      if (inst.kind() != Instruction::LOAD_BATCH)
        continue;
      batchLoadOf[s][i] = static_cast<int>(batchLoads.size());
      batchLoads.push_back({s, i, bytes});
      size_t slot = static_cast<size_t>(bufferViews[inst.outputs(0)]->bytes +
                                        bufferViews[inst.outputs(1)]->bytes);
      bytes += (slot + 63) / 64 * 64;
    }
  }
  batchHalfBytes = bytes;
  for (std::vector<Status> &filled : batchFilled)
    filled.assign(batchLoads.size(), Status::ok());
  if (bytes == 0)
    return Status::ok();
  void *data = nullptr;
  PIPER_RETURN_IF_ERROR(
      memory->allocateHost(2 * bytes, data)
          .withContext("allocating " + std::to_string(2 * bytes) +
                       " bytes of host memory for the batches"));
  batchStaging.allocator = memory;
  batchStaging.host = true;
  batchStaging.data = static_cast<char *>(data);
  batchStaging.bytes = 2 * bytes;
  return Status::ok();
}

void ExecutorImpl::prefetchBatches(int64_t step) {
  const int half = static_cast<int>(step & 1);
  if (batchLoads.empty() || batchStep[half] == step)
    return;
  posFilling.store(step, std::memory_order_relaxed);
  if (step == options.faultDataStep && options.onDataFault)
    options.onDataFault();
  const plan::TrainingConfig &t = plan.training();
  for (size_t k = 0; k < batchLoads.size(); ++k) {
    const BatchLoad &load = batchLoads[k];
    const Instruction &inst =
        plan.streams(load.stream).instructions(load.instruction);
    // The members of a tensor-parallel group read the same data, and the
    // members of a context-parallel group parts of the same sequences.
    int64_t global = plan::batchReplica(plan, replica) * t.num_microbatches() +
                     inst.microbatch();
    char *slot = batchSlot(half, load);
    batchFilled[half][k] = fillContextShard(
        *data, step, global, t.microbatch_size(), t.seq_len(),
        plan::contextParallel(plan), plan::contextMember(plan, replica),
        reinterpret_cast<int32_t *>(slot),
        reinterpret_cast<int32_t *>(slot +
                                    bufferViews[inst.outputs(0)]->bytes));
  }
  batchStep[half] = step;
  posFilling.store(0, std::memory_order_relaxed);
}

std::vector<ProfileEntry> Executor::profile() const {
  return impl->profiler.entries();
}

hal::LaunchTimes Executor::launchTimes() const {
  return impl->device->launchTimes();
}

void Executor::resetProfile() {
  impl->profiler.reset();
  impl->device->resetLaunchTimes();
}

const StepTrace &Executor::stepTrace() const { return impl->tracer.trace(); }

int64_t Executor::liveBytes() const { return impl->memory->liveBytes(); }
int64_t Executor::peakBytes() const { return impl->memory->peakBytes(); }
int64_t Executor::stateBytes() const { return impl->stateBytes; }
double Executor::peakFlops() const { return impl->device->peakFlops(); }

const plan::Plan &Executor::plan() const { return impl->plan; }
int64_t Executor::fileArenaBytes() const { return impl->fileArenaBytes; }

} // namespace piper::runtime

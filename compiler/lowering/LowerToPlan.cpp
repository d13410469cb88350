// Lowering of device programs to plans: segments become kernel lists, nodes
// become per-stream instructions with events across streams.
#include "compiler/lowering/LowerToPlan.h"

#include "compiler/analysis/ProgramInfo.h"
#include "compiler/lowering/KernelAttributes.h"
#include "compiler/lowering/SegmentFusions.h"
#include "compiler/lowering/VocabPadding.h"
#include "dialects/piper/PiperDialect.h"
#include "proto/KernelIds.h"
#include "proto/PlanFile.h"
#include "proto/PlanTensors.h"
#include "proto/analysis/MemoryPlan.h"
#include "proto/analysis/Simulate.h"
#include "llvm/ADT/DenseSet.h"

#include <map>
#include <vector>

using namespace mlir;
using namespace mlir::piper;

namespace {
plan::TensorType toTensorType(Type type) {
  plan::TensorType out;
  auto t = cast<RankedTensorType>(type);
  out.set_dtype(t.getElementType().isInteger(32) ? plan::I32 : plan::F32);
  for (int64_t d : t.getShape())
    out.add_shape(d);
  return out;
}

/// The cost of one call of `seg` (Segment.flops, Segment.bytes_moved).
void setSegmentCost(SegmentOp seg, plan::Segment &out) {
  SegmentCost cost = estimateSegmentCost(seg);
  out.set_flops(cost.flops);
  out.set_bytes_moved(cost.bytes);
}

} // namespace

int64_t mlir::piper::planTensorBytes(const plan::TensorType &t) {
  return std::max<int64_t>(::piper::plan::tensorBytes(t), 0);
}

namespace {
class ClassLowering {
public:
  ClassLowering(ModuleOp module, DeviceProgramOp dp, int64_t worldSize,
                double lossScale, bool fuseKernels, int64_t padVocab)
      : module(module), dp(dp), symbols(module), worldSize(worldSize),
        lossScale(lossScale), fuseKernels(fuseKernels), padVocab(padVocab) {}

  FailureOr<plan::Plan> run() {
    p.set_schema_version(plan::kPlanSchemaVersion);
    p.set_device_class(dp.getDeviceClass());
    for (int64_t r : dp.getRanks())
      p.add_ranks(r);
    p.set_world_size(worldSize);
    groupId(dp.getRanks());

    Block &body = dp.getBody().front();
    // Events: an op whose result is read on another stream records one.
    for (Operation &op : body)
      for (Value v : op.getOperands())
        if (Operation *def = v.getDefiningOp();
            def && streamOf(def) != streamOf(&op) && !eventOf.count(def)) {
          eventOf[def] = eventOf.size();
          opOfEvent.push_back(def);
        }
    p.set_num_events(eventOf.size());

    for (Operation &op : body) {
      plan::Stream &stream = streamFor(&op);
      std::set<int64_t> waits;
      for (Value v : op.getOperands())
        if (Operation *def = v.getDefiningOp();
            def && streamOf(def) != streamOf(&op))
          waits.insert(eventOf.at(def));
      for (int64_t e : waits) {
        plan::Instruction *w = stream.add_instructions();
        w->set_kind(plan::Instruction::WAIT);
        w->set_event(e);
        w->set_label("wait for " + eventLabel(e));
      }
      plan::Instruction *ins = stream.add_instructions();
      ins->set_label(describeNode(&op));
      if (auto batch = dyn_cast<BatchOp>(op)) {
        ins->set_kind(plan::Instruction::LOAD_BATCH);
        ins->set_microbatch(batch.getTag().getMb().value_or(0));
        ins->add_outputs(buffer(batch.getTokens(), "tokens"));
        ins->add_outputs(buffer(batch.getTargets(), "targets"));
        auto t = cast<RankedTensorType>(batch.getTokens().getType());
        p.mutable_training()->set_microbatch_size(t.getDimSize(0));
        // Under context parallelism each member loads its chunks of the
        // whole sequence (LOAD_BATCH): the plan names the whole length.
        p.mutable_training()->set_seq_len(t.getDimSize(1) *
                                          getMesh(module).getCp());
      } else if (auto task = dyn_cast<TaskOp>(op)) {
        FailureOr<int> seg = segment(task.getSegment());
        if (failed(seg))
          return failure();
        ins->set_kind(plan::Instruction::CALL);
        ins->set_segment(*seg);
        for (Value a : task.getArgs())
          ins->add_inputs(buffer(a, ""));
        for (Value r : task.getOuts())
          ins->add_outputs(buffer(r, ins->label()));
      } else if (auto send = dyn_cast<SendOp>(op)) {
        ins->set_kind(plan::Instruction::SEND);
        ins->add_inputs(buffer(send.getInput(), ""));
        ins->set_peer_group(groupId(send.getPeers()));
        ins->set_tag(send.getChannel());
      } else if (auto recv = dyn_cast<RecvOp>(op)) {
        ins->set_kind(plan::Instruction::RECV);
        ins->add_outputs(buffer(recv.getResult(), ins->label()));
        ins->set_peer_group(groupId(recv.getPeers()));
        ins->set_tag(recv.getChannel());
      } else if (isa<ClipGradsOp>(op)) {
        ins->set_kind(plan::Instruction::CLIP_GRADS);
      } else if (auto ar = dyn_cast<AllReduceOp>(op)) {
        ins->set_kind(plan::Instruction::ALL_REDUCE);
        ins->set_group(groupId(ar.getDevices()));
        for (Attribute a : ar.getParams())
          ins->add_params(param(cast<FlatSymbolRefAttr>(a).getAttr()));
        for (auto [in, out] : llvm::zip(ar.getInputs(), ar.getResults())) {
          ins->add_inputs(buffer(in, ""));
          ins->add_outputs(buffer(out, ins->label()));
        }
      } else if (auto rs = dyn_cast<ReduceScatterGradsOp>(op)) {
        ins->set_kind(plan::Instruction::REDUCE_SCATTER_GRADS);
        ins->set_group(groupId(rs.getDevices()));
        if (failed(zeroParams(rs, *ins)))
          return failure();
        for (Value in : rs.getInputs())
          ins->add_inputs(buffer(in, ""));
      } else if (auto ag = dyn_cast<AllGatherParamsOp>(op)) {
        ins->set_kind(plan::Instruction::ALL_GATHER_PARAMS);
        ins->set_group(groupId(ag.getDevices()));
        if (failed(zeroParams(ag, *ins)))
          return failure();
        for (Value r : ag.getResults())
          ins->add_outputs(buffer(r, ins->label()));
      } else if (auto rs = dyn_cast<ReduceScatterOp>(op)) {
        ins->set_kind(plan::Instruction::REDUCE_SCATTER);
        ins->set_group(groupId(rs.getDevices()));
        ins->add_inputs(buffer(rs.getInput(), ""));
        ins->add_outputs(buffer(rs.getResult(), ins->label()));
        setSliceCounts(*ins, rs.getInput().getType(), rs.getGroupSize());
      } else if (auto ag = dyn_cast<AllGatherOp>(op)) {
        ins->set_kind(plan::Instruction::ALL_GATHER);
        ins->set_group(groupId(ag.getDevices()));
        ins->add_inputs(buffer(ag.getInput(), ""));
        ins->add_outputs(buffer(ag.getResult(), ins->label()));
        setSliceCounts(*ins, ag.getResult().getType(), ag.getGroupSize());
      } else if (auto a2a = dyn_cast<AllToAllOp>(op)) {
        ins->set_kind(plan::Instruction::ALL_TO_ALL);
        ins->set_group(groupId(a2a.getDevices()));
        ins->add_inputs(buffer(a2a.getInput(), ""));
        ins->add_inputs(buffer(a2a.getSendCounts(), ""));
        ins->add_outputs(buffer(a2a.getResult(), ins->label()));
        ins->add_outputs(
            buffer(a2a.getRecvCounts(), "counts of " + ins->label()));
      } else {
        return op.emitOpError("cannot be lowered to a plan instruction");
      }
      if (auto c = dyn_cast<CollectiveOpInterface>(op))
        if (ArrayAttr sub = c.getSubgroupsAttr())
          for (Attribute g : sub)
            ins->add_subgroups(groupId(cast<DeviceGroupAttr>(g)));
      if (eventOf.count(&op)) {
        plan::Instruction *rec = stream.add_instructions();
        rec->set_kind(plan::Instruction::RECORD);
        rec->set_event(eventOf.at(&op));
        rec->set_label("after " + ins->label());
      }
    }
    auto *training = p.mutable_training();
    training->set_num_microbatches(dp.getNumMicrobatches());
    training->set_num_replicas(dp.getNumReplicas());
    if (int64_t tp = getMesh(module).getTp(); tp > 1)
      training->set_tensor_parallel(static_cast<int32_t>(tp));
    if (int64_t cp = getMesh(module).getCp(); cp > 1)
      training->set_context_parallel(static_cast<int32_t>(cp));
    if (OptimizerAttr opt = dp.getOptimizerAttr()) {
      training->set_min_lr(opt.getMinLr().convertToDouble());
      training->set_warmup_steps(opt.getWarmupSteps());
      training->set_decay_steps(opt.getDecaySteps());
      training->set_clip_grad_norm(opt.getClipGradNorm().convertToDouble());
      training->set_compute_dtype(
          opt.getDtype() == ComputeType::bf16 ? plan::BF16 : plan::F32);
    }
    // The exact memory plan: arena offsets from lifetimes (schema 2).
    std::string error;
    if (!plan::assignArena(p, error))
      return dp.emitOpError("has no memory plan: ") << error;
    predictMemory();
    return std::move(p);
  }

  /// The predicted peak and state are the memory plan's: the runtime
  /// allocates exactly one arena of arena_bytes.
  void predictMemory() {
    p.set_predicted_state_bytes(p.state_bytes());
    p.set_predicted_peak_bytes(p.arena_bytes());
  }

private:
  std::string eventLabel(int64_t e) { return describeNode(opOfEvent[e]); }

  /// The per-member element counts of a reduce-scatter or all-gather of
  /// `full`: balanced slices along dimension 0.
  static void setSliceCounts(plan::Instruction &ins, Type full,
                             int64_t members) {
    auto t = cast<RankedTensorType>(full);
    int64_t rowElements =
        t.getNumElements() / std::max<int64_t>(1, t.getDimSize(0));
    for (int64_t rows : balancedSlices(t.getDimSize(0), members))
      ins.add_counts(rows * rowElements);
  }

  /// The parameters of a ZeRO collective, with the sharding its stage
  /// implies recorded on each (every collective naming a parameter must
  /// agree).
  template <typename ZeroOp>
  LogicalResult zeroParams(ZeroOp op, plan::Instruction &ins) {
    int group = ins.group();
    int64_t stage = op.getZero();
    for (Attribute a : op.getParamRefs()) {
      StringAttr name = cast<FlatSymbolRefAttr>(a).getAttr();
      int index = param(name);
      ins.add_params(index);
      plan::ParamSharding want;
      want.set_group(group);
      want.set_optimizer(true);
      want.set_gradient(stage >= 2);
      want.set_parameter(stage >= 3);
      plan::Parameter &pp = *p.mutable_params(index);
      auto it = zeroStage.find(name);
      if (it != zeroStage.end() &&
          (it->second != stage || pp.sharding().group() != group))
        return op.emitOpError("shards parameter @")
               << name.getValue() << " as ZeRO-" << stage
               << " over another group or stage than an earlier ZeRO "
                  "collective (ZeRO-"
               << it->second << ")";
      zeroStage[name] = stage;
      *pp.mutable_sharding() = want;
    }
    return success();
  }

  /// The plan stream of `op`'s logical stream, created on first use.
  plan::Stream &streamFor(Operation *op) {
    StreamAttr attr = cast<ProgramNodeOpInterface>(op).getNodeStream();
    for (plan::Stream &s : *p.mutable_streams())
      if (s.name() == attr.getName())
        return s;
    plan::Stream *s = p.add_streams();
    s->set_name(attr.getName().str());
    s->set_kind(attr.isCompute() ? plan::Stream::COMPUTE : plan::Stream::COMM);
    return *s;
  }

  int groupId(ArrayRef<int64_t> ranks) {
    // Looked up, not scanned: a class of a large world has as many groups
    // as members, and a scan per collective made lowering quadratic in the
    // world size (issue 42 item 3).
    std::vector<int64_t> key(ranks.begin(), ranks.end());
    auto it = groupIds.find(key);
    if (it != groupIds.end())
      return it->second;
    plan::DeviceGroup *g = p.add_groups();
    g->set_id(p.groups_size() - 1);
    for (int64_t r : ranks)
      g->add_ranks(r);
    groupIds.emplace(std::move(key), g->id());
    return g->id();
  }

  int buffer(Value v, const std::string &name) {
    auto it = buffers.find(v);
    if (it != buffers.end())
      return it->second;
    plan::Buffer *b = p.add_buffers();
    b->set_id(p.buffers_size() - 1);
    *b->mutable_type() = toTensorType(v.getType());
    b->set_name(name);
    buffers[v] = b->id();
    return b->id();
  }

  int param(StringAttr name) {
    auto it = params.find(name);
    if (it != params.end())
      return it->second;
    auto decl = symbols.lookup<ParamOp>(name);
    plan::Parameter *out = p.add_params();
    out->set_name(name.str());
    *out->mutable_type() = toTensorType(decl.getType());
    switch (decl.getInit()) {
    case InitKind::zeros:
      out->mutable_init()->set_kind(plan::Initializer::ZEROS);
      break;
    case InitKind::ones:
      out->mutable_init()->set_kind(plan::Initializer::ONES);
      break;
    case InitKind::normal:
      out->mutable_init()->set_kind(plan::Initializer::NORMAL);
      break;
    }
    out->mutable_init()->set_scale(decl.getScale().convertToDouble());
    if (std::optional<uint64_t> m = decl.getExpertMembers())
      out->set_expert_members(static_cast<int32_t>(*m));
    if (TensorSliceAttr slice = decl.getTensorSliceAttr()) {
      plan::TensorSlice *ts = out->mutable_tensor_slice();
      ts->set_dim(static_cast<int32_t>(slice.getDim()));
      ts->set_members(static_cast<int32_t>(slice.getMembers()));
      for (int64_t part : slice.getParts())
        ts->add_parts(part);
    }
    for (HfSourceAttr source : getHfSources(decl)) {
      plan::HfSource *hf = out->add_hf_sources();
      hf->set_name(source.getName().str());
      for (int64_t d : source.getShape())
        hf->add_shape(d);
      hf->set_transpose(source.getTranspose().getValue());
      hf->set_index(source.getIndex());
      hf->set_offset(source.getOffset());
    }
    params[name] = p.params_size() - 1;
    return p.params_size() - 1;
  }

  static plan::Operand operand(plan::Operand::Kind kind, int index) {
    plan::Operand o;
    o.set_kind(kind);
    o.set_index(index);
    return o;
  }

  FailureOr<int> segment(StringRef name) {
    auto it = segments.find(name);
    if (it != segments.end())
      return it->second;
    auto seg = symbols.lookup<SegmentOp>(name);
    if (!seg)
      return dp.emitOpError("calls unknown segment @") << name;
    plan::Segment *out = p.add_segments();
    out->set_name(name.str());
    setSegmentCost(seg, *out);
    DenseMap<Value, plan::Operand> values;
    Block &body = seg.getBody().front();
    // Kernels merged into another op's (weight gradients accumulated by
    // their GEMM, GELU in the GEMM's epilogue, the residual add in the
    // norm: SegmentFusions.h).
    SegmentFusions fusions = findSegmentFusions(body, fuseKernels);
    // The logits and their gradient with rows padded (VocabPadding.h).
    VocabPadding padding = findVocabPadding(body, fusions, padVocab);
    auto newValue = [&](Value v) {
      int id = out->values_size();
      plan::TensorType *type = out->add_values();
      *type = toTensorType(v.getType());
      if (int64_t width = padding.width.lookup(v))
        type->set_shape(type->shape_size() - 1, width);
      values[v] = operand(plan::Operand::VALUE, id);
      return id;
    };
    for (BlockArgument a : body.getArguments())
      out->add_args(newValue(a));
    // The output of each fused accumulate_grad's producer kernel, whose
    // parameter index is set where the accumulate_grad was (so that
    // parameters are numbered in the order the unfused lowering meets them).
    DenseMap<Operation *, plan::Operand *> fusedAccumulates;
    std::vector<Operation *> kernelOps; // the op behind each kernel
    for (Operation &op : body) {
      if (auto acc = dyn_cast<AccumulateGradOp>(op);
          acc && fusions.absorbed(&op)) {
        plan::Operand *grad = fusedAccumulates.lookup(&op);
        if (!grad)
          return op.emitOpError("lost the weight gradient it accumulates");
        grad->set_index(param(acc.getParamAttr().getAttr()));
        continue;
      }
      if (fusions.absorbed(&op))
        continue; // its kernel runs as part of another op's
      if (auto ref = dyn_cast<ParamRefOp>(op)) {
        values[ref.getResult()] =
            operand(plan::Operand::PARAM, param(ref.getParamAttr().getAttr()));
        continue;
      }
      if (auto y = dyn_cast<YieldOp>(op)) {
        for (Value v : y.getValues()) {
          plan::Operand o = values.lookup(v);
          if (o.kind() != plan::Operand::VALUE)
            return y.emitOpError("cannot return a parameter from a segment");
          out->add_results(o.index());
        }
        continue;
      }
      plan::Kernel *k = out->add_kernels();
      kernelOps.push_back(&op);
      std::string opName = op.getName().stripDialect().str();
      k->set_op(opName);
      auto setInt = [&](StringRef key, int64_t v) {
        (*k->mutable_attrs())[key.str()].set_i(v);
      };
      // A fused kernel of ops this position absorbed (SegmentFusions.h).
      FailureOr<Operation *> fused = lowerFusedKernel(
          op, fusions,
          {[&](Value v) -> FailureOr<plan::Operand> {
             auto it = values.find(v);
             if (it == values.end())
               return failure();
             return it->second;
           },
           [&](Value v) { return operand(plan::Operand::VALUE, newValue(v)); }},
          *k);
      if (failed(fused))
        return failure();
      if (*fused) {
        setKernelAttributes(**fused, lossScale, getMesh(module).getTp(), *k);
        continue;
      }
      auto setFloat = [&](StringRef key, double v) {
        (*k->mutable_attrs())[key.str()].set_f(v);
      };
      if (auto acc = dyn_cast<AccumulateGradOp>(op)) {
        k->set_op("accumulate");
        *k->add_inputs() = values.lookup(acc.getGrad());
        *k->add_outputs() =
            operand(plan::Operand::GRAD, param(acc.getParamAttr().getAttr()));
        continue;
      }
      if (auto z = dyn_cast<ZeroGradOp>(op)) {
        k->set_op("zero");
        *k->add_outputs() =
            operand(plan::Operand::GRAD, param(z.getParamAttr().getAttr()));
        continue;
      }
      if (auto adam = dyn_cast<AdamWOp>(op)) {
        int idx = param(adam.getParamAttr().getAttr());
        *k->add_inputs() = operand(plan::Operand::GRAD, idx);
        *k->add_outputs() = operand(plan::Operand::PARAM, idx);
        *k->add_outputs() = operand(plan::Operand::ADAM_M, idx);
        *k->add_outputs() = operand(plan::Operand::ADAM_V, idx);
        setFloat("lr", adam.getLr().convertToDouble());
        setFloat("beta1", adam.getBeta1().convertToDouble());
        setFloat("beta2", adam.getBeta2().convertToDouble());
        setFloat("eps", adam.getEps().convertToDouble());
        setFloat("weight_decay", adam.getWeightDecay().convertToDouble());
        auto *t = p.mutable_training();
        t->set_lr(adam.getLr().convertToDouble());
        t->set_beta1(adam.getBeta1().convertToDouble());
        t->set_beta2(adam.getBeta2().convertToDouble());
        t->set_eps(adam.getEps().convertToDouble());
        if (adam.getWeightDecay().convertToDouble() > 0)
          t->set_weight_decay(adam.getWeightDecay().convertToDouble());
        continue;
      }
      for (Value v : op.getOperands()) {
        auto it = values.find(v);
        if (it == values.end())
          return op.emitOpError("uses a value the lowering does not know");
        *k->add_inputs() = it->second;
      }
      auto accumulated = fusions.accumulatesInto.find(&op);
      const bool accumulates = accumulated != fusions.accumulatesInto.end();
      for (auto [i, r] : llvm::enumerate(op.getResults())) {
        if (Operation *acc = accumulates ? accumulated->second[i] : nullptr) {
          // Protobuf's repeated messages do not move as the plan grows.
          plan::Operand *grad = k->add_outputs();
          *grad = operand(plan::Operand::GRAD, -1);
          fusedAccumulates[acc] = grad;
          continue;
        }
        *k->add_outputs() = operand(plan::Operand::VALUE, newValue(r));
      }
      if (accumulates)
        setInt("accumulate", 1);
      if (Operation *gelu = fusions.geluAfter.lookup(&op)) {
        // linear_gelu: h (the linear's result), then gelu's.
        k->set_op("linear_gelu");
        *k->add_outputs() =
            operand(plan::Operand::VALUE, newValue(gelu->getResult(0)));
      }
      setKernelAttributes(op, lossScale, getMesh(module).getTp(), *k);
      if (int64_t valid = padding.validCols.lookup(&op))
        setInt("valid_cols", valid);
      if (isa<LossAccumulateOp>(op))
        p.set_has_loss(true);
    }
    // Only kernels of the table every runtime backend implements
    // (proto/KernelIds.h), with their operand counts and attributes.
    for (int i = 0; i < out->kernels_size(); ++i)
      if (std::string err = plan::checkKernelSignature(out->kernels(i));
          !err.empty())
        return kernelOps[i]->emitOpError("cannot be lowered to a plan kernel: ")
               << err;
    segments[name] = p.segments_size() - 1;
    return p.segments_size() - 1;
  }

  ModuleOp module;
  DeviceProgramOp dp;
  SymbolTable symbols;
  int64_t worldSize;
  double lossScale;
  bool fuseKernels;
  int64_t padVocab;
  plan::Plan p;
  std::map<Operation *, int64_t> eventOf;
  /// The op recording each event (the inverse of eventOf).
  std::vector<Operation *> opOfEvent;
  DenseMap<Value, int> buffers;
  std::map<std::vector<int64_t>, int> groupIds;
  DenseMap<StringAttr, int> params;
  /// The ZeRO stage of each sharded parameter (from its collectives).
  DenseMap<StringAttr, int64_t> zeroStage;
  llvm::StringMap<int> segments;
};
} // namespace

FailureOr<LoweredPlans>
mlir::piper::lowerToPlans(ModuleOp module, const std::string &modelName,
                          const std::string &strategySummary,
                          bool checkProgress, bool fuseKernels,
                          int64_t padVocab) {
  SmallVector<DeviceProgramOp> programs(module.getOps<DeviceProgramOp>());
  if (programs.empty())
    return module.emitError("no device programs to lower");
  int64_t worldSize = 0;
  for (DeviceProgramOp dp : programs)
    for (int64_t r : dp.getRanks())
      worldSize = std::max(worldSize, r + 1);
  LoweredPlans out;
  plan::Manifest &m = out.manifest;
  m.set_schema_version(plan::kPlanSchemaVersion);
  m.set_world_size(worldSize);
  m.set_model_name(modelName);
  m.set_strategy(strategySummary);
  m.set_hf_config(getHfConfig(module).str());
  for (DeviceProgramOp dp : programs) {
    int64_t mbs = dp.getNumMicrobatches();
    int64_t reps = dp.getNumReplicas();
    FailureOr<plan::Plan> plan =
        ClassLowering(module, dp, worldSize, 1.0 / double(mbs * reps),
                      fuseKernels, padVocab)
            .run();
    if (failed(plan))
      return failure();
    plan->set_model_name(modelName);
    plan::Manifest::Class *c = m.add_classes();
    c->set_device_class(plan->device_class());
    for (int64_t r : plan->ranks())
      c->add_ranks(r);
    c->set_plan_file("plan_class" + std::to_string(plan->device_class()) +
                     ".pb");
    out.plans.push_back(std::move(*plan));
  }
  // A parameter held by several classes (tied) is counted once in norms.
  std::map<std::string, int> copies;
  for (const plan::Plan &p : out.plans)
    for (const plan::Parameter &param : p.params())
      ++copies[param.name()];
  for (plan::Plan &p : out.plans)
    for (plan::Parameter &param : *p.mutable_params())
      if (copies[param.name()] > 1)
        param.set_copies(copies[param.name()]);
  // Every class loads batches, so each needs the vocabulary size even when
  // the embedding lives elsewhere.
  // A vocabulary-parallel table is one member's rows.
  int64_t vocab = 0;
  module.walk([&](EmbeddingOp emb) {
    vocab = cast<RankedTensorType>(emb.getTable().getType()).getDimSize(0) *
            emb.getMembers().value_or(1);
  });
  for (plan::Plan &p : out.plans)
    p.mutable_training()->set_vocab_size(vocab);
  // The manifest's training summary merges what the classes know.
  plan::TrainingConfig &t = *m.mutable_training();
  for (const plan::Plan &p : out.plans)
    t.MergeFrom(p.training());
  // The plans must finish a step together. The plan simulator is the one
  // model of cross-device progress (blocking receives, asynchronous sends,
  // collectives that start when every member class reaches them); timing
  // does not matter here, only whether every stream gets to its end.
  plan::Simulation progress;
  std::string error;
  if (checkProgress &&
      !plan::simulate(out.plans, plan::Machine(), plan::SimulateOptions(),
                      progress, error))
    return module.emitError("the device programs cannot finish a step: ")
           << error;
  return out;
}

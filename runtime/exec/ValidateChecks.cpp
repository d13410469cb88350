// Structural plan checks: naming helpers for diagnostics, every index and
// operand of a segment, and the tables each instruction kind refers to.
#include <algorithm>
#include <set>

#include "proto/KernelIds.h"
#include "proto/PlanGroups.h"
#include "proto/PlanShards.h"
#include "runtime/exec/Validate.h"
#include "runtime/exec/ValidateInternal.h"

namespace piper::runtime::validate {

using plan::Instruction;
using plan::Operand;

std::string shapeString(const plan::TensorType &type) {
  std::string s = type.dtype() == plan::I32   ? "i32["
                  : type.dtype() == plan::F32 ? "f32["
                                              : "?[";
  for (int i = 0; i < type.shape_size(); ++i)
    s += (i ? "," : "") + std::to_string(type.shape(i));
  return s + "]";
}

bool sameType(const plan::TensorType &a, const plan::TensorType &b) {
  if (a.dtype() != b.dtype() || a.shape_size() != b.shape_size())
    return false;
  for (int i = 0; i < a.shape_size(); ++i)
    if (a.shape(i) != b.shape(i))
      return false;
  return true;
}

Status checkType(const plan::TensorType &type, const std::string &what) {
  if (type.dtype() != plan::F32 && type.dtype() != plan::I32)
    return Status::error(what + " has dtype " + plan::DType_Name(type.dtype()) +
                         ", expected F32 or I32");
  for (int64_t d : type.shape())
    if (d < 0)
      return Status::error(what + " has a negative dimension in shape " +
                           shapeString(type));
  if (tensorBytes(type) < 0)
    return Status::error(what + " is too large: shape " + shapeString(type));
  return Status::ok();
}

std::string bufferName(const plan::Plan &plan, int id) {
  const std::string &name = plan.buffers(id).name();
  return name.empty() ? "buffer " + std::to_string(id)
                      : "buffer '" + name + "' (id " + std::to_string(id) + ")";
}

std::string paramName(const plan::Plan &plan, int index) {
  return "param '" + plan.params(index).name() + "' (index " +
         std::to_string(index) + ")";
}

const char *stateName(int kind) {
  switch (kind) {
  case Operand::PARAM:
    return "value";
  case Operand::GRAD:
    return "gradient";
  case Operand::ADAM_M:
    return "AdamW first moment";
  default:
    return "AdamW second moment";
  }
}

std::string ranksString(const std::vector<int> &ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

Status checkRankList(const google::protobuf::RepeatedField<int32_t> &ranks,
                     int worldSize, const std::string &what) {
  if (ranks.empty())
    return Status::error(what + " has no ranks");
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= worldSize)
      return Status::error(what + " lists rank " + std::to_string(r) +
                           ", out of range for world_size " +
                           std::to_string(worldSize));
    if (!seen.insert(r).second)
      return Status::error(what + " lists rank " + std::to_string(r) +
                           " twice");
  }
  return Status::ok();
}

namespace {

Status checkBufferId(const plan::Plan &plan, int id, const char *role) {
  if (id < 0 || id >= plan.buffers_size())
    return Status::error(std::string(role) + " buffer " + std::to_string(id) +
                         " is out of range (the plan has " +
                         std::to_string(plan.buffers_size()) + " buffers)");
  return Status::ok();
}

Status checkPeerGroup(const plan::Plan &plan, int group) {
  if (group < 0 || group >= plan.groups_size())
    return Status::error("peer_group " + std::to_string(group) +
                         " is out of range (the plan has " +
                         std::to_string(plan.groups_size()) + " groups)");
  const plan::DeviceGroup &g = plan.groups(group);
  if (g.ranks_size() != plan.ranks_size())
    return Status::error("peer_group " + std::to_string(group) + " has " +
                         std::to_string(g.ranks_size()) +
                         " ranks but the plan runs on " +
                         std::to_string(plan.ranks_size()) +
                         " (replica i talks to peer_group.ranks[i])");
  for (int i = 0; i < g.ranks_size(); ++i)
    if (g.ranks(i) == plan.ranks(i))
      return Status::error("peer_group " + std::to_string(group) +
                           " pairs rank " + std::to_string(g.ranks(i)) +
                           " with itself");
  return Status::ok();
}

} // namespace

Status checkSegment(const plan::Plan &plan, int index) {
  const plan::Segment &seg = plan.segments(index);
  std::string where =
      "segment " + std::to_string(index) + " ('" + seg.name() + "')";
  int numValues = seg.values_size();
  for (int v = 0; v < numValues; ++v)
    PIPER_RETURN_IF_ERROR(
        checkType(seg.values(v), where + " value " + std::to_string(v)));

  std::vector<char> isArg(numValues, 0), defined(numValues, 0);
  for (int a : seg.args()) {
    if (a < 0 || a >= numValues)
      return Status::error(where + ": argument value " + std::to_string(a) +
                           " is out of range (the segment has " +
                           std::to_string(numValues) + " values)");
    if (isArg[a])
      return Status::error(where + ": value " + std::to_string(a) +
                           " is bound to two arguments");
    isArg[a] = defined[a] = 1;
  }

  for (int k = 0; k < seg.kernels_size(); ++k) {
    const plan::Kernel &kernel = seg.kernels(k);
    std::string kwhere =
        where + ", kernel " + std::to_string(k) + " ('" + kernel.op() + "')";
    if (kernel.op().empty())
      return Status::error(kwhere + ": empty op name");
    // The op, its operand counts and required attributes, from the one
    // table the compiler and every backend share.
    std::string signatureError = plan::checkKernelSignature(kernel);
    if (!signatureError.empty())
      return Status::error(kwhere + ": " + signatureError);
    auto checkOperand = [&](const Operand &op, bool isOutput,
                            int position) -> Status {
      std::string owhere = kwhere + (isOutput ? " output " : " input ") +
                           std::to_string(position);
      switch (op.kind()) {
      case Operand::VALUE:
        if (op.index() < 0 || op.index() >= numValues)
          return Status::error(owhere + ": value " +
                               std::to_string(op.index()) +
                               " is out of range (the segment has " +
                               std::to_string(numValues) + " values)");
        if (isOutput && isArg[op.index()])
          return Status::error(
              owhere + ": writes value " + std::to_string(op.index()) +
              ", a segment argument (arguments are read-only: they alias "
              "buffers that other instructions may be reading)");
        if (!isOutput && !defined[op.index()])
          return Status::error(owhere + ": reads value " +
                               std::to_string(op.index()) +
                               " before any kernel writes it");
        return Status::ok();
      case Operand::PARAM:
      case Operand::GRAD:
      case Operand::ADAM_M:
      case Operand::ADAM_V:
        if (op.index() < 0 || op.index() >= plan.params_size())
          return Status::error(owhere + ": " + Operand::Kind_Name(op.kind()) +
                               " index " + std::to_string(op.index()) +
                               " is out of range (the plan has " +
                               std::to_string(plan.params_size()) + " params)");
        // A ZeRO shard holds a range of the tensor: only the optimizer
        // (on its range) and `zero` may touch it.
        if (kernel.op() != "adamw" && kernel.op() != "zero" &&
            plan::stateSharded(plan.params(op.index()),
                               static_cast<int>(op.kind()) - 1))
          return Status::error(
              owhere + ": the " + stateName(op.kind()) + " of " +
              paramName(plan, op.index()) +
              " is a ZeRO shard; only adamw and zero may use it (gather "
              "the parameter first)");
        return Status::ok();
      default:
        return Status::error(owhere + ": unknown operand kind " +
                             std::to_string(op.kind()));
      }
    };
    for (int i = 0; i < kernel.inputs_size(); ++i)
      PIPER_RETURN_IF_ERROR(checkOperand(kernel.inputs(i), false, i));
    for (int i = 0; i < kernel.outputs_size(); ++i) {
      PIPER_RETURN_IF_ERROR(checkOperand(kernel.outputs(i), true, i));
      if (kernel.outputs(i).kind() == Operand::VALUE)
        defined[kernel.outputs(i).index()] = 1;
    }
  }

  for (int r : seg.results()) {
    if (r < 0 || r >= numValues)
      return Status::error(where + ": result value " + std::to_string(r) +
                           " is out of range (the segment has " +
                           std::to_string(numValues) + " values)");
    if (!defined[r])
      return Status::error(where + ": result value " + std::to_string(r) +
                           " is never written");
  }
  return checkPaddedValues(seg, where);
}

namespace {
/// A collective's group (and subgroups) exist and contain every rank
/// running the plan.
Status checkCollectiveGroup(const plan::Plan &plan, const Instruction &inst) {
  std::string problem = plan::checkCollectiveGroups(plan, inst);
  if (!problem.empty())
    return Status::error(problem);
  const plan::DeviceGroup &g = plan.groups(inst.group());
  for (int r : plan.ranks())
    if (std::find(g.ranks().begin(), g.ranks().end(), r) == g.ranks().end())
      return Status::error("group " + std::to_string(inst.group()) +
                           " does not contain rank " + std::to_string(r) +
                           ", which runs this plan");
  return Status::ok();
}

/// How many ranks run a (checked) collective together: the group's, or one
/// subgroup's.
int memberCount(const plan::Plan &plan, const Instruction &inst) {
  int id = inst.subgroups_size() ? inst.subgroups(0) : inst.group();
  return plan.groups(id).ranks_size();
}

int64_t elementsOf(const plan::TensorType &t) {
  int64_t n = 1;
  for (int64_t d : t.shape())
    n *= d;
  return n;
}

/// The buffer form of ALL_REDUCE: inputs[i] summed into outputs[i].
Status checkBufferAllReduce(const plan::Plan &plan, const Instruction &inst) {
  if (inst.inputs_size() == 0)
    return Status::error("ALL_REDUCE lists neither params nor buffers");
  if (inst.inputs_size() != inst.outputs_size())
    return Status::error("ALL_REDUCE of buffers takes as many outputs as "
                         "inputs, got " +
                         std::to_string(inst.inputs_size()) + " and " +
                         std::to_string(inst.outputs_size()));
  for (int i = 0; i < inst.inputs_size(); ++i) {
    const plan::TensorType &in = plan.buffers(inst.inputs(i)).type();
    const plan::TensorType &out = plan.buffers(inst.outputs(i)).type();
    if (!sameType(in, out))
      return Status::error("ALL_REDUCE input " + bufferName(plan, inst.inputs(i)) +
                           " is " + shapeString(in) + " but output " +
                           bufferName(plan, inst.outputs(i)) + " is " +
                           shapeString(out));
    if (in.dtype() != plan::F32)
      return Status::error("ALL_REDUCE sums f32 buffers; " +
                           bufferName(plan, inst.inputs(i)) + " is " +
                           shapeString(in));
    if (inst.inputs(i) == inst.outputs(i))
      return Status::error("ALL_REDUCE reads and writes " +
                           bufferName(plan, inst.inputs(i)) +
                           "; its output must be another buffer");
  }
  return Status::ok();
}

/// REDUCE_SCATTER and ALL_GATHER: one count per member, slices that fit.
Status checkSlices(const plan::Plan &plan, const Instruction &inst) {
  bool scatter = inst.kind() == Instruction::REDUCE_SCATTER;
  const char *name = scatter ? "REDUCE_SCATTER" : "ALL_GATHER";
  const plan::TensorType &in = plan.buffers(inst.inputs(0)).type();
  const plan::TensorType &out = plan.buffers(inst.outputs(0)).type();
  int members = memberCount(plan, inst);
  if (inst.counts_size() != members)
    return Status::error(std::string(name) + " has " +
                         std::to_string(inst.counts_size()) +
                         " counts for a group of " + std::to_string(members));
  if (in.dtype() != out.dtype())
    return Status::error(std::string(name) + " input is " + shapeString(in) +
                         " but output is " + shapeString(out));
  if (scatter && in.dtype() != plan::F32)
    return Status::error("REDUCE_SCATTER sums f32 buffers, not " +
                         shapeString(in));
  int64_t total = 0, largest = 0;
  for (int64_t c : inst.counts()) {
    if (c < 0)
      return Status::error(std::string(name) + " has a negative count " +
                           std::to_string(c));
    total += c;
    largest = std::max(largest, c);
  }
  const plan::TensorType &full = scatter ? in : out;
  const plan::TensorType &slice = scatter ? out : in;
  if (total != elementsOf(full))
    return Status::error(std::string(name) + " counts sum to " +
                         std::to_string(total) + " elements but " +
                         bufferName(plan, scatter ? inst.inputs(0)
                                                  : inst.outputs(0)) +
                         " has " + std::to_string(elementsOf(full)));
  if (largest > elementsOf(slice))
    return Status::error(std::string(name) + " has a slice of " +
                         std::to_string(largest) + " elements but " +
                         bufferName(plan, scatter ? inst.outputs(0)
                                                  : inst.inputs(0)) +
                         " holds " + std::to_string(elementsOf(slice)));
  return Status::ok();
}

/// ALL_TO_ALL: data buffers that differ only in rows, and one i32 count
/// per member.
Status checkAllToAll(const plan::Plan &plan, const Instruction &inst) {
  int members = memberCount(plan, inst);
  const plan::TensorType &in = plan.buffers(inst.inputs(0)).type();
  const plan::TensorType &out = plan.buffers(inst.outputs(0)).type();
  if (in.dtype() != out.dtype() || in.shape_size() < 1 ||
      in.shape_size() != out.shape_size() ||
      !std::equal(in.shape().begin() + 1, in.shape().end(),
                  out.shape().begin() + 1))
    return Status::error("ALL_TO_ALL input " + shapeString(in) +
                         " and output " + shapeString(out) +
                         " must differ in their first dimension only");
  for (int id : {inst.inputs(1), inst.outputs(1)}) {
    const plan::TensorType &c = plan.buffers(id).type();
    if (c.dtype() != plan::I32 || c.shape_size() != 1 || c.shape(0) != members)
      return Status::error("ALL_TO_ALL counts " + bufferName(plan, id) +
                           " is " + shapeString(c) +
                           ", expected one i32 per member (" +
                           std::to_string(members) + ")");
  }
  return Status::ok();
}
} // namespace

/// REDUCE_SCATTER_GRADS and ALL_GATHER_PARAMS: distinct parameters sharded
/// over exactly this group, and buffers (when given) of their whole types.
Status checkZeroCollective(const plan::Plan &plan, const Instruction &inst) {
  bool scatter = inst.kind() == Instruction::REDUCE_SCATTER_GRADS;
  const std::string name = Instruction::Kind_Name(inst.kind());
  if (inst.params().empty())
    return Status::error(name + " lists no params");
  // Under tensor parallelism each member's replicas form a shard group:
  // the subgroups are those strided groups, member t's t-th
  // (plan::shardGroup); otherwise the instruction's group is the one.
  const int64_t tp = plan::tensorParallel(plan);
  if (tp == 1 && inst.subgroups_size() > 0)
    return Status::error(name + " runs over the whole shard group, without "
                                "subgroups");
  if (tp > 1) {
    bool strided = inst.subgroups_size() == tp && inst.group() >= 0 &&
                   inst.group() < plan.groups_size();
    for (int t = 0; strided && t < tp; ++t) {
      int id = inst.subgroups(t);
      if (id < 0 || id >= plan.groups_size()) {
        strided = false;
        break;
      }
      const auto &whole = plan.groups(inst.group()).ranks();
      const auto &sub = plan.groups(id).ranks();
      int k = 0;
      for (int r = t; r < whole.size() && strided; r += tp, ++k)
        strided = k < sub.size() && sub[k] == whole[r];
      strided = strided && k == sub.size();
    }
    if (!strided)
      return Status::error(
          name + " under tensor_parallel " + std::to_string(tp) +
          " needs " + std::to_string(tp) +
          " subgroups, the data replicas of each tensor-parallel member "
          "({t, t + " + std::to_string(tp) + ", ...} of its group)");
  }
  const auto &buffers = scatter ? inst.inputs() : inst.outputs();
  if ((scatter ? inst.outputs_size() : inst.inputs_size()) != 0 ||
      (!buffers.empty() && buffers.size() != inst.params_size()))
    return Status::error(
        name + (scatter ? " takes no outputs and either no inputs"
                        : " takes no inputs and either no outputs") +
        " or one per param; got " + std::to_string(inst.inputs_size()) +
        " inputs and " + std::to_string(inst.outputs_size()) + " outputs for " +
        std::to_string(inst.params_size()) + " params");
  std::set<int> seen;
  for (int i = 0; i < inst.params_size(); ++i) {
    int p = inst.params(i);
    if (p < 0 || p >= plan.params_size())
      return Status::error("param " + std::to_string(p) +
                           " is out of range (the plan has " +
                           std::to_string(plan.params_size()) + " params)");
    if (!seen.insert(p).second)
      return Status::error(paramName(plan, p) + " is listed twice");
    const plan::Parameter &param = plan.params(p);
    if (!param.has_sharding() || param.sharding().group() != inst.group())
      return Status::error(name + " of " + paramName(plan, p) +
                           ", which is not sharded over group " +
                           std::to_string(inst.group()));
    // The whole-tensor forms work in place on whole state.
    if (buffers.empty() && plan::stateSharded(param, scatter ? 1 : 0))
      return Status::error(
          name + " without " + (scatter ? "inputs" : "outputs") +
          " works on whole tensors, but the " +
          (scatter ? "gradient" : "value") + " of " + paramName(plan, p) +
          " is a shard");
    if (!buffers.empty()) {
      plan::TensorType want = param.type();
      want.set_dtype(plan::F32);
      const plan::TensorType &have = plan.buffers(buffers[i]).type();
      if (!sameType(want, have))
        return Status::error(std::string(scatter ? "input " : "output ") +
                             bufferName(plan, buffers[i]) + " is " +
                             shapeString(have) + " but " + paramName(plan, p) +
                             " is " + shapeString(want));
    }
  }
  return Status::ok();
}

Status checkInstruction(const plan::Plan &plan, const Instruction &inst) {
  auto expectCounts = [&](int inputs, int outputs) -> Status {
    if (inst.inputs_size() != inputs || inst.outputs_size() != outputs)
      return Status::error(Instruction::Kind_Name(inst.kind()) + " takes " +
                           std::to_string(inputs) + " input and " +
                           std::to_string(outputs) + " output buffers, got " +
                           std::to_string(inst.inputs_size()) + " and " +
                           std::to_string(inst.outputs_size()));
    return Status::ok();
  };
  for (int id : inst.inputs())
    PIPER_RETURN_IF_ERROR(checkBufferId(plan, id, "input"));
  for (int id : inst.outputs())
    PIPER_RETURN_IF_ERROR(checkBufferId(plan, id, "output"));

  switch (inst.kind()) {
  case Instruction::CALL: {
    if (inst.segment() < 0 || inst.segment() >= plan.segments_size())
      return Status::error("segment " + std::to_string(inst.segment()) +
                           " is out of range (the plan has " +
                           std::to_string(plan.segments_size()) + " segments)");
    const plan::Segment &seg = plan.segments(inst.segment());
    if (inst.inputs_size() != seg.args_size() ||
        inst.outputs_size() != seg.results_size())
      return Status::error(
          "segment '" + seg.name() + "' takes " +
          std::to_string(seg.args_size()) + " arguments and " +
          std::to_string(seg.results_size()) + " results, the call binds " +
          std::to_string(inst.inputs_size()) + " input and " +
          std::to_string(inst.outputs_size()) + " output buffers");
    for (int i = 0; i < inst.inputs_size(); ++i) {
      const plan::TensorType &want = seg.values(seg.args(i));
      const plan::TensorType &have = plan.buffers(inst.inputs(i)).type();
      if (!sameType(want, have))
        return Status::error("input " + std::to_string(i) + ": " +
                             bufferName(plan, inst.inputs(i)) + " is " +
                             shapeString(have) + " but segment '" + seg.name() +
                             "' argument " + std::to_string(i) + " is " +
                             shapeString(want));
    }
    for (int i = 0; i < inst.outputs_size(); ++i) {
      const plan::TensorType &want = seg.values(seg.results(i));
      const plan::TensorType &have = plan.buffers(inst.outputs(i)).type();
      if (!sameType(want, have))
        return Status::error("output " + std::to_string(i) + ": " +
                             bufferName(plan, inst.outputs(i)) + " is " +
                             shapeString(have) + " but segment '" + seg.name() +
                             "' result " + std::to_string(i) + " is " +
                             shapeString(want));
    }
    return Status::ok();
  }
  case Instruction::SEND:
    PIPER_RETURN_IF_ERROR(expectCounts(1, 0));
    if (inst.tag() < 0)
      return Status::error("negative tag " + std::to_string(inst.tag()));
    return checkPeerGroup(plan, inst.peer_group());
  case Instruction::RECV:
    PIPER_RETURN_IF_ERROR(expectCounts(0, 1));
    if (inst.tag() < 0)
      return Status::error("negative tag " + std::to_string(inst.tag()));
    return checkPeerGroup(plan, inst.peer_group());
  case Instruction::ALL_REDUCE: {
    PIPER_RETURN_IF_ERROR(checkCollectiveGroup(plan, inst));
    if (!inst.params().empty() && inst.inputs_size() > 0)
      return Status::error("ALL_REDUCE sums either params or buffers, not "
                           "both");
    if (inst.params().empty())
      return checkBufferAllReduce(plan, inst);
    PIPER_RETURN_IF_ERROR(expectCounts(0, 0));
    std::set<int> seen;
    for (int p : inst.params()) {
      if (p < 0 || p >= plan.params_size())
        return Status::error("param " + std::to_string(p) +
                             " is out of range (the plan has " +
                             std::to_string(plan.params_size()) + " params)");
      if (!seen.insert(p).second)
        return Status::error(paramName(plan, p) + " is listed twice");
    }
    return Status::ok();
  }
  case Instruction::REDUCE_SCATTER:
  case Instruction::ALL_GATHER:
    PIPER_RETURN_IF_ERROR(expectCounts(1, 1));
    PIPER_RETURN_IF_ERROR(checkCollectiveGroup(plan, inst));
    return checkSlices(plan, inst);
  case Instruction::ALL_TO_ALL:
    PIPER_RETURN_IF_ERROR(expectCounts(2, 2));
    PIPER_RETURN_IF_ERROR(checkCollectiveGroup(plan, inst));
    return checkAllToAll(plan, inst);
  case Instruction::REDUCE_SCATTER_GRADS:
  case Instruction::ALL_GATHER_PARAMS:
    PIPER_RETURN_IF_ERROR(checkCollectiveGroup(plan, inst));
    return checkZeroCollective(plan, inst);
  case Instruction::RECORD:
  case Instruction::WAIT:
    PIPER_RETURN_IF_ERROR(expectCounts(0, 0));
    if (inst.event() < 0 || inst.event() >= plan.num_events())
      return Status::error("event " + std::to_string(inst.event()) +
                           " is out of range (num_events is " +
                           std::to_string(plan.num_events()) + ")");
    return Status::ok();
  case Instruction::LOAD_BATCH: {
    PIPER_RETURN_IF_ERROR(expectCounts(0, 2));
    const plan::TrainingConfig &t = plan.training();
    if (t.num_microbatches() < 1 || t.microbatch_size() < 1 ||
        t.seq_len() < 1 || t.vocab_size() < 1)
      return Status::error(
          "LOAD_BATCH needs training.num_microbatches, microbatch_size, "
          "seq_len and vocab_size of at least 1");
    if (t.tensor_parallel() < 0 ||
        int64_t(t.num_replicas()) * plan::tensorParallel(plan) !=
            plan.ranks_size())
      return Status::error(
          "training.num_replicas is " + std::to_string(t.num_replicas()) +
          " and tensor_parallel " + std::to_string(t.tensor_parallel()) +
          " but the plan runs on " + std::to_string(plan.ranks_size()) +
          " ranks (LOAD_BATCH picks data by replica index over the "
          "tensor-parallel degree)");
    const int64_t cp = plan::contextParallel(plan);
    if (t.context_parallel() < 0 || t.num_replicas() % cp != 0)
      return Status::error(
          "training.context_parallel is " +
          std::to_string(t.context_parallel()) +
          ", which does not divide num_replicas " +
          std::to_string(t.num_replicas()) +
          " (LOAD_BATCH splits each sequence over consecutive replicas)");
    if (cp > 1 && t.seq_len() % (2 * cp) != 0)
      return Status::error(
          "training.seq_len " + std::to_string(t.seq_len()) +
          " is not a multiple of 2 x context_parallel " + std::to_string(cp) +
          " (each context member holds 2 of the sequence's 2N equal chunks)");
    if (inst.microbatch() < 0 || inst.microbatch() >= t.num_microbatches())
      return Status::error("microbatch " + std::to_string(inst.microbatch()) +
                           " is out of range (num_microbatches is " +
                           std::to_string(t.num_microbatches()) + ")");
    plan::TensorType want;
    want.set_dtype(plan::I32);
    want.add_shape(t.microbatch_size());
    want.add_shape(t.seq_len() / cp);
    for (int i = 0; i < 2; ++i)
      if (!sameType(plan.buffers(inst.outputs(i)).type(), want))
        return Status::error(std::string(i == 0 ? "tokens " : "targets ") +
                             bufferName(plan, inst.outputs(i)) + " is " +
                             shapeString(plan.buffers(inst.outputs(i)).type()) +
                             ", expected " + shapeString(want) +
                             (cp == 1 ? " (training.microbatch_size x "
                                        "training.seq_len)"
                                      : " (training.microbatch_size x "
                                        "training.seq_len / "
                                        "context_parallel)"));
    return Status::ok();
  }
  case Instruction::CLIP_GRADS:
    PIPER_RETURN_IF_ERROR(expectCounts(0, 0));
    if (plan.training().clip_grad_norm() < 0)
      return Status::error("training.clip_grad_norm must not be negative");
    return Status::ok();
  default:
    // Also kind 8, the removed UPDATE (reserved in plan.proto).
    return Status::error("unknown instruction kind " +
                         std::to_string(inst.kind()) +
                         " (not an Instruction.Kind of this runtime's "
                         "plan.proto; recompile the strategy with a matching "
                         "piperc)");
  }
}

} // namespace piper::runtime::validate

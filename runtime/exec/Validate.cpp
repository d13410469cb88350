// Plan and strategy validation: structural checks, then a simulation of the
// streams that finds event deadlocks and unordered cross-stream accesses.
#include "runtime/exec/Validate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "proto/PlanFile.h"

namespace piper::runtime {

using plan::Instruction;
using plan::Operand;

namespace {

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

/// Checks that `ranks` is a non-empty set of distinct world ranks.
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

Status checkSegment(const plan::Plan &plan, int index,
                    const std::vector<std::string> &knownKernels) {
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
    if (!knownKernels.empty() &&
        std::find(knownKernels.begin(), knownKernels.end(), kernel.op()) ==
            knownKernels.end())
      return Status::error(kwhere + ": unknown kernel '" + kernel.op() + "'");
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
  return Status::ok();
}

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

/// The checks of one instruction that need nothing but the plan's tables.
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
    PIPER_RETURN_IF_ERROR(expectCounts(0, 0));
    if (inst.group() < 0 || inst.group() >= plan.groups_size())
      return Status::error("group " + std::to_string(inst.group()) +
                           " is out of range (the plan has " +
                           std::to_string(plan.groups_size()) + " groups)");
    const plan::DeviceGroup &g = plan.groups(inst.group());
    for (int r : plan.ranks())
      if (std::find(g.ranks().begin(), g.ranks().end(), r) == g.ranks().end())
        return Status::error("group " + std::to_string(inst.group()) +
                             " does not contain rank " + std::to_string(r) +
                             ", which runs this plan");
    if (inst.params().empty())
      return Status::error("ALL_REDUCE lists no params");
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
    if (t.num_replicas() != plan.ranks_size())
      return Status::error(
          "training.num_replicas is " + std::to_string(t.num_replicas()) +
          " but the plan runs on " + std::to_string(plan.ranks_size()) +
          " ranks (LOAD_BATCH picks data by replica index)");
    if (inst.microbatch() < 0 || inst.microbatch() >= t.num_microbatches())
      return Status::error("microbatch " + std::to_string(inst.microbatch()) +
                           " is out of range (num_microbatches is " +
                           std::to_string(t.num_microbatches()) + ")");
    plan::TensorType want;
    want.set_dtype(plan::I32);
    want.add_shape(t.microbatch_size());
    want.add_shape(t.seq_len());
    for (int i = 0; i < 2; ++i)
      if (!sameType(plan.buffers(inst.outputs(i)).type(), want))
        return Status::error(std::string(i == 0 ? "tokens " : "targets ") +
                             bufferName(plan, inst.outputs(i)) + " is " +
                             shapeString(plan.buffers(inst.outputs(i)).type()) +
                             ", expected " + shapeString(want) +
                             " (training.microbatch_size x training.seq_len)");
    return Status::ok();
  }
  case Instruction::CLIP_GRADS:
    PIPER_RETURN_IF_ERROR(expectCounts(0, 0));
    if (plan.training().clip_grad_norm() < 0)
      return Status::error("training.clip_grad_norm must not be negative");
    return Status::ok();
  case Instruction::UPDATE:
    return Status::error("instruction kind UPDATE is reserved and not "
                         "supported by this runtime");
  default:
    return Status::error("unknown instruction kind " +
                         std::to_string(inst.kind()));
  }
}

/// A position in the plan: stream and instruction index.
struct Pos {
  int stream = -1;
  int inst = -1;
};

/// The ordering facts of one step, from simulating the streams with events
/// as the only cross-stream edges: clock[s][i][t] is how many instructions
/// of stream t are known to have completed when instruction i of stream s
/// starts.
struct Ordering {
  std::vector<std::vector<std::vector<int>>> clock;
  bool happensBefore(Pos a, Pos b) const {
    if (a.stream == b.stream)
      return a.inst < b.inst;
    return clock[b.stream][b.inst][a.stream] > a.inst;
  }
};

Status simulateStreams(const plan::Plan &plan,
                       const std::vector<Pos> &recordedAt, Ordering &order) {
  int numStreams = plan.streams_size();
  std::vector<int> pc(numStreams, 0);
  std::vector<std::vector<int>> now(numStreams, std::vector<int>(numStreams));
  std::vector<std::vector<int>> eventClock(plan.num_events());
  std::vector<char> recorded(plan.num_events(), 0);
  order.clock.assign(numStreams, {});
  for (int s = 0; s < numStreams; ++s)
    order.clock[s].resize(plan.streams(s).instructions_size());

  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < numStreams; ++s) {
      const plan::Stream &stream = plan.streams(s);
      while (pc[s] < stream.instructions_size()) {
        const Instruction &inst = stream.instructions(pc[s]);
        if (inst.kind() == Instruction::WAIT) {
          if (!recorded[inst.event()])
            break;
          for (int t = 0; t < numStreams; ++t)
            now[s][t] = std::max(now[s][t], eventClock[inst.event()][t]);
        }
        order.clock[s][pc[s]] = now[s];
        now[s][s] = ++pc[s];
        if (inst.kind() == Instruction::RECORD) {
          recorded[inst.event()] = 1;
          eventClock[inst.event()] = now[s];
        }
        progress = true;
      }
    }
  }

  std::string blocked;
  for (int s = 0; s < numStreams; ++s) {
    if (pc[s] == plan.streams(s).instructions_size())
      continue;
    int event = plan.streams(s).instructions(pc[s]).event();
    Pos rec = recordedAt[event];
    blocked += (blocked.empty() ? "" : "; ") +
               instructionContext(plan, s, pc[s]) + " waits for event " +
               std::to_string(event) + ", recorded by " +
               instructionContext(plan, rec.stream, rec.inst);
  }
  if (!blocked.empty())
    return Status::error("the streams deadlock on events: " + blocked);
  return Status::ok();
}

} // namespace

int64_t tensorBytes(const plan::TensorType &type) {
  // F32 and I32 are 4 bytes; BF16 (the runtime's packed step buffers) 2.
  int64_t n = type.dtype() == plan::BF16 ? 2 : 4;
  for (int64_t d : type.shape()) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t(1) << 46))
      return -1;
  }
  return n;
}

std::string instructionContext(const plan::Plan &plan, int stream,
                               int instruction) {
  const plan::Stream &s = plan.streams(stream);
  std::string label;
  if (instruction >= 0 && instruction < s.instructions_size()) {
    const Instruction &inst = s.instructions(instruction);
    label = inst.label();
    if (label.empty())
      label = Instruction::Kind_IsValid(inst.kind())
                  ? Instruction::Kind_Name(inst.kind())
                  : "kind " + std::to_string(inst.kind());
  }
  return "stream '" + s.name() + "', instruction " +
         std::to_string(instruction) + " (" + label + ")";
}

Status validatePlan(const plan::Plan &plan,
                    const std::vector<std::string> &knownKernels) {
  if (plan.schema_version() != plan::kPlanSchemaVersion)
    return Status::error("plan schema version " +
                         std::to_string(plan.schema_version()) +
                         " is not supported (this runtime reads version " +
                         std::to_string(plan::kPlanSchemaVersion) + ")");
  if (plan.world_size() < 1)
    return Status::error("world_size " + std::to_string(plan.world_size()) +
                         " must be at least 1");
  PIPER_RETURN_IF_ERROR(
      checkRankList(plan.ranks(), plan.world_size(), "the plan"));
  if (plan.num_events() < 0)
    return Status::error("num_events is negative");

  for (int g = 0; g < plan.groups_size(); ++g) {
    const plan::DeviceGroup &group = plan.groups(g);
    std::string what = "group " + std::to_string(g);
    if (group.id() != g)
      return Status::error(what + " has id " + std::to_string(group.id()) +
                           " (groups are referenced by position; id must "
                           "equal the position)");
    PIPER_RETURN_IF_ERROR(
        checkRankList(group.ranks(), plan.world_size(), what));
  }

  std::set<std::string> paramNames;
  for (int p = 0; p < plan.params_size(); ++p) {
    const plan::Parameter &param = plan.params(p);
    std::string what =
        "param " + std::to_string(p) + " ('" + param.name() + "')";
    if (param.name().empty())
      return Status::error(what + " has no name");
    // Names key the initializer and name the --save-params files.
    if (param.name().find('/') != std::string::npos ||
        param.name().find('\0') != std::string::npos || param.name()[0] == '.')
      return Status::error(what + " is not usable as a file name (no '/', "
                                  "no leading '.')");
    if (!paramNames.insert(param.name()).second)
      return Status::error(what + ": the name is used twice");
    PIPER_RETURN_IF_ERROR(checkType(param.type(), what));
    if (param.type().dtype() != plan::F32)
      return Status::error(what + " must be F32");
    if (!plan::Initializer::Kind_IsValid(param.init().kind()))
      return Status::error(what + " has unknown initializer kind " +
                           std::to_string(param.init().kind()));
    if (!std::isfinite(param.init().scale()))
      return Status::error(what + " has a non-finite initializer scale");
  }

  for (int b = 0; b < plan.buffers_size(); ++b) {
    const plan::Buffer &buf = plan.buffers(b);
    if (buf.id() != b)
      return Status::error(bufferName(plan, b) + " is at position " +
                           std::to_string(b) + " but has id " +
                           std::to_string(buf.id()) +
                           " (buffers are referenced by position; id must "
                           "equal the position)");
    PIPER_RETURN_IF_ERROR(checkType(buf.type(), bufferName(plan, b)));
  }

  for (int s = 0; s < plan.segments_size(); ++s)
    PIPER_RETURN_IF_ERROR(checkSegment(plan, s, knownKernels));

  std::set<std::string> streamNames;
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    if (stream.name().empty())
      return Status::error("stream " + std::to_string(s) + " has no name");
    if (!streamNames.insert(stream.name()).second)
      return Status::error("stream name '" + stream.name() + "' is used twice");
    for (int i = 0; i < stream.instructions_size(); ++i)
      PIPER_RETURN_IF_ERROR(checkInstruction(plan, stream.instructions(i))
                                .withContext(instructionContext(plan, s, i)));
  }

  // Buffers are single-assignment within a step; events are recorded once.
  std::vector<Pos> writer(plan.buffers_size()), recordedAt(plan.num_events());
  std::vector<std::pair<int, Pos>> reads;
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const Instruction &inst = stream.instructions(i);
      for (int id : inst.outputs()) {
        if (writer[id].stream >= 0)
          return Status::error(
              instructionContext(plan, s, i) + ": writes " +
              bufferName(plan, id) + ", already written by " +
              instructionContext(plan, writer[id].stream, writer[id].inst) +
              " (a buffer has one writer per step)");
        writer[id] = {s, i};
      }
      for (int id : inst.inputs())
        reads.push_back({id, {s, i}});
      if (inst.kind() == Instruction::RECORD) {
        Pos &at = recordedAt[inst.event()];
        if (at.stream >= 0)
          return Status::error(
              instructionContext(plan, s, i) + ": records event " +
              std::to_string(inst.event()) + ", already recorded by " +
              instructionContext(plan, at.stream, at.inst));
        at = {s, i};
      }
    }
  }
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const Instruction &inst = stream.instructions(i);
      if (inst.kind() == Instruction::WAIT &&
          recordedAt[inst.event()].stream < 0)
        return Status::error(
            instructionContext(plan, s, i) + ": waits for event " +
            std::to_string(inst.event()) + ", which no instruction records");
    }
  }
  for (auto &[id, at] : reads)
    if (writer[id].stream < 0)
      return Status::error(instructionContext(plan, at.stream, at.inst) +
                           ": reads " + bufferName(plan, id) +
                           ", which no instruction writes");

  Ordering order;
  PIPER_RETURN_IF_ERROR(simulateStreams(plan, recordedAt, order));

  for (auto &[id, at] : reads) {
    Pos w = writer[id];
    if (!order.happensBefore(w, at))
      return Status::error(
          instructionContext(plan, at.stream, at.inst) + ": reads " +
          bufferName(plan, id) + ", written by " +
          instructionContext(plan, w.stream, w.inst) +
          (w.stream == at.stream
               ? ", which comes later in the stream"
               : ", with no RECORD/WAIT ordering the write first"));
  }

  // Persistent state touched from two streams needs an event between the
  // accesses whenever one of them writes, or numerics depend on timing.
  struct Access {
    Pos at;
    bool write;
  };
  std::map<std::pair<int, int>, std::vector<Access>> accesses;
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const Instruction &inst = stream.instructions(i);
      std::map<std::pair<int, int>, bool> touched;
      if (inst.kind() == Instruction::CALL) {
        for (const plan::Kernel &k : plan.segments(inst.segment()).kernels()) {
          for (const Operand &op : k.inputs())
            if (op.kind() != Operand::VALUE)
              touched[{op.index(), op.kind()}] |= false;
          for (const Operand &op : k.outputs())
            if (op.kind() != Operand::VALUE)
              touched[{op.index(), op.kind()}] = true;
        }
      } else if (inst.kind() == Instruction::ALL_REDUCE) {
        for (int p : inst.params())
          touched[{p, Operand::GRAD}] = true;
      } else if (inst.kind() == Instruction::CLIP_GRADS) {
        for (int p = 0; p < plan.params_size(); ++p)
          touched[{p, Operand::GRAD}] = true;
      }
      for (auto &[key, write] : touched)
        accesses[key].push_back({{s, i}, write});
    }
  }
  for (auto &[key, list] : accesses) {
    for (size_t a = 0; a < list.size(); ++a) {
      for (size_t b = a + 1; b < list.size(); ++b) {
        const Access &x = list[a], &y = list[b];
        if (x.at.stream == y.at.stream || (!x.write && !y.write))
          continue;
        if (order.happensBefore(x.at, y.at) || order.happensBefore(y.at, x.at))
          continue;
        return Status::error(
            instructionContext(plan, y.at.stream, y.at.inst) + " and " +
            instructionContext(plan, x.at.stream, x.at.inst) +
            " both access the " + stateName(key.second) + " of " +
            paramName(plan, key.first) +
            ", at least one writing, with no RECORD/WAIT ordering them");
      }
    }
  }
  return Status::ok();
}

Status validateStrategy(const plan::Manifest &manifest,
                        const std::vector<plan::Plan> &plans) {
  int world = manifest.world_size();
  if (world < 1)
    return Status::error("manifest world_size " + std::to_string(world) +
                         " must be at least 1");
  if (static_cast<int>(plans.size()) != manifest.classes_size())
    return Status::error(
        "internal: " + std::to_string(plans.size()) + " plans for " +
        std::to_string(manifest.classes_size()) + " manifest classes");

  // Where each world rank runs: (class position, replica index).
  std::vector<std::pair<int, int>> placeOf(world, {-1, -1});
  for (int c = 0; c < manifest.classes_size(); ++c) {
    const plan::Manifest::Class &cls = manifest.classes(c);
    const plan::Plan &plan = plans[c];
    std::string what = "device class " + std::to_string(cls.device_class());
    PIPER_RETURN_IF_ERROR(checkRankList(cls.ranks(), world, what));
    for (int i = 0; i < cls.ranks_size(); ++i) {
      int r = cls.ranks(i);
      if (placeOf[r].first >= 0)
        return Status::error("rank " + std::to_string(r) +
                             " is listed by two device classes");
      placeOf[r] = {c, i};
    }
    if (plan.device_class() != cls.device_class())
      return Status::error(what + ": its plan file '" + cls.plan_file() +
                           "' holds device class " +
                           std::to_string(plan.device_class()));
    if (plan.world_size() != world)
      return Status::error(what + ": its plan has world_size " +
                           std::to_string(plan.world_size()) +
                           ", the manifest " + std::to_string(world));
    if (!std::equal(plan.ranks().begin(), plan.ranks().end(),
                    cls.ranks().begin(), cls.ranks().end()))
      return Status::error(
          what + ": its plan runs on ranks " +
          ranksString({plan.ranks().begin(), plan.ranks().end()}) +
          ", the manifest lists " +
          ranksString({cls.ranks().begin(), cls.ranks().end()}));
  }
  for (int r = 0; r < world; ++r)
    if (placeOf[r].first < 0)
      return Status::error("rank " + std::to_string(r) +
                           " is in no device class of the manifest");

  auto where = [&](int rank, int s, int i) {
    const plan::Plan &plan = plans[placeOf[rank].first];
    return "rank " + std::to_string(rank) + " (class " +
           std::to_string(plan.device_class()) + "), " +
           instructionContext(plan, s, i);
  };

  // Point-to-point: (from, to, stream name, tag) -> bytes and position.
  using Key = std::tuple<int, int, std::string, int>;
  struct End {
    int64_t bytes;
    int rank, stream, inst;
  };
  std::map<Key, End> sends, recvs;
  // Collectives: (stream name, sorted ranks) -> per member, element counts.
  std::map<std::pair<std::string, std::vector<int>>,
           std::map<int, std::vector<int64_t>>>
      collectives;
  for (int r = 0; r < world; ++r) {
    const plan::Plan &plan = plans[placeOf[r].first];
    int replica = placeOf[r].second;
    for (int s = 0; s < plan.streams_size(); ++s) {
      const plan::Stream &stream = plan.streams(s);
      for (int i = 0; i < stream.instructions_size(); ++i) {
        const Instruction &inst = stream.instructions(i);
        if (inst.kind() == Instruction::SEND ||
            inst.kind() == Instruction::RECV) {
          bool isSend = inst.kind() == Instruction::SEND;
          int peer = plan.groups(inst.peer_group()).ranks(replica);
          int buf = isSend ? inst.inputs(0) : inst.outputs(0);
          Key key{isSend ? r : peer, isSend ? peer : r, stream.name(),
                  inst.tag()};
          auto &table = isSend ? sends : recvs;
          End end{tensorBytes(plan.buffers(buf).type()), r, s, i};
          auto [it, fresh] = table.emplace(key, end);
          if (!fresh)
            return Status::error(
                where(r, s, i) + ": tag " + std::to_string(inst.tag()) +
                " is already used by " +
                where(it->second.rank, it->second.stream, it->second.inst) +
                " between the same ranks on the same stream");
        } else if (inst.kind() == Instruction::ALL_REDUCE) {
          const plan::DeviceGroup &g = plan.groups(inst.group());
          std::vector<int> ranks(g.ranks().begin(), g.ranks().end());
          std::sort(ranks.begin(), ranks.end());
          if (ranks.size() < 2)
            continue;
          int64_t count = 0;
          for (int p : inst.params())
            count += tensorBytes(plan.params(p).type()) / 4;
          collectives[{stream.name(), ranks}][r].push_back(count);
        }
      }
    }
  }
  for (auto &[key, s] : sends) {
    auto it = recvs.find(key);
    if (it == recvs.end())
      return Status::error(
          where(s.rank, s.stream, s.inst) + ": sends to rank " +
          std::to_string(std::get<1>(key)) + " with tag " +
          std::to_string(std::get<3>(key)) +
          ", but that rank has no RECV from rank " + std::to_string(s.rank) +
          " with this tag on a "
          "stream named '" +
          std::get<2>(key) + "'");
    if (it->second.bytes != s.bytes)
      return Status::error(
          where(s.rank, s.stream, s.inst) + ": sends " +
          std::to_string(s.bytes) + " bytes but " +
          where(it->second.rank, it->second.stream, it->second.inst) +
          " receives " + std::to_string(it->second.bytes));
  }
  for (auto &[key, r] : recvs)
    if (!sends.count(key))
      return Status::error(
          where(r.rank, r.stream, r.inst) + ": receives from rank " +
          std::to_string(std::get<0>(key)) + " with tag " +
          std::to_string(std::get<3>(key)) +
          ", but that rank has no SEND to rank " + std::to_string(r.rank) +
          " with this tag on a "
          "stream named '" +
          std::get<2>(key) + "'");
  for (auto &[key, members] : collectives) {
    const std::vector<int> &ranks = key.second;
    const std::vector<int64_t> *first = nullptr;
    int firstRank = -1;
    for (int r : ranks) {
      auto it = members.find(r);
      if (it == members.end())
        return Status::error("rank " + std::to_string(r) +
                             " never all-reduces over group " +
                             ranksString(ranks) + " on stream '" + key.first +
                             "', but other members do");
      if (!first) {
        first = &it->second;
        firstRank = r;
      } else if (it->second != *first) {
        return Status::error("ranks " + std::to_string(firstRank) + " and " +
                             std::to_string(r) +
                             " issue different all-reduce sequences over "
                             "group " +
                             ranksString(ranks) + " on stream '" + key.first +
                             "' (" + std::to_string(first->size()) + " vs " +
                             std::to_string(it->second.size()) +
                             " calls, or different element counts)");
      }
    }
  }
  return Status::ok();
}

} // namespace piper::runtime

// The readable text form of plans and manifests (see PlanDump.h).
#include "proto/PlanDump.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace piper::plan {
namespace {

const char *dtypeName(DType t) {
  switch (t) {
  case F32:
    return "f32";
  case I32:
    return "i32";
  case BF16:
    return "bf16";
  default:
    return "?";
  }
}

std::string typeText(const TensorType &t) {
  std::ostringstream os;
  os << dtypeName(t.dtype()) << "[";
  for (int i = 0; i < t.shape_size(); ++i)
    os << (i ? ", " : "") << t.shape(i);
  os << "]";
  return os.str();
}

template <typename Range> std::string listText(const Range &r, const char *prefix) {
  std::ostringstream os;
  bool first = true;
  for (const auto &x : r) {
    os << (first ? "" : ", ") << prefix << x;
    first = false;
  }
  return os.str();
}

std::string quoted(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string operandText(const Operand &o) {
  std::ostringstream os;
  switch (o.kind()) {
  case Operand::VALUE:
    os << "v" << o.index();
    break;
  case Operand::PARAM:
    os << "p" << o.index() << ":param";
    break;
  case Operand::GRAD:
    os << "p" << o.index() << ":grad";
    break;
  case Operand::ADAM_M:
    os << "p" << o.index() << ":adam_m";
    break;
  case Operand::ADAM_V:
    os << "p" << o.index() << ":adam_v";
    break;
  default:
    os << "?" << o.index();
  }
  return os.str();
}

std::string attrsText(const Kernel &k) {
  if (k.attrs().empty())
    return "";
  std::vector<std::pair<std::string, const AttrValue *>> sorted;
  for (const auto &kv : k.attrs())
    sorted.emplace_back(kv.first, &kv.second);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto &a, const auto &b) { return a.first < b.first; });
  std::ostringstream os;
  os << " {";
  for (size_t i = 0; i < sorted.size(); ++i) {
    os << (i ? ", " : "") << sorted[i].first << " = ";
    const AttrValue &v = *sorted[i].second;
    switch (v.value_case()) {
    case AttrValue::kI:
      os << v.i();
      break;
    case AttrValue::kF:
      os << v.f();
      break;
    case AttrValue::kS:
      os << quoted(v.s());
      break;
    default:
      os << "<unset>";
    }
  }
  os << "}";
  return os.str();
}

const char *roleName(BufferRole role) {
  switch (role) {
  case ACTIVATION:
    return "activation";
  case BATCH:
    return "batch";
  case COMMUNICATION:
    return "communication";
  case PARAMETER:
    return "parameter";
  case GRADIENT:
    return "gradient";
  case OPTIMIZER_STATE:
    return "optimizer_state";
  case SCRATCH:
    return "scratch";
  default:
    return "unspecified";
  }
}

std::string initText(const Initializer &init) {
  std::ostringstream os;
  switch (init.kind()) {
  case Initializer::ZEROS:
    return "zeros";
  case Initializer::ONES:
    return "ones";
  case Initializer::NORMAL:
    os << "normal(" << init.scale() << ")";
    return os.str();
  default:
    return "?";
  }
}

void dumpSegment(std::ostringstream &os, const Segment &seg, int index,
                 bool withKernels) {
  auto valueType = [&](int v) {
    return v >= 0 && v < seg.values_size() ? typeText(seg.values(v))
                                           : std::string("<out of range>");
  };
  os << "segment s" << index << " " << quoted(seg.name()) << " (";
  for (int i = 0; i < seg.args_size(); ++i)
    os << (i ? ", " : "") << "v" << seg.args(i) << ": "
       << valueType(seg.args(i));
  os << ") -> (" << listText(seg.results(), "v") << ")  # "
     << seg.values_size() << " values, " << seg.kernels_size() << " kernels, "
     << seg.scratch_bytes() << " bytes of scratch\n";
  if (!withKernels)
    return;
  for (const Kernel &k : seg.kernels()) {
    os << "  ";
    for (int i = 0; i < k.outputs_size(); ++i) {
      const Operand &o = k.outputs(i);
      os << (i ? ", " : "") << operandText(o);
      if (o.kind() == Operand::VALUE)
        os << ": " << valueType(o.index());
    }
    os << (k.outputs_size() ? " = " : "") << k.op() << "(";
    for (int i = 0; i < k.inputs_size(); ++i)
      os << (i ? ", " : "") << operandText(k.inputs(i));
    os << ")" << attrsText(k) << "\n";
  }
}

void dumpInstruction(std::ostringstream &os, const Instruction &in) {
  auto ids = [](const auto &r) { return "(" + listText(r, "b") + ")"; };
  switch (in.kind()) {
  case Instruction::CALL:
    os << "CALL s" << in.segment() << " " << ids(in.inputs()) << " -> "
       << ids(in.outputs()) << " scratch @" << in.scratch_offset();
    break;
  case Instruction::SEND:
    os << "SEND " << ids(in.inputs()) << " to g" << in.peer_group() << " tag "
       << in.tag();
    break;
  case Instruction::RECV:
    os << "RECV " << ids(in.outputs()) << " from g" << in.peer_group()
       << " tag " << in.tag();
    break;
  case Instruction::ALL_REDUCE:
    if (in.params_size() > 0)
      os << "ALL_REDUCE g" << in.group() << " (" << listText(in.params(), "p")
         << ")";
    else
      os << "ALL_REDUCE g" << in.group() << " " << ids(in.inputs()) << " -> "
         << ids(in.outputs());
    break;
  case Instruction::REDUCE_SCATTER:
  case Instruction::ALL_GATHER:
    os << Instruction::Kind_Name(in.kind()) << " g" << in.group() << " "
       << ids(in.inputs()) << " -> " << ids(in.outputs()) << " counts ["
       << listText(in.counts(), "") << "]";
    break;
  case Instruction::ALL_TO_ALL:
    os << "ALL_TO_ALL g" << in.group() << " " << ids(in.inputs()) << " -> "
       << ids(in.outputs());
    break;
  case Instruction::REDUCE_SCATTER_GRADS:
  case Instruction::ALL_GATHER_PARAMS:
    os << Instruction::Kind_Name(in.kind()) << " g" << in.group() << " ("
       << listText(in.params(), "p") << ")";
    if (in.inputs_size() > 0)
      os << " " << ids(in.inputs());
    if (in.outputs_size() > 0)
      os << " -> " << ids(in.outputs());
    break;
  case Instruction::RECORD:
    os << "RECORD e" << in.event();
    break;
  case Instruction::WAIT:
    os << "WAIT e" << in.event();
    break;
  case Instruction::LOAD_BATCH:
    os << "LOAD_BATCH mb " << in.microbatch() << " -> " << ids(in.outputs());
    break;
  case Instruction::CLIP_GRADS:
    os << "CLIP_GRADS";
    break;
  default:
    os << Instruction::Kind_Name(in.kind());
  }
  if (in.subgroups_size() > 0)
    os << " subgroups (" << listText(in.subgroups(), "g") << ")";
  if (!in.label().empty())
    os << "  # " << in.label();
  os << "\n";
}

} // namespace

std::string dumpPlan(const Plan &plan, bool withKernels) {
  std::ostringstream os;
  os << "plan class " << plan.device_class() << " ranks ["
     << listText(plan.ranks(), "") << "] world " << plan.world_size()
     << " schema " << plan.schema_version() << " model "
     << quoted(plan.model_name()) << (plan.has_loss() ? " has_loss" : "")
     << "\n";
  const TrainingConfig &t = plan.training();
  os << "training microbatches " << t.num_microbatches() << " replicas "
     << t.num_replicas() << " microbatch_size " << t.microbatch_size()
     << " seq " << t.seq_len() << " vocab " << t.vocab_size() << " dtype "
     << (t.compute_dtype() == BF16 ? "bf16" : "f32");
  if (t.tensor_parallel() > 1)
    os << " tensor_parallel " << t.tensor_parallel();
  if (t.context_parallel() > 1)
    os << " context_parallel " << t.context_parallel();
  os << "\n";
  os << "optimizer lr " << t.lr() << " betas (" << t.beta1() << ", "
     << t.beta2() << ") eps " << t.eps() << " weight_decay "
     << t.weight_decay() << " min_lr " << t.min_lr() << " warmup "
     << t.warmup_steps() << " decay " << t.decay_steps() << " clip "
     << t.clip_grad_norm() << "\n";
  os << "memory arena " << plan.arena_bytes() << " state "
     << plan.state_bytes() << " (estimate: peak " << plan.predicted_peak_bytes()
     << ", state " << plan.predicted_state_bytes() << ")\n";
  for (const DeviceGroup &g : plan.groups())
    os << "group g" << g.id() << " ranks [" << listText(g.ranks(), "")
       << "]\n";
  for (int i = 0; i < plan.params_size(); ++i) {
    const Parameter &p = plan.params(i);
    os << "param p" << i << " " << quoted(p.name()) << " "
       << typeText(p.type()) << " " << initText(p.init());
    if (p.copies() > 1)
      os << " copies " << p.copies();
    const ShardDescriptor &shard = p.shard();
    bool whole = shard.global_shape_size() == p.type().shape_size() &&
                 shard.start_size() == shard.global_shape_size();
    for (int d = 0; whole && d < shard.global_shape_size(); ++d)
      whole = shard.start(d) == 0 && shard.global_shape(d) == p.type().shape(d);
    if (!whole && shard.global_shape_size() > 0 &&
        shard.start_size() == shard.global_shape_size())
      os << " shard of [" << listText(shard.global_shape(), "") << "] at ["
         << listText(shard.start(), "") << "]";
    if (p.expert_members() > 1)
      os << " experts of " << p.expert_members() << " members";
    if (p.has_tensor_slice()) {
      const TensorSlice &ts = p.tensor_slice();
      os << " tensor slice dim " << ts.dim() << " of " << ts.members()
         << " members";
      if (ts.parts_size() > 0)
        os << ", parts [" << listText(ts.parts(), "") << "]";
    }
    if (p.has_sharding()) {
      const ParamSharding &z = p.sharding();
      os << " zero g" << z.group() << " sharded ["
         << (z.parameter() ? "value, " : "") << (z.gradient() ? "grad, " : "")
         << "moments]";
    }
    if (p.state_offsets_size() > 0)
      os << " state " << listText(p.state_offsets(), "@");
    os << "\n";
  }
  for (int i = 0; i < plan.segments_size(); ++i)
    dumpSegment(os, plan.segments(i), i, withKernels);
  for (const Buffer &b : plan.buffers())
    os << "buffer b" << b.id() << " " << typeText(b.type()) << " "
       << roleName(b.role()) << " @" << b.offset() << " " << quoted(b.name())
       << "\n";
  os << "events " << plan.num_events() << "\n";
  for (int s = 0; s < plan.streams_size(); ++s) {
    const Stream &st = plan.streams(s);
    os << "stream " << s << " " << quoted(st.name()) << " "
       << (st.kind() == Stream::COMM ? "comm" : "compute") << "  # "
       << st.instructions_size() << " instructions\n";
    for (int i = 0; i < st.instructions_size(); ++i) {
      os << "  " << i << ": ";
      dumpInstruction(os, st.instructions(i));
    }
  }
  return os.str();
}

std::string dumpManifest(const Manifest &m) {
  std::ostringstream os;
  os << "manifest world " << m.world_size() << " schema " << m.schema_version()
     << " model " << quoted(m.model_name()) << " strategy "
     << quoted(m.strategy()) << "\n";
  for (const Manifest::Class &c : m.classes())
    os << "class " << c.device_class() << " ranks ["
       << listText(c.ranks(), "") << "] " << quoted(c.plan_file()) << "\n";
  return os.str();
}

} // namespace piper::plan

// Hand-built plans of a tiny bigram language model (embedding -> linear ->
// cross-entropy) for the executor and launcher tests, as the compiler would
// emit them for one device, for data parallelism and for a 2-stage pipeline.
#ifndef PIPER_RUNTIME_EXEC_TEST_PLANS_H
#define PIPER_RUNTIME_EXEC_TEST_PLANS_H

#include <stdexcept>
#include <string>
#include <vector>

#include "proto/PlanFile.h"
#include "proto/analysis/MemoryPlan.h"
#include "proto/plan.pb.h"

namespace piper::runtime::testplans {

/// The model and batch: wte [V,H] and head [H,V].
struct TinyModel {
  int vocab = 16;
  int hidden = 8;
  int batch = 2; // sequences per microbatch
  int seqLen = 8;
  double lr = 0.05;
  bool normalHead = true; // false: head starts at zero, so loss 1 is ln(V)
};

inline plan::TensorType tensorType(plan::DType dtype,
                                   std::vector<int64_t> shape) {
  plan::TensorType t;
  t.set_dtype(dtype);
  for (int64_t d : shape)
    t.add_shape(d);
  return t;
}

inline plan::Operand value(int index) {
  plan::Operand op;
  op.set_kind(plan::Operand::VALUE);
  op.set_index(index);
  return op;
}

inline plan::Operand state(plan::Operand::Kind kind, int param) {
  plan::Operand op;
  op.set_kind(kind);
  op.set_index(param);
  return op;
}

inline plan::Kernel *addKernel(plan::Segment *seg, const std::string &op,
                               std::vector<plan::Operand> inputs,
                               std::vector<plan::Operand> outputs) {
  plan::Kernel *k = seg->add_kernels();
  k->set_op(op);
  for (auto &o : inputs)
    *k->add_inputs() = o;
  for (auto &o : outputs)
    *k->add_outputs() = o;
  return k;
}

inline void setAttr(plan::Kernel *k, const std::string &name, double v) {
  (*k->mutable_attrs())[name].set_f(v);
}

inline void setAttrInt(plan::Kernel *k, const std::string &name, int64_t v) {
  (*k->mutable_attrs())[name].set_i(v);
}

/// A segment with the given value table, args and results.
inline plan::Segment *addSegment(plan::Plan &plan, const std::string &name,
                                 std::vector<plan::TensorType> values,
                                 std::vector<int> args,
                                 std::vector<int> results) {
  plan::Segment *seg = plan.add_segments();
  seg->set_name(name);
  for (auto &t : values)
    *seg->add_values() = t;
  for (int a : args)
    seg->add_args(a);
  for (int r : results)
    seg->add_results(r);
  return seg;
}

inline int addBuffer(plan::Plan &plan, const plan::TensorType &type,
                     const std::string &name) {
  plan::Buffer *b = plan.add_buffers();
  b->set_id(plan.buffers_size() - 1);
  *b->mutable_type() = type;
  b->set_name(name);
  return b->id();
}

inline plan::Instruction *addInst(plan::Stream *s, plan::Instruction::Kind kind,
                                  const std::string &label,
                                  std::vector<int> inputs = {},
                                  std::vector<int> outputs = {}) {
  plan::Instruction *inst = s->add_instructions();
  inst->set_kind(kind);
  inst->set_label(label);
  for (int b : inputs)
    inst->add_inputs(b);
  for (int b : outputs)
    inst->add_outputs(b);
  return inst;
}

inline void addParam(plan::Plan &plan, const std::string &name,
                     std::vector<int64_t> shape, bool normal) {
  plan::Parameter *p = plan.add_params();
  p->set_name(name);
  *p->mutable_type() = tensorType(plan::F32, shape);
  p->mutable_init()->set_kind(normal ? plan::Initializer::NORMAL
                                     : plan::Initializer::ZEROS);
  p->mutable_init()->set_scale(normal ? 0.5 : 0.0);
}

/// Lays out the memory plan of a hand-built plan, as the compiler does.
inline void withArena(plan::Plan &plan) {
  std::string error;
  if (!plan::assignArena(plan, error))
    throw std::runtime_error("test plan has no memory plan: " + error);
}

inline void fillTraining(plan::Plan &plan, const TinyModel &m, int microbatches,
                         int replicas) {
  plan::TrainingConfig *t = plan.mutable_training();
  t->set_num_microbatches(microbatches);
  t->set_num_replicas(replicas);
  t->set_microbatch_size(m.batch);
  t->set_seq_len(m.seqLen);
  t->set_vocab_size(m.vocab);
  t->set_lr(m.lr);
  t->set_beta1(0.9);
  t->set_beta2(0.95);
  t->set_eps(1e-8);
}

/// The AdamW update and gradient reset of params [0, numParams).
inline void addUpdateSegment(plan::Plan &plan, const TinyModel &m,
                             int numParams) {
  plan::Segment *seg = addSegment(plan, "update", {}, {}, {});
  for (int p = 0; p < numParams; ++p) {
    plan::Kernel *k = addKernel(seg, "adamw", {state(plan::Operand::GRAD, p)},
                                {state(plan::Operand::PARAM, p),
                                 state(plan::Operand::ADAM_M, p),
                                 state(plan::Operand::ADAM_V, p)});
    setAttr(k, "lr", m.lr);
    setAttr(k, "beta1", 0.9);
    setAttr(k, "beta2", 0.95);
    setAttr(k, "eps", 1e-8);
    setAttr(k, "weight_decay", 0.0);
  }
  for (int p = 0; p < numParams; ++p)
    addKernel(seg, "zero", {}, {state(plan::Operand::GRAD, p)});
}

/// One device class running the whole model on `ranks` (data parallel when
/// there are several; gradients are all-reduced before the update).
/// `twoStreams` moves LOAD_BATCH to a "data" stream synchronized by events.
inline plan::Plan singleClassPlan(const TinyModel &m, int microbatches,
                                  std::vector<int> ranks, int worldSize,
                                  bool twoStreams = false) {
  using plan::F32;
  using plan::I32;
  using plan::Instruction;
  using plan::Operand;
  plan::Plan plan;
  plan.set_schema_version(plan::kPlanSchemaVersion);
  plan.set_device_class(0);
  for (int r : ranks)
    plan.add_ranks(r);
  plan.set_world_size(worldSize);
  plan.set_model_name("tiny-bigram");
  plan.set_has_loss(true);
  int replicas = static_cast<int>(ranks.size());
  fillTraining(plan, m, microbatches, replicas);
  addParam(plan, "wte", {m.vocab, m.hidden}, true);
  addParam(plan, "head", {m.hidden, m.vocab}, m.normalHead);
  plan::DeviceGroup *g = plan.add_groups();
  g->set_id(0);
  for (int r : ranks)
    g->add_ranks(r);

  int64_t n = int64_t(m.batch) * m.seqLen;
  auto tok = tensorType(I32, {m.batch, m.seqLen});
  auto act = tensorType(F32, {n, m.hidden});
  auto logits = tensorType(F32, {n, m.vocab});
  double scale = 1.0 / (microbatches * replicas);

  // fwd(tokens, targets) -> (x, logits)
  plan::Segment *fwd =
      addSegment(plan, "fwd", {tok, tok, act, logits, tensorType(F32, {})},
                 {0, 1}, {2, 3});
  addKernel(fwd, "embedding", {value(0), state(Operand::PARAM, 0)}, {value(2)});
  addKernel(fwd, "linear", {value(2), state(Operand::PARAM, 1)}, {value(3)});
  addKernel(fwd, "cross_entropy", {value(3), value(1)}, {value(4)});
  setAttr(addKernel(fwd, "loss_accumulate", {value(4)}, {}), "scale", scale);

  // bwd(tokens, targets, x, logits) -> ()
  plan::Segment *bwd = addSegment(plan, "bwd",
                                  {tok, tok, act, logits, logits,
                                   tensorType(F32, {m.hidden, m.vocab}), act,
                                   tensorType(F32, {m.vocab, m.hidden})},
                                  {0, 1, 2, 3}, {});
  setAttr(
      addKernel(bwd, "cross_entropy_grad", {value(3), value(1)}, {value(4)}),
      "scale", scale);
  addKernel(bwd, "linear_grad_weight", {value(2), value(4)}, {value(5)});
  addKernel(bwd, "accumulate", {value(5)}, {state(Operand::GRAD, 1)});
  addKernel(bwd, "linear_grad_input", {value(4), state(Operand::PARAM, 1)},
            {value(6)});
  setAttrInt(addKernel(bwd, "embedding_grad", {value(0), value(6)}, {value(7)}),
             "vocab", m.vocab);
  addKernel(bwd, "accumulate", {value(7)}, {state(Operand::GRAD, 0)});
  addUpdateSegment(plan, m, 2);

  plan::Stream *compute = plan.add_streams();
  compute->set_name("compute");
  plan::Stream *data = nullptr;
  if (twoStreams) {
    data = plan.add_streams();
    data->set_name("data");
    plan.set_num_events(microbatches);
  }
  for (int mb = 0; mb < microbatches; ++mb) {
    std::string sfx = std::to_string(mb);
    int bTok = addBuffer(plan, tok, "tokens" + sfx);
    int bTgt = addBuffer(plan, tok, "targets" + sfx);
    int bX = addBuffer(plan, act, "x" + sfx);
    int bLogits = addBuffer(plan, logits, "logits" + sfx);
    addInst(twoStreams ? data : compute, Instruction::LOAD_BATCH,
            "load MB=" + sfx, {}, {bTok, bTgt})
        ->set_microbatch(mb);
    if (twoStreams) {
      addInst(data, Instruction::RECORD, "loaded MB=" + sfx)->set_event(mb);
      addInst(compute, Instruction::WAIT, "wait MB=" + sfx)->set_event(mb);
    }
    addInst(compute, Instruction::CALL, "F MB=" + sfx, {bTok, bTgt},
            {bX, bLogits})
        ->set_segment(0);
    addInst(compute, Instruction::CALL, "B MB=" + sfx,
            {bTok, bTgt, bX, bLogits})
        ->set_segment(1);
  }
  if (replicas > 1) {
    plan::Instruction *ar =
        addInst(compute, Instruction::ALL_REDUCE, "allreduce grads");
    ar->set_group(0);
    ar->add_params(0);
    ar->add_params(1);
  }
  addInst(compute, Instruction::CALL, "update")->set_segment(2);
  withArena(plan);
  return plan;
}

/// Puts a CLIP_GRADS before the last instruction of stream 0 (the update).
inline void addClipBeforeUpdate(plan::Plan &plan) {
  auto *insts = plan.mutable_streams(0)->mutable_instructions();
  plan::Instruction update = insts->Get(insts->size() - 1);
  insts->Mutable(insts->size() - 1)->Clear();
  insts->Mutable(insts->size() - 1)->set_kind(plan::Instruction::CLIP_GRADS);
  *insts->Add() = update;
}

/// singleClassPlan with each sequence split over `cp` context members
/// (consecutive ranks): the token buffers hold seqLen / cp tokens; the
/// ranks are cp x (ranks / cp) gradient replicas. The bigram model is
/// per-token, so no kernel needs the other members' tokens.
inline plan::Plan contextParallelPlan(const TinyModel &m, int microbatches,
                                      std::vector<int> ranks, int worldSize,
                                      int cp) {
  TinyModel local = m;
  local.seqLen = m.seqLen / cp;
  plan::Plan plan = singleClassPlan(local, microbatches, ranks, worldSize);
  plan.mutable_training()->set_seq_len(m.seqLen);
  plan.mutable_training()->set_context_parallel(cp);
  return plan;
}

/// A 2-stage pipeline over ranks 0 (embedding) and 1 (head and loss), GPipe
/// order on one stream "main" per rank.
inline std::vector<plan::Plan> pipelinePlans(const TinyModel &m,
                                             int microbatches) {
  using plan::F32;
  using plan::I32;
  using plan::Instruction;
  using plan::Operand;
  int64_t n = int64_t(m.batch) * m.seqLen;
  auto tok = tensorType(I32, {m.batch, m.seqLen});
  auto act = tensorType(F32, {n, m.hidden});
  auto logits = tensorType(F32, {n, m.vocab});
  double scale = 1.0 / microbatches;

  std::vector<plan::Plan> plans(2);
  for (int c = 0; c < 2; ++c) {
    plan::Plan &plan = plans[c];
    plan.set_schema_version(plan::kPlanSchemaVersion);
    plan.set_device_class(c);
    plan.add_ranks(c);
    plan.set_world_size(2);
    plan.set_model_name("tiny-bigram");
    plan.set_has_loss(c == 1);
    fillTraining(plan, m, microbatches, 1);
    plan::DeviceGroup *g = plan.add_groups();
    g->set_id(0);
    g->add_ranks(1 - c);
  }

  // Stage 0: wte.
  plan::Plan &p0 = plans[0];
  addParam(p0, "wte", {m.vocab, m.hidden}, true);
  plan::Segment *fwd0 = addSegment(p0, "fwd0", {tok, act}, {0}, {1});
  addKernel(fwd0, "embedding", {value(0), state(Operand::PARAM, 0)},
            {value(1)});
  plan::Segment *bwd0 = addSegment(
      p0, "bwd0", {tok, act, tensorType(F32, {m.vocab, m.hidden})}, {0, 1}, {});
  setAttrInt(
      addKernel(bwd0, "embedding_grad", {value(0), value(1)}, {value(2)}),
      "vocab", m.vocab);
  addKernel(bwd0, "accumulate", {value(2)}, {state(Operand::GRAD, 0)});
  addUpdateSegment(p0, m, 1);
  plan::Stream *s0 = p0.add_streams();
  s0->set_name("main");
  std::vector<int> tok0(microbatches);
  for (int mb = 0; mb < microbatches; ++mb) {
    std::string sfx = std::to_string(mb);
    tok0[mb] = addBuffer(p0, tok, "tokens" + sfx);
    int tgt = addBuffer(p0, tok, "targets" + sfx);
    int x = addBuffer(p0, act, "x" + sfx);
    addInst(s0, Instruction::LOAD_BATCH, "load MB=" + sfx, {}, {tok0[mb], tgt})
        ->set_microbatch(mb);
    addInst(s0, Instruction::CALL, "F PP=0 MB=" + sfx, {tok0[mb]}, {x})
        ->set_segment(0);
    addInst(s0, Instruction::SEND, "send x MB=" + sfx, {x})->set_tag(mb);
  }
  for (int mb = 0; mb < microbatches; ++mb) {
    std::string sfx = std::to_string(mb);
    int dx = addBuffer(p0, act, "dx" + sfx);
    addInst(s0, Instruction::RECV, "recv dx MB=" + sfx, {}, {dx})
        ->set_tag(1000 + mb);
    addInst(s0, Instruction::CALL, "B PP=0 MB=" + sfx, {tok0[mb], dx})
        ->set_segment(1);
  }
  addInst(s0, Instruction::CALL, "update")->set_segment(2);

  // Stage 1: head and loss.
  plan::Plan &p1 = plans[1];
  addParam(p1, "head", {m.hidden, m.vocab}, m.normalHead);
  plan::Segment *fwd1 = addSegment(
      p1, "fwd1", {act, tok, logits, tensorType(F32, {})}, {0, 1}, {2});
  addKernel(fwd1, "linear", {value(0), state(Operand::PARAM, 0)}, {value(2)});
  addKernel(fwd1, "cross_entropy", {value(2), value(1)}, {value(3)});
  setAttr(addKernel(fwd1, "loss_accumulate", {value(3)}, {}), "scale", scale);
  plan::Segment *bwd1 = addSegment(
      p1, "bwd1",
      {act, tok, logits, logits, tensorType(F32, {m.hidden, m.vocab}), act},
      {0, 1, 2}, {5});
  setAttr(
      addKernel(bwd1, "cross_entropy_grad", {value(2), value(1)}, {value(3)}),
      "scale", scale);
  addKernel(bwd1, "linear_grad_weight", {value(0), value(3)}, {value(4)});
  addKernel(bwd1, "accumulate", {value(4)}, {state(Operand::GRAD, 0)});
  addKernel(bwd1, "linear_grad_input", {value(3), state(Operand::PARAM, 0)},
            {value(5)});
  addUpdateSegment(p1, m, 1);
  plan::Stream *s1 = p1.add_streams();
  s1->set_name("main");
  for (int mb = 0; mb < microbatches; ++mb) {
    std::string sfx = std::to_string(mb);
    int x = addBuffer(p1, act, "x" + sfx);
    int t = addBuffer(p1, tok, "tokens" + sfx);
    int tgt = addBuffer(p1, tok, "targets" + sfx);
    int lg = addBuffer(p1, logits, "logits" + sfx);
    int dx = addBuffer(p1, act, "dx" + sfx);
    addInst(s1, Instruction::RECV, "recv x MB=" + sfx, {}, {x})->set_tag(mb);
    addInst(s1, Instruction::LOAD_BATCH, "load MB=" + sfx, {}, {t, tgt})
        ->set_microbatch(mb);
    addInst(s1, Instruction::CALL, "F PP=1 MB=" + sfx, {x, tgt}, {lg})
        ->set_segment(0);
    addInst(s1, Instruction::CALL, "B PP=1 MB=" + sfx, {x, tgt, lg}, {dx})
        ->set_segment(1);
    addInst(s1, Instruction::SEND, "send dx MB=" + sfx, {dx})
        ->set_tag(1000 + mb);
  }
  addInst(s1, Instruction::CALL, "update")->set_segment(2);
  for (plan::Plan &p : plans)
    withArena(p);
  return plans;
}

/// The manifest of `plans`, whose files are "class<i>.plan".
inline plan::Manifest manifestFor(const std::vector<plan::Plan> &plans,
                                  const std::string &strategy) {
  plan::Manifest m;
  m.set_schema_version(plan::kPlanSchemaVersion);
  m.set_world_size(plans.at(0).world_size());
  m.set_model_name(plans[0].model_name());
  m.set_strategy(strategy);
  *m.mutable_training() = plans[0].training();
  for (const plan::Plan &p : plans) {
    plan::Manifest::Class *c = m.add_classes();
    c->set_device_class(p.device_class());
    for (int r : p.ranks())
      c->add_ranks(r);
    c->set_plan_file("class" + std::to_string(p.device_class()) + ".plan");
  }
  return m;
}

/// Writes `plans` and their manifest into `dir` (which must exist); returns
/// "" or the first error.
inline std::string writeStrategy(const std::string &dir,
                                 const std::vector<plan::Plan> &plans,
                                 const std::string &strategy) {
  plan::Manifest m = manifestFor(plans, strategy);
  for (size_t i = 0; i < plans.size(); ++i) {
    std::string err =
        plan::writePlanFile(dir + "/" + m.classes(i).plan_file(), plans[i]);
    if (!err.empty())
      return err;
  }
  return plan::writeManifest(dir + "/" + plan::kManifestFileName, m);
}

} // namespace piper::runtime::testplans

#endif // PIPER_RUNTIME_EXEC_TEST_PLANS_H

// In-process tests of the executor library: initialization, synthetic data,
// plan validation and single-rank training steps.
#include <stdlib.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "proto/PlanFile.h"
#include "runtime/exec/Data.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/Init.h"
#include "runtime/exec/Validate.h"
#include "runtime/exec/test_plans.h"

using namespace piper;
using namespace piper::runtime;
using namespace piper::runtime::testplans;
using plan::Instruction;
using plan::Operand;

namespace {

plan::Initializer normalInit(double scale) {
  plan::Initializer init;
  init.set_kind(plan::Initializer::NORMAL);
  init.set_scale(scale);
  return init;
}

std::vector<float> initTensor(const std::string &name, uint64_t seed,
                              int64_t count, int64_t first = 0,
                              double scale = 1.0) {
  std::vector<float> out(count);
  fillInitializer(normalInit(scale), name, seed, first, out.data(), count);
  return out;
}

/// The loss of step `step` of the tiny model at its initial parameters
/// computed directly (double precision, no plan, no kernels), over
/// `globalMicrobatches` microbatches.
double directLoss(const TinyModel &m, uint64_t seed, int globalMicrobatches,
                  int64_t step = 1) {
  int V = m.vocab, H = m.hidden;
  std::vector<float> wte = initTensor("wte", seed, V * H, 0, 0.5);
  std::vector<float> head(H * V, 0.0f);
  if (m.normalHead)
    head = initTensor("head", seed, H * V, 0, 0.5);
  SyntheticData data(seed, V);
  int n = m.batch * m.seqLen;
  std::vector<int32_t> tok(n), tgt(n);
  double loss = 0;
  for (int g = 0; g < globalMicrobatches; ++g) {
    REQUIRE(data.fill(step, g, m.batch, m.seqLen, tok.data(), tgt.data()));
    double ce = 0;
    for (int r = 0; r < n; ++r) {
      std::vector<double> logits(V, 0.0);
      for (int j = 0; j < V; ++j)
        for (int h = 0; h < H; ++h)
          logits[j] += double(wte[tok[r] * H + h]) * head[h * V + j];
      double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
      for (double l : logits)
        sum += std::exp(l - mx);
      ce += mx + std::log(sum) - logits[tgt[r]];
    }
    loss += ce / n / globalMicrobatches;
  }
  return loss;
}

std::vector<double> runSteps(const plan::Plan &plan, int steps, uint64_t seed,
                             DataSource *data = nullptr) {
  ExecutorOptions opts;
  opts.seed = seed;
  opts.rank = plan.ranks(0);
  opts.data = data;
  Status status;
  auto exec = Executor::create(plan, opts, status);
  INFO(status.message());
  REQUIRE(exec);
  REQUIRE(exec->connect());
  std::vector<double> losses;
  for (int t = 1; t <= steps; ++t) {
    double loss = 0;
    Status st = exec->runStep(t, loss);
    INFO(st.message());
    REQUIRE(st);
    losses.push_back(loss);
  }
  // One arena, laid out by the plan's memory plan, is all the executor
  // allocates: its peak is arena_bytes to the byte.
  CHECK(exec->peakBytes() == exec->plan().arena_bytes());
  CHECK(exec->liveBytes() == exec->plan().arena_bytes());
  CHECK(exec->stateBytes() == exec->plan().state_bytes());
  return losses;
}

/// Expects validatePlan to reject `plan` with a message containing every
/// one of `needles`.
void expectInvalid(const plan::Plan &plan,
                   const std::vector<std::string> &needles) {
  Status st = validatePlan(plan);
  INFO("message: " << st.message());
  REQUIRE_FALSE(st);
  for (const std::string &needle : needles)
    CHECK(st.message().find(needle) != std::string::npos);
}

} // namespace

TEST_CASE("init is deterministic and keyed by name and seed", "[init]") {
  std::vector<float> a = initTensor("layers.0.wq", 42, 1000);
  CHECK(a == initTensor("layers.0.wq", 42, 1000));
  CHECK(a != initTensor("layers.0.wk", 42, 1000));
  CHECK(a != initTensor("layers.0.wq", 43, 1000));

  // A shard is exactly the slice of the full tensor.
  std::vector<float> shard = initTensor("layers.0.wq", 42, 250, 500);
  CHECK(std::equal(shard.begin(), shard.end(), a.begin() + 500));

  // The scale is the standard deviation.
  std::vector<float> big = initTensor("big", 7, 200000, 0, 0.02);
  double sum = 0, sq = 0;
  for (float x : big) {
    sum += x;
    sq += double(x) * x;
  }
  double mean = sum / big.size();
  double stdev = std::sqrt(sq / big.size() - mean * mean);
  CHECK(std::fabs(mean) < 0.0005);
  CHECK(stdev == Approx(0.02).epsilon(0.01));

  plan::Initializer ones;
  ones.set_kind(plan::Initializer::ONES);
  std::vector<float> o(5, -1.0f);
  fillInitializer(ones, "x", 1, 0, o.data(), 5);
  CHECK(o == std::vector<float>(5, 1.0f));
  plan::Initializer zeros;
  fillInitializer(zeros, "x", 1, 0, o.data(), 5);
  CHECK(o == std::vector<float>(5, 0.0f));
}

TEST_CASE("synthetic data is deterministic arithmetic sequences", "[data]") {
  const int B = 3, S = 10, V = 50;
  SyntheticData data(1234, V);
  std::vector<int32_t> tok(B * S), tgt(B * S), tok2(B * S), tgt2(B * S);
  REQUIRE(data.fill(2, 5, B, S, tok.data(), tgt.data()));
  REQUIRE(data.fill(2, 5, B, S, tok2.data(), tgt2.data()));
  CHECK(tok == tok2);
  CHECK(tgt == tgt2);
  for (int j = 0; j < B; ++j) {
    uint64_t h = syntheticHash(1234, 2, 5, j);
    int64_t start = h % V, stride = 1 + (h >> 32) % 7;
    for (int i = 0; i < S; ++i) {
      CHECK(tok[j * S + i] == (start + i * stride) % V);
      CHECK(tgt[j * S + i] == (start + (i + 1) * stride) % V);
    }
    // Targets are the tokens shifted by one.
    for (int i = 0; i + 1 < S; ++i)
      CHECK(tgt[j * S + i] == tok[j * S + i + 1]);
  }
  // Another microbatch, step or seed gives other data.
  REQUIRE(data.fill(2, 6, B, S, tok2.data(), tgt2.data()));
  CHECK(tok != tok2);
  REQUIRE(data.fill(3, 5, B, S, tok2.data(), tgt2.data()));
  CHECK(tok != tok2);
  SyntheticData other(99, V);
  REQUIRE(other.fill(2, 5, B, S, tok2.data(), tgt2.data()));
  CHECK(tok != tok2);
}

TEST_CASE("validatePlan accepts the test plans", "[validate]") {
  TinyModel m;
  CHECK(validatePlan(singleClassPlan(m, 2, {0}, 1)));
  CHECK(validatePlan(singleClassPlan(m, 2, {0}, 1, true)));
  CHECK(validatePlan(singleClassPlan(m, 2, {1, 3}, 4)));
  for (const plan::Plan &p : pipelinePlans(m, 3))
    CHECK(validatePlan(p));
  std::vector<plan::Plan> pp = pipelinePlans(m, 3);
  CHECK(validateStrategy(manifestFor(pp, "pp=2"), pp));
}

TEST_CASE("validatePlan rejects bad plans", "[validate]") {
  TinyModel m;
  plan::Plan good = singleClassPlan(m, 2, {0}, 1, true);
  plan::Plan p = good;
  // Stream 1 is "data"; in "compute", 0 is WAIT MB=0 and 1 is F MB=0.
  auto compute = [&]() { return p.mutable_streams(0); };

  SECTION("schema version") {
    p.set_schema_version(1);
    expectInvalid(p, {"plan schema version 1 is not supported (this runtime "
                      "reads version 2)"});
  }
  SECTION("memory plan missing") {
    for (plan::Parameter &param : *p.mutable_params())
      param.clear_state_offsets();
    expectInvalid(p, {"parameter 'wte' has 0 state offsets, not 4"});
  }
  SECTION("memory plan: two live buffers share bytes") {
    // Buffers 0 and 1 (tokens and targets of microbatch 0) are written by
    // one LOAD_BATCH and so live at the same time.
    p.mutable_buffers(1)->set_offset(p.buffers(0).offset());
    expectInvalid(p, {"memory plan: buffer", "share bytes at offset",
                      "but may be live at the same time"});
  }
  SECTION("memory plan: a buffer outside the arena") {
    p.set_arena_bytes(p.state_bytes());
    expectInvalid(p, {"memory plan: buffer", "outside the arena"});
  }
  SECTION("ZeRO: a shard group that does not exist") {
    p.mutable_params(0)->mutable_sharding()->set_group(5);
    p.mutable_params(0)->mutable_sharding()->set_optimizer(true);
    expectInvalid(p, {"parameter 'wte': sharding group 5 is out of range"});
  }
  SECTION("ZeRO: a kernel reads a sharded parameter") {
    plan::ParamSharding *z = p.mutable_params(0)->mutable_sharding();
    z->set_optimizer(true);
    z->set_gradient(true);
    z->set_parameter(true);
    expectInvalid(p, {"kernel 0 ('embedding') input 1: the value of param "
                      "'wte' (index 0) is a ZeRO shard; only adamw and zero "
                      "may use it"});
  }
  SECTION("ZeRO: a reduce-scatter of an unsharded parameter") {
    plan::Instruction *rs = compute()->add_instructions();
    rs->set_kind(plan::Instruction::REDUCE_SCATTER_GRADS);
    rs->set_group(0);
    rs->add_params(1);
    expectInvalid(p, {"REDUCE_SCATTER_GRADS of param 'head' (index 1), which "
                      "is not sharded over group 0"});
  }
  SECTION("ZeRO: a gather into a buffer of another type") {
    p.mutable_params(1)->mutable_sharding()->set_optimizer(true);
    plan::Instruction *ag = compute()->add_instructions();
    ag->set_kind(plan::Instruction::ALL_GATHER_PARAMS);
    ag->set_group(0);
    ag->add_params(1);
    ag->add_outputs(0);
    expectInvalid(p, {"ALL_GATHER_PARAMS", "but param 'head' (index 1) is"});
  }
  SECTION("rank out of range") {
    p.set_ranks(0, 5);
    expectInvalid(p, {"rank 5", "world_size 1"});
  }
  SECTION("kernels on a communication stream") {
    compute()->set_kind(plan::Stream::COMM);
    expectInvalid(p, {"stream 'compute', instruction 1 (F MB=0)",
                      "it runs kernels, but 'compute' is a communication "
                      "stream"});
  }
  SECTION("unknown stream kind") {
    compute()->set_kind(static_cast<plan::Stream::Kind>(7));
    expectInvalid(p, {"stream 'compute' has unknown kind 7"});
  }
  SECTION("segment index") {
    compute()->mutable_instructions(1)->set_segment(9);
    expectInvalid(p, {"stream 'compute', instruction 1 (F MB=0)",
                      "segment 9 is out of range"});
  }
  SECTION("buffer index") {
    compute()->mutable_instructions(1)->set_inputs(0, 99);
    expectInvalid(p, {"instruction 1 (F MB=0)", "buffer 99"});
  }
  SECTION("value index") {
    p.mutable_segments(0)->mutable_kernels(1)->mutable_inputs(0)->set_index(42);
    expectInvalid(p, {"segment 0 ('fwd')", "kernel 1 ('linear')", "value 42"});
  }
  SECTION("param index") {
    p.mutable_segments(2)->mutable_kernels(0)->mutable_outputs(1)->set_index(7);
    expectInvalid(p, {"kernel 0 ('adamw')", "ADAM_M index 7"});
  }
  SECTION("value read before written") {
    p.mutable_segments(0)->mutable_kernels(1)->mutable_inputs(0)->set_index(3);
    expectInvalid(p, {"reads value 3 before any kernel writes it"});
  }
  SECTION("unknown kernel") {
    p.mutable_segments(0)->mutable_kernels(0)->set_op("embeding");
    expectInvalid(p, {"unknown kernel 'embeding'"});
  }
  SECTION("kernel with too few inputs") {
    p.mutable_segments(0)->mutable_kernels(1)->mutable_inputs()->RemoveLast();
    expectInvalid(p, {"segment 0 ('fwd'), kernel 1 ('linear'): kernel "
                      "'linear' takes 2 or 3 inputs, got 1"});
  }
  SECTION("kernel with too few outputs") {
    p.mutable_segments(2)->mutable_kernels(0)->mutable_outputs()->RemoveLast();
    expectInvalid(p, {"kernel 0 ('adamw'): kernel 'adamw' takes 3 outputs, "
                      "got 2"});
  }
  SECTION("kernel without a required attribute") {
    p.mutable_segments(2)->mutable_kernels(0)->mutable_attrs()->erase("lr");
    expectInvalid(p, {"kernel 0 ('adamw'): kernel 'adamw' requires "
                      "attribute 'lr'"});
  }
  SECTION("negative shape") {
    p.mutable_buffers(2)->mutable_type()->set_shape(0, -4);
    expectInvalid(p, {"buffer 'x0' (id 2)", "negative dimension"});
  }
  SECTION("negative value shape") {
    p.mutable_segments(1)->mutable_values(5)->set_shape(1, -1);
    expectInvalid(p, {"segment 1 ('bwd') value 5", "negative"});
  }
  SECTION("buffer type does not match the segment argument") {
    p.mutable_buffers(2)->mutable_type()->set_shape(1, 9);
    expectInvalid(
        p, {"instruction 1 (F MB=0)", "f32[16,9]", "result 0 is f32[16,8]"});
  }
  SECTION("group index") {
    plan::Plan dp = singleClassPlan(m, 2, {0, 1}, 2);
    plan::Stream *s = dp.mutable_streams(0);
    s->mutable_instructions(s->instructions_size() - 2)->set_group(3);
    expectInvalid(dp, {"(allreduce grads)", "group 3 is out of range"});
  }
  SECTION("all-reduce group without this rank") {
    plan::Plan dp = singleClassPlan(m, 2, {0, 1}, 3);
    dp.mutable_groups(0)->set_ranks(1, 2);
    expectInvalid(dp, {"does not contain rank 1"});
  }
  SECTION("all-reduce subgroups that do not cover the group") {
    plan::Plan dp = singleClassPlan(m, 2, {0, 1}, 2);
    plan::DeviceGroup *g = dp.add_groups();
    g->set_id(dp.groups_size() - 1);
    g->add_ranks(0);
    plan::Stream *s = dp.mutable_streams(0);
    s->mutable_instructions(s->instructions_size() - 2)->add_subgroups(g->id());
    expectInvalid(dp, {"(allreduce grads)", "do not cover group 0"});
  }
  SECTION("event index") {
    compute()->mutable_instructions(0)->set_event(5);
    expectInvalid(p, {"instruction 0 (wait MB=0)", "event 5 is out of range"});
  }
  SECTION("peer group pairs a rank with itself") {
    std::vector<plan::Plan> pp = pipelinePlans(m, 2);
    pp[0].mutable_groups(0)->set_ranks(0, 0);
    expectInvalid(pp[0], {"(send x MB=0)", "with itself"});
  }
  SECTION("two writers of one buffer") {
    compute()->mutable_instructions(4)->set_outputs(0, 2);
    expectInvalid(p, {"writes buffer 'x0' (id 2)", "already written"});
  }
  SECTION("a cross-stream read without an event") {
    compute()->mutable_instructions(0)->set_kind(Instruction::RECORD);
    p.mutable_streams(1)->mutable_instructions(1)->set_kind(Instruction::WAIT);
    // Now "data" waits for an event "compute" records: the loads are no
    // longer ordered before the forward that reads them.
    expectInvalid(p,
                  {"reads buffer 'tokens0' (id 0)", "no RECORD/WAIT ordering"});
  }
  SECTION("an event recorded twice") {
    p.mutable_streams(1)->mutable_instructions(1)->set_event(1);
    expectInvalid(p, {"stream 'data', instruction 3 (loaded MB=1)",
                      "records event 1, already recorded"});
  }
  SECTION("waiting for an event nobody records") {
    p.set_num_events(3);
    compute()->mutable_instructions(0)->set_event(2);
    expectInvalid(p, {"instruction 0 (wait MB=0): waits for event 2, which no "
                      "instruction records"});
  }
  SECTION("event deadlock") {
    // "data" first waits for the end of "compute", which waits for "data".
    p.set_num_events(3);
    plan::Stream old = p.streams(1);
    plan::Stream *data = p.mutable_streams(1);
    data->clear_instructions();
    addInst(data, Instruction::WAIT, "wait for compute")->set_event(2);
    for (const plan::Instruction &inst : old.instructions())
      *data->add_instructions() = inst;
    addInst(compute(), Instruction::RECORD, "compute done")->set_event(2);
    expectInvalid(p, {"the streams deadlock on events",
                      "stream 'data', instruction 0 (wait for compute) waits "
                      "for event 2, recorded by stream 'compute', instruction "
                      "7 (compute done)"});
  }
  SECTION("unordered gradient accesses from two streams") {
    plan::Stream *extra = p.add_streams();
    extra->set_name("side");
    addInst(extra, Instruction::CALL, "update early")->set_segment(2);
    expectInvalid(p,
                  {"stream 'side', instruction 0 (update early) and "
                   "stream 'compute', instruction 1 (F MB=0)",
                   "value of param 'wte' (index 0)", "at least one writing"});
  }
  SECTION("unknown instruction kinds") {
    compute()->mutable_instructions(1)->set_kind(
        static_cast<Instruction::Kind>(42));
    expectInvalid(p, {"stream 'compute', instruction 1 (F MB=0)",
                      "unknown instruction kind 42"});
  }
  SECTION("LOAD_BATCH shape") {
    p = singleClassPlan(m, 2, {0}, 1);
    p.mutable_buffers(0)->mutable_type()->set_shape(1, 4);
    expectInvalid(
        p, {"(load MB=0)", "tokens buffer 'tokens0'", "expected i32[2,8]"});
  }
  SECTION("LOAD_BATCH microbatch") {
    p.mutable_streams(1)->mutable_instructions(0)->set_microbatch(2);
    expectInvalid(p, {"microbatch 2 is out of range"});
  }
  SECTION("buffer ids must equal positions") {
    p.mutable_buffers(3)->set_id(4);
    expectInvalid(p, {"has id 4"});
  }
  SECTION("param names double as file names") {
    p.mutable_params(1)->set_name("a/b");
    expectInvalid(p, {"not usable as a file name"});
  }
}

/// singleClassPlan with the backward's logits gradient (segment 1's value
/// 4, local to it) stored with rows padded to `width` columns, as the
/// compiler's vocabulary padding stores it (docs/kernels.md): its writer
/// and its two readers get valid_cols.
plan::Plan paddedGradientPlan(const TinyModel &m, int64_t width) {
  plan::Plan p = singleClassPlan(m, 2, {0}, 1);
  plan::Segment *bwd = p.mutable_segments(1);
  bwd->mutable_values(4)->set_shape(1, width);
  for (plan::Kernel &k : *bwd->mutable_kernels())
    if (k.op() == "cross_entropy_grad" || k.op() == "linear_grad_weight" ||
        k.op() == "linear_grad_input")
      setAttrInt(&k, "valid_cols", m.vocab);
  withArena(p);
  return p;
}

TEST_CASE("a plan with padded rows trains as the dense plan, and the "
          "validator checks who touches them",
          "[validate][padding]") {
  TinyModel m; // vocabulary 16: padded to 64
  plan::Plan padded = paddedGradientPlan(m, 64);
  REQUIRE(validatePlan(padded));
  CHECK(padded.arena_bytes() > singleClassPlan(m, 2, {0}, 1).arena_bytes());
  CHECK(runSteps(padded, 3, 7) ==
        runSteps(singleClassPlan(m, 2, {0}, 1), 3, 7));

  plan::Plan p = padded;
  plan::Segment *bwd = p.mutable_segments(1);
  // Kernels 0-3: cross_entropy_grad, linear_grad_weight, accumulate,
  // linear_grad_input.
  SECTION("a reader without valid_cols") {
    bwd->mutable_kernels(3)->mutable_attrs()->erase("valid_cols");
    expectInvalid(p, {"segment 1 ('bwd'), kernel 3 ('linear_grad_input') "
                      "input 0: value 4 is stored f32[16,64], rows padded "
                      "to 64 columns of which 16 valid, which this kernel "
                      "does not take there"});
  }
  SECTION("a reader with another valid_cols") {
    setAttrInt(bwd->mutable_kernels(1), "valid_cols", 15);
    expectInvalid(p, {"kernel 1 ('linear_grad_weight') input 1: value 4"});
  }
  SECTION("a kernel without a padded form") {
    plan::Kernel *g = bwd->add_kernels();
    g->set_op("gelu");
    *g->add_inputs() = value(4);
    *g->add_outputs() = value(4);
    expectInvalid(p, {"kernel 6 ('gelu') input 0: value 4 is stored"});
    setAttrInt(g, "valid_cols", 16);
    expectInvalid(p, {"kernel 6 ('gelu'): has valid_cols, but no padded "
                      "form"});
  }
  SECTION("valid_cols not a positive integer") {
    setAttr(bwd->mutable_kernels(0), "valid_cols", 2.5);
    expectInvalid(p, {"kernel 0 ('cross_entropy_grad'): attribute "
                      "'valid_cols' must be a positive integer"});
  }
  SECTION("a padded segment result") {
    bwd->add_results(4);
    expectInvalid(p, {"segment 1 ('bwd'): result value 4 is stored f32[16,"
                      "64], rows padded to 64 columns of which 16 valid; "
                      "step buffers are dense"});
  }
}

TEST_CASE("validatePlan: ZeRO under tensor parallelism needs the members' "
          "subgroups",
          "[validate]") {
  // 4 ranks = 2 data replicas x 2 members: a ZeRO collective runs over
  // {0, 2} and {1, 3}, never over the whole group or consecutive pairs.
  TinyModel m;
  plan::Plan p = singleClassPlan(m, 2, {0, 1, 2, 3}, 4);
  p.mutable_training()->set_tensor_parallel(2);
  p.mutable_training()->set_num_replicas(2);
  p.mutable_params(1)->mutable_sharding()->set_optimizer(true);
  plan::Instruction *rs = p.mutable_streams(0)->add_instructions();
  rs->set_kind(plan::Instruction::REDUCE_SCATTER_GRADS);
  rs->set_group(0);
  rs->add_params(1);
  const char *want = "REDUCE_SCATTER_GRADS under tensor_parallel 2 needs 2 "
                     "subgroups, the data replicas of each tensor-parallel "
                     "member";
  SECTION("none") { expectInvalid(p, {want}); }
  SECTION("consecutive pairs") {
    for (std::vector<int> ranks : {std::vector<int>{0, 1}, {2, 3}}) {
      plan::DeviceGroup *g = p.add_groups();
      g->set_id(p.groups_size() - 1);
      for (int r : ranks)
        g->add_ranks(r);
      rs->add_subgroups(g->id());
    }
    expectInvalid(p, {want});
  }
}

TEST_CASE("a kernel off the kernel table is a load-time error naming it",
          "[validate]") {
  TinyModel m;
  auto loadError = [&](const std::function<void(plan::Plan &)> &edit) {
    plan::Plan p = singleClassPlan(m, 1, {0}, 1);
    edit(p);
    ExecutorOptions opts;
    Status status;
    CHECK_FALSE(Executor::create(p, opts, status));
    return status.message();
  };
  const std::string prefix = "rank 0: invalid plan for device class 0: ";
  CHECK(loadError([](plan::Plan &p) {
          p.mutable_segments(0)->mutable_kernels(2)->set_op("softmax");
        }) == prefix + "segment 0 ('fwd'), kernel 2 ('softmax'): unknown "
                       "kernel 'softmax'");
  CHECK(loadError([](plan::Plan &p) {
          plan::Kernel *k = p.mutable_segments(0)->mutable_kernels(2);
          *k->add_inputs() = k->inputs(0);
        }) == prefix + "segment 0 ('fwd'), kernel 2 ('cross_entropy'): "
                       "kernel 'cross_entropy' takes 2 inputs, got 3");
  CHECK(loadError([](plan::Plan &p) {
          p.mutable_segments(2)->mutable_kernels(0)->mutable_attrs()->erase(
              "lr");
        }) == prefix + "segment 2 ('update'), kernel 0 ('adamw'): kernel "
                       "'adamw' requires attribute 'lr'");
}

TEST_CASE("a plan file with the removed kind 8 (UPDATE) fails to load",
          "[validate]") {
  // Kind 8 was UPDATE, which no runtime ever ran; plan.proto reserves it.
  CHECK_FALSE(Instruction::Kind_IsValid(8));
  TinyModel m;
  plan::Plan p = singleClassPlan(m, 2, {0}, 1, true);
  p.mutable_streams(0)->mutable_instructions(1)->set_kind(
      static_cast<Instruction::Kind>(8));
  const char *base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/kind8-XXXXXX";
  REQUIRE(::mkdtemp(dir.data()));
  std::string path = dir + "/plan.pb";
  REQUIRE(plan::writePlanFile(path, p) == "");

  // The file itself is well formed (proto3 keeps the unknown enum value)...
  plan::Plan loaded;
  REQUIRE(plan::readPlanFile(path, loaded) == "");
  REQUIRE(loaded.streams(0).instructions(1).kind() == 8);
  // ... and loading it into an executor names the instruction and the kind.
  ExecutorOptions opts;
  opts.rank = 0;
  Status status;
  CHECK_FALSE(Executor::create(loaded, opts, status));
  INFO(status.message());
  CHECK(status.message().find("stream 'compute', instruction 1 (F MB=0)") !=
        std::string::npos);
  CHECK(status.message().find("unknown instruction kind 8") !=
        std::string::npos);
}
TEST_CASE("validateStrategy checks the ranks and matches transfers",
          "[validate]") {
  TinyModel m;
  std::vector<plan::Plan> pp = pipelinePlans(m, 2);
  plan::Manifest man = manifestFor(pp, "pp=2");

  SECTION("a missing rank") {
    man.set_world_size(3);
    for (auto &p : pp)
      p.set_world_size(3);
    Status st = validateStrategy(man, pp);
    CHECK(st.message() == "rank 2 is in no device class of the manifest");
  }
  SECTION("a send without a receive on the same stream name") {
    pp[1].mutable_streams(0)->set_name("other");
    Status st = validateStrategy(man, pp);
    REQUIRE_FALSE(st);
    CHECK(st.message().find("rank 0 (class 0), stream 'main', instruction 2 "
                            "(send x MB=0): sends to rank 1 with tag 0") !=
          std::string::npos);
  }
  SECTION("a size mismatch") {
    pp[1].mutable_buffers(0)->mutable_type()->set_shape(0, 3);
    Status st = validateStrategy(man, pp);
    REQUIRE_FALSE(st);
    CHECK(st.message().find("sends 512 bytes but") != std::string::npos);
  }
}

TEST_CASE("executor: the first loss with a zero head is ln(V)", "[executor]") {
  TinyModel m;
  m.normalHead = false;
  std::vector<double> losses = runSteps(singleClassPlan(m, 2, {0}, 1), 1, 5);
  CHECK(losses[0] == Approx(std::log(16.0)).epsilon(1e-7));
}

TEST_CASE("executor: training matches a direct computation and learns",
          "[executor]") {
  TinyModel m;
  uint64_t seed = 11;
  std::vector<double> losses =
      runSteps(singleClassPlan(m, 3, {0}, 1), 40, seed);
  CHECK(losses[0] == Approx(directLoss(m, seed, 3)).epsilon(1e-5));
  INFO("first " << losses[0] << " last " << losses.back());
  CHECK(losses.back() < 0.85 * losses[0]);
  CHECK(losses[10] < losses[0]);

  // Moving the loads to their own stream, synchronized by events, computes
  // exactly the same step.
  std::vector<double> twoStreams =
      runSteps(singleClassPlan(m, 3, {0}, 1, true), 40, seed);
  CHECK(twoStreams == losses);
}

namespace {
/// Synthetic data that records the steps it fills and the threads filling
/// them.
class RecordingData : public DataSource {
public:
  RecordingData(uint64_t seed, int64_t vocab) : inner(seed, vocab) {}
  Status fill(int64_t step, int64_t globalMicrobatch, int64_t batch,
              int64_t seqLen, int32_t *tokens, int32_t *targets) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      steps.push_back(step);
      threads.push_back(std::this_thread::get_id());
    }
    return inner.fill(step, globalMicrobatch, batch, seqLen, tokens, targets);
  }
  std::mutex mu;
  std::vector<int64_t> steps;
  std::vector<std::thread::id> threads;

private:
  SyntheticData inner;
};
} // namespace

// The batches are loaded on the host before their step's streams start:
// step t + 1's while step t runs (into the other half of the staging),
// step t's first where it was not prefetched (the first step, or after a
// skipped step). Without an update the parameters never change, so each
// step's loss depends on its batch alone: an executor skipping steps must
// see the same loss for the same step as one running them all, which a
// batch taken from the wrong half would break (the steps' batches differ).
TEST_CASE("executor: batches are prefetched a step ahead, on the host",
          "[executor]") {
  TinyModel m;
  const uint64_t seed = 9;
  plan::Plan plan = singleClassPlan(m, 2, {0}, 1);
  // --no-optimizer: drop the update call.
  plan.mutable_streams(0)->mutable_instructions()->RemoveLast();
  REQUIRE(validatePlan(plan));
  auto run = [&](const std::vector<int64_t> &steps, RecordingData &data) {
    ExecutorOptions opts;
    opts.seed = seed;
    opts.data = &data;
    Status status;
    auto exec = Executor::create(plan, opts, status);
    INFO(status.message());
    REQUIRE(exec);
    std::vector<double> losses;
    for (int64_t step : steps) {
      double loss = 0;
      Status ran = exec->runStep(step, loss);
      INFO("step " << step << ": " << ran.message());
      REQUIRE(ran);
      losses.push_back(loss);
    }
    return losses;
  };
  RecordingData inOrder(seed, m.vocab), skipping(seed, m.vocab);
  const std::vector<int64_t> all = {1, 2, 3, 4, 5, 6}, some = {3, 5, 6};
  std::vector<double> a = run(all, inOrder), b = run(some, skipping);
  for (size_t k = 0; k < all.size(); ++k)
    CHECK(a[k] == Approx(directLoss(m, seed, 2, all[k])).epsilon(1e-5));
  for (size_t k = 0; k < some.size(); ++k)
    CHECK(b[k] == Approx(directLoss(m, seed, 2, some[k])).epsilon(1e-5));
  // The steps' batches differ (so a wrong one shows).
  CHECK(directLoss(m, seed, 2, 1) !=
        Approx(directLoss(m, seed, 2, 2)).epsilon(1e-3));
  // Two microbatches per step, each step filled once, one step ahead.
  CHECK(inOrder.steps ==
        std::vector<int64_t>{1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7});
  CHECK(skipping.steps == std::vector<int64_t>{3, 3, 4, 4, 5, 5, 6, 6, 7, 7});
  // All on the thread running the steps, none on a stream's.
  for (const RecordingData *d : {&inOrder, &skipping})
    for (std::thread::id t : d->threads)
      CHECK(t == std::this_thread::get_id());
}

TEST_CASE("executor: state after a step", "[executor]") {
  TinyModel m;
  ExecutorOptions opts;
  opts.seed = 3;
  Status status;
  auto exec = Executor::create(singleClassPlan(m, 1, {0}, 1), opts, status);
  REQUIRE(exec);
  TensorRef wte = exec->state(0, Operand::PARAM);
  REQUIRE(wte.numel() == m.vocab * m.hidden);
  std::vector<float> before(wte.f32(), wte.f32() + wte.numel());
  CHECK(before == initTensor("wte", 3, wte.numel(), 0, 0.5));
  double loss = 0;
  REQUIRE(exec->runStep(1, loss));
  // The update segment zeroes the gradients and moves the parameters.
  TensorRef grad = exec->state(0, Operand::GRAD);
  CHECK(std::all_of(grad.f32(), grad.f32() + grad.numel(),
                    [](float g) { return g == 0.0f; }));
  CHECK(!std::equal(before.begin(), before.end(), wte.f32()));
  TensorRef v = exec->state(1, Operand::ADAM_V);
  CHECK(std::any_of(v.f32(), v.f32() + v.numel(),
                    [](float x) { return x > 0.0f; }));
}

namespace {
/// Fails every load, to make a stream fail while another waits for it.
class FailingData : public DataSource {
public:
  Status fill(int64_t, int64_t, int64_t, int64_t, int32_t *,
              int32_t *) override {
    return Status::error("token file is unreadable");
  }
};

/// Hands out tokens outside the vocabulary, so that a kernel fails.
class BadTokens : public DataSource {
public:
  Status fill(int64_t, int64_t, int64_t batch, int64_t seqLen, int32_t *tokens,
              int32_t *targets) override {
    for (int64_t i = 0; i < batch * seqLen; ++i)
      tokens[i] = targets[i] = 1000;
    return Status::ok();
  }
};
} // namespace

TEST_CASE("executor: a failing stream wakes its waiters", "[executor]") {
  TinyModel m;
  FailingData data;
  ExecutorOptions opts;
  opts.data = &data;
  int callbacks = 0;
  opts.onStreamError = [&](const Status &) { ++callbacks; };
  Status status;
  auto exec =
      Executor::create(singleClassPlan(m, 2, {0}, 1, true), opts, status);
  REQUIRE(exec);
  double loss = 0;
  Status st = exec->runStep(1, loss);
  REQUIRE_FALSE(st);
  CHECK(st.message() == "rank 0, stream 'data', instruction 0 (load MB=0): "
                        "token file is unreadable");
  CHECK(callbacks == 1);
  // A failed executor refuses to run on.
  CHECK(exec->runStep(2, loss).message().find("failed step") !=
        std::string::npos);
}

TEST_CASE("executor: kernel errors carry the full context", "[executor]") {
  TinyModel m;
  BadTokens data;
  ExecutorOptions opts;
  opts.data = &data;
  Status status;
  auto exec = Executor::create(singleClassPlan(m, 1, {0}, 1), opts, status);
  REQUIRE(exec);
  double loss = 0;
  Status st = exec->runStep(1, loss);
  REQUIRE_FALSE(st);
  CHECK(st.message().rfind("rank 0, stream 'compute', instruction 1 (F MB=0): "
                           "segment 'fwd', kernel 0: embedding: ",
                           0) == 0);
}

TEST_CASE("executor: creation errors", "[executor]") {
  TinyModel m;
  Status status;
  ExecutorOptions opts;
  opts.rank = 2;
  CHECK_FALSE(Executor::create(singleClassPlan(m, 1, {0}, 1), opts, status));
  CHECK(status.message().find("rank 2: not one of the ranks [0]") !=
        std::string::npos);

  opts.rank = 0;
  CHECK_FALSE(Executor::create(singleClassPlan(m, 1, {0, 1}, 2), opts, status));
  CHECK(status.message().find("no communicator") != std::string::npos);

  plan::Plan bad = singleClassPlan(m, 1, {0}, 1);
  bad.mutable_segments(0)->mutable_kernels(0)->set_op("nope");
  CHECK_FALSE(Executor::create(bad, opts, status));
  CHECK(status.message().find("rank 0: invalid plan for device class 0: ") ==
        0);
}

TEST_CASE("executor: a one-rank all-reduce needs no communicator",
          "[executor]") {
  TinyModel m;
  plan::Plan p = singleClassPlan(m, 1, {0}, 1);
  plan::Stream *s = p.mutable_streams(0);
  plan::Instruction *ar = addInst(s, Instruction::ALL_REDUCE, "allreduce");
  ar->set_group(0);
  ar->add_params(0);
  ar->add_params(1);
  // Move the all-reduce before the update.
  s->mutable_instructions()->SwapElements(s->instructions_size() - 1,
                                          s->instructions_size() - 2);
  withArena(p); // the new instruction needs a place for its staging buffer
  ExecutorOptions opts;
  Status status;
  auto exec = Executor::create(p, opts, status);
  INFO(status.message());
  REQUIRE(exec);
  CHECK(exec->commKeys().empty());
  CHECK(runSteps(p, 2, 0) == runSteps(singleClassPlan(m, 1, {0}, 1), 2, 0));
}

TEST_CASE("validatePlan: LOAD_BATCH under context parallelism", "[validate]") {
  TinyModel m;
  plan::Plan p = contextParallelPlan(m, 2, {0, 1, 2, 3}, 4, 2);
  REQUIRE(validatePlan(p));
  SECTION("whole sequences") {
    plan::Plan whole = singleClassPlan(m, 2, {0, 1, 2, 3}, 4);
    whole.mutable_training()->set_context_parallel(2);
    expectInvalid(whole, {"(load MB=0)", "expected i32[2,4]",
                          "training.seq_len / context_parallel"});
  }
  SECTION("degree that does not divide the replicas") {
    p.mutable_training()->set_context_parallel(3);
    expectInvalid(p, {"training.context_parallel is 3, which does not divide "
                      "num_replicas 4"});
  }
  SECTION("sequence not a multiple of 2N") {
    p.mutable_training()->set_seq_len(6);
    expectInvalid(p, {"training.seq_len 6 is not a multiple of 2 x "
                      "context_parallel 2"});
  }
}

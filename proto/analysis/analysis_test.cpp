// Unit tests of the plan-level analyses: stream order and arena layout.
#include <random>

#include <catch2/catch.hpp>

#include "proto/analysis/MemoryPlan.h"
#include "proto/analysis/StreamOrder.h"

using namespace piper::plan;

namespace {

Instruction *add(Plan &plan, int stream, Instruction::Kind kind) {
  while (plan.streams_size() <= stream) {
    std::string name = "s" + std::to_string(plan.streams_size());
    plan.add_streams()->set_name(name);
  }
  Instruction *inst = plan.mutable_streams(stream)->add_instructions();
  inst->set_kind(kind);
  return inst;
}

void event(Plan &plan, int recordStream, int waitStream, int id) {
  add(plan, recordStream, Instruction::RECORD)->set_event(id);
  add(plan, waitStream, Instruction::WAIT)->set_event(id);
  plan.set_num_events(std::max(plan.num_events(), id + 1));
}

Block block(int64_t bytes, std::vector<Pos> accesses, std::string name) {
  Block b;
  b.bytes = bytes;
  b.accesses = std::move(accesses);
  b.name = std::move(name);
  return b;
}

} // namespace

TEST_CASE("stream order follows program order and record/wait edges") {
  Plan plan;
  add(plan, 0, Instruction::CALL); // (0,0)
  event(plan, 0, 1, 0);            // (0,1) record, (1,0) wait
  add(plan, 1, Instruction::CALL); // (1,1)
  add(plan, 0, Instruction::CALL); // (0,2)
  StreamOrder order;
  std::string error;
  REQUIRE(StreamOrder::build(plan, order, error));
  CHECK(order.happensBefore({0, 0}, {0, 2}));
  CHECK(order.happensBefore({0, 0}, {1, 1}));
  CHECK(order.happensBefore({0, 1}, {1, 0}));
  CHECK_FALSE(order.happensBefore({1, 1}, {0, 2}));
  CHECK(order.concurrent({1, 1}, {0, 2}));
  CHECK_FALSE(order.concurrent({0, 0}, {1, 1}));
  CHECK(order.recordedAt()[0] == Pos{0, 1});
}

TEST_CASE("stream order reports a deadlock on events, naming both ends") {
  Plan plan;
  add(plan, 0, Instruction::WAIT)->set_event(0);
  add(plan, 0, Instruction::RECORD)->set_event(1);
  add(plan, 1, Instruction::WAIT)->set_event(1);
  add(plan, 1, Instruction::RECORD)->set_event(0);
  plan.set_num_events(2);
  StreamOrder order;
  std::string error;
  REQUIRE_FALSE(StreamOrder::build(plan, order, error));
  CHECK(error.find("the streams deadlock on events: stream 's0', "
                   "instruction 0 (WAIT) waits for event 0, recorded by "
                   "stream 's1', instruction 1 (RECORD)") == 0);
}

TEST_CASE("a wait for an event nobody records is a deadlock") {
  Plan plan;
  add(plan, 0, Instruction::WAIT)->set_event(0);
  plan.set_num_events(1);
  StreamOrder order;
  std::string error;
  REQUIRE_FALSE(StreamOrder::build(plan, order, error));
  CHECK(error.find("which no instruction records") != std::string::npos);
}

TEST_CASE("ordered blocks share bytes, concurrent ones do not") {
  Plan plan;
  for (int i = 0; i < 4; ++i)
    add(plan, 0, Instruction::CALL);
  add(plan, 1, Instruction::CALL);
  StreamOrder order;
  std::string error;
  REQUIRE(StreamOrder::build(plan, order, error));
  std::vector<Block> blocks = {
      block(100, {{0, 0}, {0, 1}}, "a"), // dies before c is defined
      block(50, {{0, 1}, {0, 2}}, "b"),  // overlaps a at (0,1)
      block(100, {{0, 2}, {0, 3}}, "c"),
      block(10, {{1, 0}}, "d"), // concurrent with everything on stream 0
  };
  ArenaLayout layout = packBlocks(blocks, order, 64);
  REQUIRE(verifyLayout(blocks, layout, order, 64, error));
  CHECK(layout.offsets[0] == layout.offsets[2]); // a and c reuse bytes
  CHECK(layout.offsets[1] >= 128);               // b sits above a (aligned)
  // In execution order: a, d (defined alongside a), b above both, then c in
  // the bytes a left.
  CHECK(layout.offsets[3] == 128);
  CHECK(layout.offsets[1] == 192);
  CHECK(layout.bytes == 128 + 64 + 50);
  CHECK(endsBefore(blocks[0], blocks[2], order));
  CHECK_FALSE(endsBefore(blocks[0], blocks[1], order));

  // A block an asynchronous send still reads lives until the step ends.
  blocks[0].untilStepEnd = true;
  layout = packBlocks(blocks, order, 64);
  REQUIRE(verifyLayout(blocks, layout, order, 64, error));
  CHECK(layout.offsets[0] != layout.offsets[2]);
}

TEST_CASE("verifyLayout names two live blocks that share bytes") {
  Plan plan;
  add(plan, 0, Instruction::CALL);
  add(plan, 1, Instruction::CALL);
  StreamOrder order;
  std::string error;
  REQUIRE(StreamOrder::build(plan, order, error));
  std::vector<Block> blocks = {block(64, {{0, 0}}, "x"),
                               block(64, {{1, 0}}, "y")};
  ArenaLayout bad{{0, 0}, 64};
  REQUIRE_FALSE(verifyLayout(blocks, bad, order, 64, error));
  CHECK(error == "x and y share bytes at offset 0 but may be live at the "
                 "same time");
  ArenaLayout outside{{0, 64}, 100};
  REQUIRE_FALSE(verifyLayout(blocks, outside, order, 64, error));
  CHECK(error.find("outside the arena of 100 bytes") != std::string::npos);
}

TEST_CASE("random plans: packed layouts are valid and never above the sum") {
  std::mt19937 rng(42);
  for (int round = 0; round < 200; ++round) {
    Plan plan;
    int streams = 1 + rng() % 3;
    int events = 0;
    for (int step = 0; step < 30; ++step) {
      int s = rng() % streams, t = rng() % streams;
      if (s != t && rng() % 4 == 0)
        event(plan, s, t, events++); // record before wait: never deadlocks
      else
        add(plan, s, Instruction::CALL);
    }
    StreamOrder order;
    std::string error;
    REQUIRE(StreamOrder::build(plan, order, error));
    std::vector<Block> blocks;
    int64_t sum = 0;
    for (int b = 0; b < 25; ++b) {
      int s = rng() % streams;
      int n = plan.streams(s).instructions_size();
      int def = rng() % n;
      std::vector<Pos> acc = {{s, def}};
      for (int r = 0; r < 3; ++r) {
        int t = rng() % streams;
        int m = plan.streams(t).instructions_size();
        Pos p{t, static_cast<int>(rng() % m)};
        if (order.happensBefore({s, def}, p))
          acc.push_back(p);
      }
      blocks.push_back(block(1 + rng() % 1000, acc, "b" + std::to_string(b)));
      sum += (blocks.back().bytes + 63) / 64 * 64;
    }
    ArenaLayout layout = packBlocks(blocks, order, 64);
    INFO("round " << round);
    REQUIRE(verifyLayout(blocks, layout, order, 64, error));
    CHECK(layout.bytes <= sum);
  }
}

namespace {
/// A segment of four float32 values of `elements` each: the argument v0,
/// v1 = f(v0), v2 = f(v1), and the result v3 = f(v2).
Segment chainSegment(int64_t elements) {
  Segment seg;
  for (int i = 0; i < 4; ++i) {
    TensorType *t = seg.add_values();
    t->set_dtype(F32);
    t->add_shape(elements);
  }
  seg.add_args(0);
  seg.add_results(3);
  for (int v = 0; v < 3; ++v) {
    Kernel *k = seg.add_kernels();
    k->set_op("gelu");
    k->add_inputs()->set_index(v);
    k->add_outputs()->set_index(v + 1);
  }
  return seg;
}
} // namespace

TEST_CASE("segment scratch reuses the bytes of dead values") {
  Segment seg = chainSegment(16); // 64 bytes a value
  std::vector<int64_t> offsets;
  // v1 and v2 overlap at kernel 1; the result v3 is bound to a step buffer.
  CHECK(planSegmentScratch(seg, false, &offsets, 64) == 128);
  CHECK(offsets[0] == -1);
  CHECK(offsets[3] == -1);
  CHECK(offsets[1] != offsets[2]);
  // bf16 plans unpack a packed argument into scratch just before its first
  // reader, until its last, and compute a result in scratch, packing it
  // right after its last writer: v0 lives at kernel 0 only, so v2 takes its
  // place; v3 lives at kernel 2, overlapping v2 but not v1.
  CHECK(planSegmentScratch(seg, true, &offsets, 64) == 128);
  CHECK(offsets[0] >= 0);
  CHECK(offsets[2] == offsets[0]);
  CHECK(offsets[3] == offsets[1]);
}

// A device that stores values packed sizes them itself (the runtime's
// relayout): half of the float32 bytes, or none (written to or read from
// its step buffer as stored: offset 0, no bytes).
TEST_CASE("segment scratch with the device's value sizes") {
  Segment seg = chainSegment(32); // 128 bytes a value
  std::vector<int64_t> offsets;
  CHECK(planSegmentScratch(seg, true, &offsets, 64) == 256);
  // v1 and v2 packed (64 bytes each), the argument read as stored and the
  // result written as stored (no bytes).
  const std::vector<int64_t> bytes = {0, 64, 64, 0};
  CHECK(planSegmentScratch(seg, true, &offsets, 64, &bytes) == 128);
  CHECK(offsets == std::vector<int64_t>{0, 0, 64, 0});
  // -1: the float32 bytes.
  const std::vector<int64_t> some = {0, -1, 64, -1};
  CHECK(planSegmentScratch(seg, true, &offsets, 64, &some) == 192);
}

TEST_CASE(
    "step blocks: one per buffer, defined by its writer; scratch per call") {
  Plan plan;
  plan.mutable_training()->set_compute_dtype(F32);
  Buffer *b = plan.add_buffers();
  b->set_id(0);
  b->mutable_type()->set_dtype(BF16);
  b->mutable_type()->add_shape(10);
  Segment *seg = plan.add_segments();
  seg->add_values()->set_dtype(F32);
  Instruction *w = add(plan, 0, Instruction::RECV);
  w->add_outputs(0);
  Instruction *send = add(plan, 0, Instruction::SEND);
  send->add_inputs(0);
  Instruction *call = add(plan, 0, Instruction::CALL);
  call->set_segment(0);
  call->add_inputs(0);
  StepBlocks step = stepBlocks(plan);
  std::vector<Block> &blocks = step.blocks;
  REQUIRE(blocks.size() == 2);
  CHECK(step.bufferBlock[0] == 0);
  CHECK(step.callBlock[0][2] == 1);
  CHECK(step.callBlock[0][0] == -1);
  CHECK(blocks[0].bytes == 20); // bf16 step buffers are packed
  CHECK(blocks[0].accesses.front() == Pos{0, 0});
  CHECK(blocks[0].accesses.size() == 3);
  CHECK(blocks[0].untilStepEnd); // read by a send
  CHECK(blocks[1].accesses.front() == Pos{0, 2});

  // In a bf16 plan, float32 step buffers are stored packed.
  b->mutable_type()->set_dtype(F32);
  plan.mutable_training()->set_compute_dtype(BF16);
  CHECK(stepBlocks(plan).blocks[0].bytes == 20);
  plan.mutable_training()->set_compute_dtype(F32);
  CHECK(stepBlocks(plan).blocks[0].bytes == 40);
}

TEST_CASE("memoryReport: a layout for a good plan, the reason for a bad one") {
  Plan plan;
  Buffer *b = plan.add_buffers();
  b->set_id(0);
  b->mutable_type()->set_dtype(F32);
  b->mutable_type()->add_shape(4);
  add(plan, 0, Instruction::LOAD_BATCH)->add_outputs(0);
  add(plan, 0, Instruction::CALL)->add_inputs(0);
  add(plan, 0, Instruction::SEND)->add_inputs(0);
  std::string text;
  REQUIRE(memoryReport(plan, 1, text));
  CHECK(text.find("memory class 0: arena 16 bytes = state 0 + step 16 (1 "
                  "buffers and 0 scratch and staging areas") == 0);
  CHECK(text.find("  offset 0: 16 bytes, buffer 0") != std::string::npos);
  // The peak at a kernel call: the buffer, live from the batch's load to
  // the send.
  CHECK(text.find("peak: 16 bytes live at ") != std::string::npos);
  CHECK(text.find("  live: 16 bytes, buffer 0") != std::string::npos);
  // A recorded memory plan is checked, not trusted.
  Plan recorded = plan;
  REQUIRE(assignArena(recorded, text));
  recorded.set_arena_bytes(8);
  REQUIRE_FALSE(memoryReport(recorded, 1, text));
  CHECK(text.find("invalid memory plan: ") == 0);

  add(plan, 0, Instruction::WAIT)->set_event(0);
  plan.set_num_events(1);
  REQUIRE_FALSE(memoryReport(plan, 1, text));
  CHECK(text.find("the streams deadlock on events") == 0);
}

namespace {

/// A two-stream plan: a batch, a call producing an activation that is sent,
/// a second call, with the send ordered after the first call by an event.
Plan smallPlan() {
  Plan plan;
  auto param = plan.add_params();
  param->set_name("w");
  param->mutable_type()->set_dtype(F32);
  param->mutable_type()->add_shape(3);
  for (int id = 0; id < 3; ++id) {
    Buffer *b = plan.add_buffers();
    b->set_id(id);
    b->mutable_type()->set_dtype(id == 0 ? I32 : F32);
    b->mutable_type()->add_shape(8);
    b->set_name("b" + std::to_string(id));
  }
  Segment *seg = plan.add_segments();
  seg->set_name("f");
  for (int v = 0; v < 3; ++v) {
    TensorType *t = seg->add_values();
    t->set_dtype(F32);
    t->add_shape(8);
  }
  seg->add_args(0);
  seg->add_results(2);
  for (int k = 0; k < 2; ++k) {
    Kernel *kern = seg->add_kernels();
    kern->set_op("gelu");
    kern->add_inputs()->set_index(k);
    kern->add_outputs()->set_index(k + 1);
  }
  add(plan, 0, Instruction::LOAD_BATCH)->add_outputs(0);
  Instruction *c1 = add(plan, 0, Instruction::CALL);
  c1->add_inputs(0);
  c1->add_outputs(1);
  event(plan, 0, 1, 0);
  add(plan, 1, Instruction::SEND)->add_inputs(1);
  Instruction *c2 = add(plan, 0, Instruction::CALL);
  c2->add_inputs(0);
  c2->add_outputs(2);
  return plan;
}

} // namespace

TEST_CASE("assignArena writes a memory plan that checkArena accepts") {
  Plan plan = smallPlan();
  std::string error;
  REQUIRE(assignArena(plan, error));
  REQUIRE(checkArena(plan, error));
  // Four float32 state tensors of 12 bytes, each 64-byte aligned.
  CHECK(plan.state_bytes() == 256);
  CHECK(plan.params(0).state_offsets_size() == 4);
  CHECK(plan.params(0).state_offsets(3) == 192);
  CHECK(plan.params(0).shard().global_shape_size() == 1);
  CHECK(plan.params(0).shard().start(0) == 0);
  CHECK(plan.buffers(0).role() == BATCH);
  CHECK(plan.buffers(1).role() == COMMUNICATION);
  CHECK(plan.buffers(2).role() == ACTIVATION);
  for (const Buffer &b : plan.buffers())
    CHECK(b.offset() >= plan.state_bytes());
  // Value 1 is the only one in scratch (0 is an argument, 2 a result).
  CHECK(plan.segments(0).scratch_bytes() == 32);
  CHECK(plan.segments(0).value_offsets(0) == -1);
  CHECK(plan.segments(0).value_offsets(1) == 0);
  CHECK(plan.arena_bytes() >= plan.state_bytes() + 3 * 32);
}

// relayoutStep lays the step out again with a device's value sizes,
// keeping the state region (sharded or not) as it was: a smaller arena that
// checkArena accepts with those sizes, and rejects without them once values
// share bytes they would need as float32.
TEST_CASE("relayoutStep keeps the state and lays the step out again") {
  Plan plan = smallPlan();
  std::string error;
  REQUIRE(assignArena(plan, error));
  const Plan before = plan;
  ValueBytes none(plan.segments_size());
  REQUIRE(relayoutStep(plan, &none, error));
  CHECK(plan.SerializeAsString() == before.SerializeAsString());
  // Value 1 (32 bytes as float32) stored packed: 16 bytes.
  ValueBytes bytes(plan.segments_size());
  bytes[0].assign(plan.segments(0).values_size(), -1);
  bytes[0][1] = 16;
  plan.mutable_params(0)->set_state_offsets(3, 128); // kept, however odd
  REQUIRE(relayoutStep(plan, &bytes, error));
  CHECK(plan.params(0).state_offsets(3) == 128);
  CHECK(plan.state_bytes() == before.state_bytes());
  CHECK(plan.segments(0).scratch_bytes() == 16);
  CHECK(plan.arena_bytes() <= before.arena_bytes());
  plan.mutable_params(0)->set_state_offsets(3, 192);
  CHECK(checkArena(plan, error, &bytes));
  // A value sized larger than the layout gave it is outside its scratch.
  bytes[0][1] = 32;
  REQUIRE_FALSE(checkArena(plan, error, &bytes));
  CHECK(error == "value 1 of segment 'f' at scratch offset 0 is missing, "
                 "misaligned or outside its 16 bytes of scratch");
}

// layOutState lays the state region out as assignArena does, the compute
// copies a device stores packed at their bf16 bytes: a smaller state that
// checkArena accepts with those sizes (the step laid out above it), and
// rejects without them.
TEST_CASE("layOutState gives packed compute copies their bf16 bytes") {
  Plan plan = smallPlan();
  plan.mutable_training()->set_compute_dtype(BF16);
  Parameter *v = plan.add_params();
  v->set_name("v");
  v->mutable_type()->set_dtype(F32);
  v->mutable_type()->add_shape(64);
  std::string error;
  REQUIRE(assignArena(plan, error));
  const Plan before = plan;
  // w's 3 elements take 64 bytes per tensor (the alignment), v's 256: 5 x
  // 64 + 5 x 256.
  CHECK(before.state_bytes() == 5 * 64 + 5 * 256);
  layOutState(plan);
  CHECK(plan.SerializeAsString() == before.SerializeAsString());
  // v's copy packed: 128 bytes, last in the region.
  const CopyBytes copies = {-1, 128};
  layOutState(plan, &copies);
  CHECK(plan.state_bytes() == 5 * 64 + 4 * 256 + 128);
  for (int k = 0; k < 5; ++k) {
    CHECK(plan.params(0).state_offsets(k) == before.params(0).state_offsets(k));
    CHECK(plan.params(1).state_offsets(k) == before.params(1).state_offsets(k));
  }
  REQUIRE(relayoutStep(plan, nullptr, error));
  CHECK(plan.arena_bytes() == before.arena_bytes() - 128);
  for (const Buffer &b : plan.buffers())
    CHECK(b.offset() >= plan.state_bytes());
  CHECK(checkArena(plan, error, nullptr, &copies));
  REQUIRE_FALSE(checkArena(plan, error));
  CHECK(error == "the bf16 compute copy of parameter 'v' at offset 1344 is "
                 "misaligned or outside the state region of 1472 bytes");
}

TEST_CASE("checkArena rejects a corrupted memory plan, naming the culprit") {
  Plan good = smallPlan();
  std::string error;
  REQUIRE(assignArena(good, error));

  Plan p = good;
  p.mutable_params(0)->set_state_offsets(1, 0);
  REQUIRE_FALSE(checkArena(p, error));
  CHECK(error == "the gradient of parameter 'w' overlaps the value of "
                 "parameter 'w'");

  p = good;
  p.mutable_params(0)->mutable_state_offsets()->RemoveLast();
  REQUIRE_FALSE(checkArena(p, error));
  CHECK(error == "parameter 'w' has 3 state offsets, not 4");

  p = good;
  p.set_arena_bytes(p.state_bytes() - 1);
  REQUIRE_FALSE(checkArena(p, error));
  CHECK(error.find("are inconsistent") != std::string::npos);

  // The sent buffer lives to the end of the step: it may not share bytes
  // with the second call's output.
  p = good;
  p.mutable_buffers(2)->set_offset(p.buffers(1).offset());
  REQUIRE_FALSE(checkArena(p, error));
  CHECK(error.find("memory plan: buffer") == 0);
  CHECK(error.find("but may be live at the same time") != std::string::npos);

  p = good;
  p.mutable_segments(0)->set_value_offsets(1, 4096);
  REQUIRE_FALSE(checkArena(p, error));
  CHECK(error == "value 1 of segment 'f' at scratch offset 4096 is missing, "
                 "misaligned or outside its 32 bytes of scratch");

  p = good;
  p.mutable_streams(0)->mutable_instructions(1)->set_scratch_offset(
      p.arena_bytes());
  REQUIRE_FALSE(checkArena(p, error));
  CHECK(error.find("outside the arena") != std::string::npos);

  // A step buffer moved into the state, or onto the scratch of a call that
  // reads it (issue 42 item 9: the runtime's validator runs this check).
  p = good;
  p.mutable_buffers(2)->set_offset(p.params(0).state_offsets(0));
  REQUIRE_FALSE(checkArena(p, error));
  CHECK(error.find("outside the arena") != std::string::npos);
  p = good;
  p.mutable_streams(0)->mutable_instructions(1)->set_scratch_offset(
      p.buffers(0).offset());
  REQUIRE_FALSE(checkArena(p, error));
  CHECK(error == "memory plan: buffer 0 (b0) and scratch of stream 's0', "
                 "instruction 1 (CALL) share bytes at offset 0 but may be "
                 "live at the same time");
}

TEST_CASE("checkFits names the ranks, the peak and the largest live blocks") {
  Plan plan = smallPlan();
  plan.add_ranks(4);
  plan.add_ranks(5);
  std::string error;
  REQUIRE(assignArena(plan, error));
  CHECK(checkFits(plan, plan.arena_bytes(), error));
  REQUIRE_FALSE(checkFits(plan, 100, error));
  INFO(error);
  CHECK(error.find("ranks 4, 5 (device class 0) need 480 B (state 256 B, "
                   "step 224 B) but the device has 100 B; the step peaks "
                   "at stream 's0', instruction 3 (CALL) with 128 B live") ==
        0);
  CHECK(error.find("live, the largest: buffer") != std::string::npos);

  bool fits = false;
  CHECK(fitVerdict(plan, 1000, fits) ==
        "ranks 4, 5 (device class 0) fit: need 480 B (state 256 B, step "
        "224 B) of 1000 B, 520 B to spare");
  CHECK(fits);
  CHECK(fitVerdict(plan, 480, fits).find("520") == std::string::npos);
  CHECK(fits);
  CHECK(fitVerdict(plan, 479, fits) == (checkFits(plan, 479, error), error));
  CHECK_FALSE(fits);
  plan.clear_ranks();
  plan.add_ranks(3);
  CHECK(fitVerdict(plan, 479, fits)
            .rfind("rank 3 (device class 0) needs "
                   "480 B",
                   0) == 0);

  // The peak is where the most bytes may be live: at the second call, the
  // batch, the sent activation (until the step ends), the call's output and
  // its scratch.
  StreamOrder order;
  REQUIRE(StreamOrder::build(plan, order, error));
  StepBlocks step = stepBlocks(plan, true);
  PeakPoint peak = findPeak(plan, order, step.blocks);
  CHECK(peak.at == Pos{0, 3});
  CHECK(peak.bytes == 32 + 32 + 32 + 32);
  CHECK(peak.blocks.size() == 4);
}

TEST_CASE("bf16 plans keep a compute copy per parameter; all-reduces of "
          "several parameters get a staging block") {
  Plan plan = smallPlan();
  auto second = plan.add_params();
  second->set_name("b");
  second->mutable_type()->set_dtype(F32);
  second->mutable_type()->add_shape(20);
  Instruction *ar = add(plan, 1, Instruction::ALL_REDUCE);
  ar->add_params(0);
  ar->add_params(1);
  plan.mutable_training()->set_compute_dtype(BF16);
  std::string error;
  REQUIRE(assignArena(plan, error));
  REQUIRE(checkArena(plan, error));
  CHECK(plan.params(0).state_offsets_size() == 5);
  StepBlocks step = stepBlocks(plan, true);
  int block = step.callBlock[1][plan.streams(1).instructions_size() - 1];
  REQUIRE(block >= 0);
  CHECK(step.blocks[block].bytes == 4 * (3 + 20));
  CHECK(plan.streams(1)
            .instructions(plan.streams(1).instructions_size() - 1)
            .scratch_offset() >= plan.state_bytes());

  Plan p = plan;
  p.mutable_params(0)->mutable_state_offsets()->RemoveLast();
  REQUIRE_FALSE(checkArena(p, error));
  CHECK(error == "parameter 'w' has 4 state offsets, not 5");
}

namespace {

/// Random blocks over a random plan of `streams` streams joined by events;
/// some live until the step ends, a few are never accessed.
struct RandomStep {
  Plan plan;
  StreamOrder order;
  std::vector<Block> blocks;
};

RandomStep randomStep(std::mt19937 &rng, int streams, int instructions,
                      int numBlocks) {
  RandomStep r;
  int events = 0;
  for (int step = 0; step < instructions; ++step) {
    int s = rng() % streams, t = rng() % streams;
    if (s != t && rng() % 4 == 0)
      event(r.plan, s, t, events++); // record before wait: never deadlocks
    else
      add(r.plan, s, Instruction::CALL);
  }
  for (int s = 0; s < streams; ++s)
    add(r.plan, s, Instruction::CALL); // every stream has an instruction
  std::string error;
  REQUIRE(StreamOrder::build(r.plan, r.order, error));
  for (int b = 0; b < numBlocks; ++b) {
    // Sizes from a few classes, as a model's buffers are, and odd ones.
    static const int64_t classes[] = {64, 100, 4096, 777, 0, 65536};
    int64_t bytes = rng() % 3 ? classes[rng() % 6] : rng() % 5000;
    if (rng() % 50 == 0) {
      r.blocks.push_back(block(bytes, {}, "b" + std::to_string(b)));
      continue;
    }
    int s = rng() % streams;
    int n = r.plan.streams(s).instructions_size();
    int def = rng() % n;
    std::vector<Pos> acc = {{s, def}};
    int reads = rng() % 4;
    for (int k = 0; k < reads; ++k) {
      int t = rng() % streams;
      int m = r.plan.streams(t).instructions_size();
      Pos p{t, static_cast<int>(rng() % m)};
      if (r.order.happensBefore({s, def}, p))
        acc.push_back(p);
    }
    r.blocks.push_back(block(bytes, acc, "b" + std::to_string(b)));
    r.blocks.back().untilStepEnd = rng() % 10 == 0;
  }
  return r;
}

/// The bytes of blocks that are all live at one instruction, at most: those
/// defined at or before it with an access it does not follow (or that live
/// until the step ends) pairwise interfere, so no layout is smaller.
int64_t liveBytesBound(const RandomStep &r) {
  int64_t bound = 0;
  for (int s = 0; s < r.plan.streams_size(); ++s)
    for (int i = 0; i < r.plan.streams(s).instructions_size(); ++i) {
      Pos x{s, i};
      int64_t live = 0;
      for (const Block &b : r.blocks) {
        if (b.accesses.empty()) {
          live += b.bytes;
          continue;
        }
        const Pos &def = b.accesses.front();
        if (!(def == x) && !r.order.happensBefore(def, x))
          continue;
        bool open = b.untilStepEnd;
        for (const Pos &a : b.accesses)
          open = open || !r.order.happensBefore(a, x);
        if (open)
          live += b.bytes;
      }
      bound = std::max(bound, live);
    }
  return bound;
}

} // namespace

TEST_CASE("packBlocks: random lifetimes give valid, tight, deterministic "
          "layouts") {
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    int streams = 1 + rng() % 4;
    RandomStep r = randomStep(rng, streams, 10 + rng() % 60, rng() % 80);
    ArenaLayout layout = packBlocks(r.blocks, r.order, 64);
    std::string error;
    INFO("round " << round << ", " << streams << " streams, " << r.blocks.size()
                  << " blocks");
    // Every block has an offset; no two that may be live together overlap.
    REQUIRE(verifyLayout(r.blocks, layout, r.order, 64, error));
    // Pairwise check without the sweep verifyLayout uses.
    for (size_t a = 0; a < r.blocks.size(); ++a)
      for (size_t b = a + 1; b < r.blocks.size(); ++b) {
        int64_t ea =
            layout.offsets[a] + std::max<int64_t>(r.blocks[a].bytes, 1);
        int64_t eb =
            layout.offsets[b] + std::max<int64_t>(r.blocks[b].bytes, 1);
        bool bytesOverlap = layout.offsets[a] < eb && layout.offsets[b] < ea;
        if (bytesOverlap)
          REQUIRE_FALSE(interfere(r.blocks[a], r.blocks[b], r.order));
      }
    int64_t sum = 0;
    for (const Block &b : r.blocks)
      sum += (std::max<int64_t>(b.bytes, 1) + 63) / 64 * 64;
    CHECK(layout.bytes >= liveBytesBound(r));
    CHECK(layout.bytes <= sum);
    // Moving a block onto one it interferes with is caught.
    for (size_t a = 0; a < r.blocks.size(); ++a) {
      size_t b = (a * 7 + 3) % r.blocks.size();
      if (a == b || r.blocks[a].bytes == 0 || r.blocks[b].bytes == 0 ||
          !interfere(r.blocks[a], r.blocks[b], r.order))
        continue;
      ArenaLayout bad = layout;
      bad.offsets[a] = bad.offsets[b];
      bad.bytes = std::max(bad.bytes, bad.offsets[a] + r.blocks[a].bytes);
      REQUIRE_FALSE(verifyLayout(r.blocks, bad, r.order, 64, error));
      CHECK(error.find("share bytes at offset") != std::string::npos);
      break;
    }
    // Equal inputs, equal layout.
    ArenaLayout again = packBlocks(r.blocks, r.order, 64);
    CHECK(again.offsets == layout.offsets);
    CHECK(again.bytes == layout.bytes);
  }
}

TEST_CASE("packBlocks: on one stream the arena is the live-bytes peak when "
          "sizes are equal") {
  // Equal 64-byte blocks with interval lifetimes: best fit over the freed
  // gaps reaches the lower bound exactly (interval graphs are perfect).
  std::mt19937 rng(11);
  Plan plan;
  for (int i = 0; i < 2000; ++i)
    add(plan, 0, Instruction::CALL);
  StreamOrder order;
  std::string error;
  REQUIRE(StreamOrder::build(plan, order, error));
  std::vector<Block> blocks;
  std::vector<int> liveAt(2000, 0);
  for (int b = 0; b < 20000; ++b) {
    int def = rng() % 2000, len = rng() % 30;
    int end = std::min(1999, def + len);
    blocks.push_back(block(64, {{0, def}, {0, end}}, "b" + std::to_string(b)));
    for (int i = def; i <= end; ++i)
      ++liveAt[i];
  }
  ArenaLayout layout = packBlocks(blocks, order, 64);
  REQUIRE(verifyLayout(blocks, layout, order, 64, error));
  CHECK(layout.bytes == 64 * *std::max_element(liveAt.begin(), liveAt.end()));
}

namespace {
/// findPeak's definition, instruction by instruction: the bytes of the
/// blocks that may be live at an instruction (defined at it or not after
/// it, and not every access before it), O(instructions * blocks).
std::pair<Pos, int64_t> bruteForcePeak(const RandomStep &r,
                                       bool callsOnly = false) {
  Pos at;
  int64_t best = 0;
  for (int s = 0; s < r.plan.streams_size(); ++s)
    for (int i = 0; i < r.plan.streams(s).instructions_size(); ++i) {
      Pos x{s, i};
      if (callsOnly &&
          r.plan.streams(s).instructions(i).kind() != Instruction::CALL)
        continue;
      int64_t live = 0;
      for (const Block &b : r.blocks) {
        if (b.accesses.empty())
          continue;
        const Pos &def = b.accesses.front();
        if (!(def == x) && r.order.happensBefore(x, def))
          continue;
        bool open = b.untilStepEnd;
        for (const Pos &a : b.accesses)
          open = open || a == x || !r.order.happensBefore(a, x);
        if (open)
          live += b.bytes;
      }
      if (live > best) {
        best = live;
        at = x;
      }
    }
  return {at, best};
}
} // namespace

TEST_CASE("findPeak: the sweep finds the instruction-by-instruction peak") {
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    int streams = 1 + rng() % 4;
    RandomStep r = randomStep(rng, streams, 10 + rng() % 60, rng() % 80);
    INFO("round " << round << ", " << streams << " streams, " << r.blocks.size()
                  << " blocks");
    for (bool callsOnly : {false, true}) {
      PeakPoint peak = findPeak(r.plan, r.order, r.blocks, callsOnly);
      auto [at, bytes] = bruteForcePeak(r, callsOnly);
      CHECK(peak.bytes == bytes);
      CHECK(peak.at == at);
      int64_t listed = 0;
      for (int b : peak.blocks)
        listed += r.blocks[b].bytes;
      CHECK(listed == bytes);
    }
  }
}

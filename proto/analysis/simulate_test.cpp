// Unit tests of the step-time simulator on hand-built plans: the cost
// formulas, rendezvous and collectives, events, overrides, the pipeline
// bubble against its analytical value, and deadlocks.
#include <catch2/catch.hpp>

#include "proto/analysis/Simulate.h"

using namespace piper::plan;
using Catch::Matchers::Contains;

namespace {

Instruction *add(Plan &plan, int stream, Instruction::Kind kind,
                 std::string label = "") {
  while (plan.streams_size() <= stream) {
    std::string name = "s" + std::to_string(plan.streams_size());
    plan.add_streams()->set_name(name);
  }
  Instruction *inst = plan.mutable_streams(stream)->add_instructions();
  inst->set_kind(kind);
  inst->set_label(label);
  return inst;
}

Plan newPlan(int deviceClass, std::vector<int> ranks, int world) {
  Plan plan;
  plan.set_device_class(deviceClass);
  for (int r : ranks)
    plan.add_ranks(r);
  plan.set_world_size(world);
  return plan;
}

int addGroup(Plan &plan, std::vector<int> ranks) {
  DeviceGroup *g = plan.add_groups();
  g->set_id(plan.groups_size() - 1);
  for (int r : ranks)
    g->add_ranks(r);
  return g->id();
}

int addSegment(Plan &plan, std::string name, double flops, double bytes) {
  Segment *s = plan.add_segments();
  s->set_name(name);
  s->set_flops(flops);
  s->set_bytes_moved(bytes);
  return plan.segments_size() - 1;
}

/// A float32 buffer of `elements` elements.
int addBuffer(Plan &plan, int64_t elements) {
  Buffer *b = plan.add_buffers();
  b->set_id(plan.buffers_size() - 1);
  b->mutable_type()->set_dtype(F32);
  b->mutable_type()->add_shape(elements);
  return b->id();
}

void addParam(Plan &plan, std::string name, int64_t elements) {
  Parameter *p = plan.add_params();
  p->set_name(name);
  p->mutable_type()->set_dtype(F32);
  p->mutable_type()->add_shape(elements);
}

Instruction *call(Plan &plan, int stream, int segment, std::string label) {
  Instruction *i = add(plan, stream, Instruction::CALL, label);
  i->set_segment(segment);
  return i;
}

Instruction *transfer(Plan &plan, int stream, bool send, int group, int tag,
                      int buffer, std::string label = "") {
  Instruction *i =
      add(plan, stream, send ? Instruction::SEND : Instruction::RECV, label);
  i->set_peer_group(group);
  i->set_tag(tag);
  if (send)
    i->add_inputs(buffer);
  else
    i->add_outputs(buffer);
  return i;
}

Simulation run(const std::vector<Plan> &plans, const Machine &m,
               SimulateOptions options = {}) {
  Simulation sim;
  std::string error;
  INFO(error);
  bool ok = simulate(plans, m, options, sim, error);
  INFO(error);
  REQUIRE(ok);
  return sim;
}

const TimelineEntry &entry(const ClassTime &ct, int stream, int inst) {
  for (const TimelineEntry &e : ct.timeline)
    if (e.stream == stream && e.inst == inst)
      return e;
  FAIL("no timeline entry");
  return ct.timeline.front();
}

/// A pipeline of `p` stages, one rank each, `m` microbatches, one stream
/// "pp" per stage holding the calls and the transfers, as the classic
/// schedules order them; then the world's CLIP_GRADS and the update.
std::vector<Plan> pipeline(int p, int m, bool oneFOneB) {
  std::vector<Plan> plans;
  for (int s = 0; s < p; ++s) {
    Plan plan = newPlan(s, {s}, p);
    int prev = s > 0 ? addGroup(plan, {s - 1}) : -1;
    int next = s + 1 < p ? addGroup(plan, {s + 1}) : -1;
    std::string st = "stage" + std::to_string(s);
    int f = addSegment(plan, st + "_F", 1e12, 0);
    int b = addSegment(plan, st + "_B", 2e12, 0);
    int u = addSegment(plan, st + "_U", 0, 1e9);
    int buf = addBuffer(plan, 1024);
    plan.add_streams()->set_name("pp");
    std::string tag = " PP=" + std::to_string(s) + " MB=";
    auto forward = [&](int j) {
      if (prev >= 0)
        transfer(plan, 0, false, prev, j, buf, "recv act");
      call(plan, 0, f, "F" + tag + std::to_string(j));
      if (next >= 0)
        transfer(plan, 0, true, next, j, buf, "send act");
    };
    auto backward = [&](int j) {
      if (next >= 0)
        transfer(plan, 0, false, next, 1000 + j, buf, "recv grad");
      call(plan, 0, b, "B" + tag + std::to_string(j));
      if (prev >= 0)
        transfer(plan, 0, true, prev, 1000 + j, buf, "send grad");
    };
    if (oneFOneB) {
      int warm = std::min(p - s - 1, m);
      for (int j = 0; j < warm; ++j)
        forward(j);
      for (int i = 0; i < m - warm; ++i) {
        forward(warm + i);
        backward(i);
      }
      for (int j = m - warm; j < m; ++j)
        backward(j);
    } else {
      for (int j = 0; j < m; ++j)
        forward(j);
      for (int j = 0; j < m; ++j)
        backward(j);
    }
    add(plan, 0, Instruction::CLIP_GRADS, "clip grads");
    call(plan, 0, u, "U" + tag.substr(0, tag.size() - 4));
    plans.push_back(plan);
  }
  return plans;
}

Machine freeMachine() {
  Machine m;
  m.flopsPerSecond = 1e12;
  m.memoryBytesPerSecond = 0; // free
  m.linkBytesPerSecond = 0;   // free
  m.linkLatencySeconds = 0;
  return m;
}

} // namespace

TEST_CASE("a CALL costs the roofline of its segment's flops and bytes") {
  Plan plan = newPlan(0, {0}, 1);
  int a = addSegment(plan, "a_F", 4e12, 1e9); // 10 ms compute, 1 ms memory
  int b = addSegment(plan, "b_F", 1e9, 3e9);  // memory bound: 3 ms
  call(plan, 0, a, "a");
  call(plan, 0, b, "b");
  Machine m;
  m.flopsPerSecond = 400e12;
  m.memoryBytesPerSecond = 1e12;
  Simulation sim = run({plan}, m);
  REQUIRE(sim.classes.size() == 1);
  const ClassTime &ct = sim.classes[0];
  CHECK(entry(ct, 0, 0).end == Approx(0.010));
  CHECK(entry(ct, 0, 1).start == Approx(0.010));
  CHECK(entry(ct, 0, 1).end == Approx(0.013));
  CHECK(ct.stepTime == Approx(0.013));
  CHECK(ct.computeBusy == Approx(0.013));
  CHECK(ct.bubbleFraction == Approx(0).margin(1e-12));
  CHECK(ct.streams[0].compute);
  CHECK(sim.stepTime == Approx(0.013));
}

TEST_CASE("a RECV completes at the later issue plus latency and bytes over "
          "bandwidth; the blocking SEND completes with it") {
  Plan p0 = newPlan(0, {0}, 2), p1 = newPlan(1, {1}, 2);
  int g0 = addGroup(p0, {1}), g1 = addGroup(p1, {0});
  int work = addSegment(p0, "w_F", 3e12, 0); // 3 s at 1 TFLOP/s
  int late = addSegment(p1, "l_F", 5e12, 0); // 5 s
  int b0 = addBuffer(p0, 250'000'000), b1 = addBuffer(p1, 250'000'000); // 1 GB
  call(p0, 0, work, "work");
  transfer(p0, 0, true, g0, 7, b0, "send");
  call(p1, 0, late, "late");
  transfer(p1, 0, false, g1, 7, b1, "recv");
  Machine m;
  m.flopsPerSecond = 1e12;
  m.linkBytesPerSecond = 1e9;
  m.linkLatencySeconds = 0.5;

  SimulateOptions blocking;
  blocking.blockingSends = true;
  Simulation sim = run({p0, p1}, m, blocking);
  const TimelineEntry &send = entry(sim.classes[0], 0, 1);
  const TimelineEntry &recv = entry(sim.classes[1], 0, 1);
  CHECK(send.issue == Approx(3));
  CHECK(recv.issue == Approx(5));
  CHECK(recv.start == Approx(5));
  CHECK(recv.end == Approx(5 + 0.5 + 1));
  CHECK(send.end == Approx(6.5));
  CHECK(sim.classes[0].stepTime == Approx(6.5));
  CHECK(sim.classes[0].streams[0].busy == Approx(3 + 1.5));
  // Class 0 computes 3 s of its 6.5 s step.
  CHECK(sim.classes[0].bubbleFraction == Approx(3.5 / 6.5));

  SECTION("an asynchronous send lets its stream go on") {
    call(p0, 0, work, "more work");
    Simulation a = run({p0, p1}, m);
    const TimelineEntry &more = entry(a.classes[0], 0, 2);
    CHECK(more.start == Approx(3));
    CHECK(more.end == Approx(6));
    CHECK(entry(a.classes[0], 0, 1).end == Approx(6.5));
    // The step waits for the send.
    CHECK(a.classes[0].stepTime == Approx(6.5));
    CHECK(a.classes[0].computeBusy == Approx(6));
  }

  SECTION("bf16 plans send packed bf16: half the bytes") {
    p0.mutable_training()->set_compute_dtype(BF16);
    p1.mutable_training()->set_compute_dtype(BF16);
    Simulation half = run({p0, p1}, m, blocking);
    CHECK(entry(half.classes[1], 0, 1).end == Approx(5 + 0.5 + 0.5));
  }

  SECTION("ranks of one node send over the node's link") {
    Machine nodes = m;
    nodes.nodeLinkBytesPerSecond = 4e9;
    nodes.nodeLinkLatencySeconds = 0.125;
    nodes.devicesPerNode = 2; // ranks 0 and 1 share node 0
    CHECK(entry(run({p0, p1}, nodes, blocking).classes[1], 0, 1).end ==
          Approx(5 + 0.125 + 0.25));
    nodes.devicesPerNode = 1; // each rank its own node
    CHECK(entry(run({p0, p1}, nodes, blocking).classes[1], 0, 1).end ==
          Approx(5 + 0.5 + 1));
  }
}

TEST_CASE("an all-reduce starts at the last member's arrival and costs a "
          "ring") {
  // Two classes of two replicas each, reducing one 1e9-byte gradient over
  // all four ranks (a tied weight), and each class's own 4e8 bytes over its
  // replicas.
  Plan p0 = newPlan(0, {0, 1}, 4), p1 = newPlan(1, {2, 3}, 4);
  for (Plan *p : {&p0, &p1}) {
    addParam(*p, "tied", 250'000'000);
    addParam(*p, "own", 100'000'000);
    addGroup(*p, {0, 1, 2, 3});
  }
  addGroup(p0, {0, 1});
  addGroup(p1, {2, 3});
  call(p0, 0, addSegment(p0, "x_B", 2e12, 0), "x");
  call(p1, 0, addSegment(p1, "y_B", 6e12, 0), "y");
  for (Plan *p : {&p0, &p1}) {
    Instruction *tied = add(*p, 0, Instruction::ALL_REDUCE, "all-reduce tied");
    tied->set_group(0);
    tied->add_params(0);
    Instruction *own = add(*p, 0, Instruction::ALL_REDUCE, "all-reduce own");
    own->set_group(1);
    own->add_params(1);
  }
  Machine m;
  m.flopsPerSecond = 1e12;
  m.linkBytesPerSecond = 1e9;
  m.linkLatencySeconds = 0.25;
  Simulation sim = run({p0, p1}, m);
  // The tied all-reduce: starts at 6 (class 1 arrives last), then two
  // ring passes, each a latency and 3/4 of 1 s: 2 * 0.25 + 2 * 3/4 * 1 s.
  for (const ClassTime &ct : sim.classes) {
    CHECK(entry(ct, 0, 1).start == Approx(6));
    CHECK(entry(ct, 0, 1).end == Approx(6 + 0.5 + 1.5));
    // The class's own: 2 * 0.25 + 2 * 1/2 * 0.4 s.
    CHECK(entry(ct, 0, 2).end == Approx(8 + 0.5 + 0.4));
    CHECK(ct.stepTime == Approx(8.9));
  }
  CHECK(entry(sim.classes[0], 0, 1).issue == Approx(2));
  CHECK(sim.classes[0].computeBusy == Approx(2));

  SECTION("a group inside one node runs on the node's link") {
    // Nodes {0, 1} and {2, 3}: the tied all-reduce crosses them and keeps
    // the link between nodes; each class's own runs inside its node:
    // 2 * 0.125 + 2 * 1/2 * 0.4e9 / 4e9 s.
    Machine nodes = m;
    nodes.devicesPerNode = 2;
    nodes.nodeLinkBytesPerSecond = 4e9;
    nodes.nodeLinkLatencySeconds = 0.125;
    Simulation n = run({p0, p1}, nodes);
    for (const ClassTime &ct : n.classes) {
      CHECK(entry(ct, 0, 1).end == Approx(6 + 0.5 + 1.5));
      CHECK(entry(ct, 0, 2).end == Approx(8 + 0.25 + 0.1));
    }
    // One node of four: the tied one too.
    nodes.devicesPerNode = 4;
    CHECK(entry(run({p0, p1}, nodes).classes[0], 0, 1).end ==
          Approx(6 + 2 * 0.125 + 2 * 0.75 * 0.25));
  }

  SECTION("a group of one rank costs nothing") {
    Plan solo = newPlan(0, {0}, 1);
    addParam(solo, "w", 1000);
    addGroup(solo, {0});
    Instruction *ar = add(solo, 0, Instruction::ALL_REDUCE, "all-reduce");
    ar->set_group(0);
    ar->add_params(0);
    CHECK(run({solo}, m).stepTime == 0);
  }
}

TEST_CASE("CLIP_GRADS synchronizes the world, then scales the gradients") {
  Plan p0 = newPlan(0, {0}, 2), p1 = newPlan(1, {1}, 2);
  addParam(p1, "w", 250'000'000); // 1 GB of gradients on class 1
  call(p0, 0, addSegment(p0, "a_B", 4e12, 0), "a");
  add(p0, 0, Instruction::CLIP_GRADS, "clip");
  add(p1, 0, Instruction::CLIP_GRADS, "clip");
  Machine m;
  m.flopsPerSecond = 1e12;
  m.memoryBytesPerSecond = 1e9;
  m.linkBytesPerSecond = 0; // free: only the latency
  m.linkLatencySeconds = 0.125;
  Simulation sim = run({p0, p1}, m);
  CHECK(entry(sim.classes[1], 0, 0).issue == Approx(0));
  CHECK(entry(sim.classes[1], 0, 0).start == Approx(4));
  // The norm's ring: two passes of one float, a latency each.
  CHECK(sim.classes[0].stepTime == Approx(4.25));
  CHECK(sim.classes[1].stepTime == Approx(4.25 + 2)); // reads and writes 1 GB
  CHECK(sim.stepTime == Approx(6.25));
  CHECK_FALSE(sim.classes[1].streams[0].compute);
}

/// Two streams of one device: stream 0 runs "first" (2e12 FLOPs), records
/// an event, runs "third" (2e12); stream 1 runs "side" (1e12), waits for
/// the event, runs "second" (1e12).
static Plan twoStreams() {
  Plan plan = newPlan(0, {0}, 1);
  int f = addSegment(plan, "a_F", 2e12, 0);
  int g = addSegment(plan, "b_F", 1e12, 0);
  call(plan, 0, f, "first");
  add(plan, 0, Instruction::RECORD, "after first")->set_event(0);
  call(plan, 0, f, "third");
  call(plan, 1, g, "side");
  add(plan, 1, Instruction::WAIT, "wait")->set_event(0);
  call(plan, 1, g, "second");
  plan.set_num_events(1);
  return plan;
}

TEST_CASE("events order the streams of one device; streams run "
          "concurrently") {
  Plan plan = twoStreams(); // "side" runs beside "first"
  Machine m;
  m.flopsPerSecond = 1e12;
  Simulation sim = run({plan}, m);
  const ClassTime &ct = sim.classes[0];
  CHECK(entry(ct, 1, 0).end == Approx(1));
  CHECK(entry(ct, 1, 1).start == Approx(2)); // the wait fires at the record
  CHECK(entry(ct, 1, 2).start == Approx(2));
  CHECK(entry(ct, 1, 2).end == Approx(3));
  CHECK(entry(ct, 0, 2).end == Approx(4));
  CHECK(ct.stepTime == Approx(4));
  // Calls cover [0, 4) without a gap; stream 1 is busy 2 of 4 s.
  CHECK(ct.computeBusy == Approx(4));
  CHECK(ct.streams[1].busy == Approx(2));
  CHECK(ct.streams[1].end == Approx(3));
}

TEST_CASE("with one compute engine per device, a device's CALLs run one at "
          "a time, in the order their streams reach them") {
  // "first" (2 s) and "side" (1 s) are ready at 0 (a tie goes to the lower
  // stream), "third" at 2, "second" once the event of 2 s has fired and
  // "side" has ended.
  Plan plan = twoStreams();
  Machine m;
  m.flopsPerSecond = 1e12;
  m.shareCompute = true;
  Simulation sim = run({plan}, m);
  const ClassTime &ct = sim.classes[0];
  CHECK(entry(ct, 0, 0).start == Approx(0));
  CHECK(entry(ct, 1, 0).start == Approx(2)); // after "first"
  CHECK(entry(ct, 1, 0).end == Approx(3));
  CHECK(entry(ct, 0, 2).start == Approx(3)); // ready at 2, after "side"
  CHECK(entry(ct, 1, 2).start == Approx(5)); // ready at 3, after "third"
  CHECK(ct.stepTime == Approx(6));           // the sum of the four calls
  CHECK(ct.computeBusy == Approx(6));
  // Devices do not share: two classes, each with one call, overlap.
  Plan a = newPlan(0, {0}, 2), b = newPlan(1, {1}, 2);
  call(a, 0, addSegment(a, "x_F", 1e12, 0), "x");
  call(b, 0, addSegment(b, "y_F", 1e12, 0), "y");
  Simulation two = run({a, b}, m);
  CHECK(two.stepTime == Approx(1));
}

TEST_CASE("when communication uses the compute engine, a collective's and "
          "a transfer's byte time delay the CALLs of their devices; their "
          "latency does not") {
  // Two devices (classes 0 and 1), each reducing a 1e9-byte gradient over
  // both on stream "ar" while stream "work" runs two 2 s CALLs; then class
  // 0 sends 1e9 bytes to class 1, which computes 2 s more after it.
  Plan p0 = newPlan(0, {0}, 2), p1 = newPlan(1, {1}, 2);
  for (Plan *p : {&p0, &p1}) {
    addParam(*p, "g", 250'000'000);
    addGroup(*p, {0, 1});
    Instruction *ar = add(*p, 0, Instruction::ALL_REDUCE, "all-reduce");
    ar->set_group(0);
    ar->add_params(0);
    int work = addSegment(*p, "w_B", 2e12, 0);
    call(*p, 1, work, "first");
    call(*p, 1, work, "second");
  }
  int peer0 = addGroup(p0, {1}), peer1 = addGroup(p1, {0});
  transfer(p0, 1, true, peer0, 3, addBuffer(p0, 250'000'000), "send");
  transfer(p1, 1, false, peer1, 3, addBuffer(p1, 250'000'000), "recv");
  call(p1, 1, addSegment(p1, "after_B", 2e12, 0), "after");
  Machine m;
  m.flopsPerSecond = 1e12;
  m.linkBytesPerSecond = 1e9;
  m.linkLatencySeconds = 0.25;
  m.shareCompute = true;
  // The all-reduce: two latencies and two passes of half the bytes, [0,
  // 1.5]. Its byte time is 1 s, the transfer's 1 s, and their latencies
  // 0.5 s and 0.25 s.
  Simulation apart = run({p0, p1}, m);
  CHECK(entry(apart.classes[0], 0, 0).end == Approx(1.5));
  // The send at 4: [4, 5.25]; "after" at 5.25.
  CHECK(apart.classes[0].stepTime == Approx(5.25));
  CHECK(apart.classes[1].stepTime == Approx(7.25));
  m.commUsesCompute = true;
  Simulation shared = run({p0, p1}, m);
  // Each engine also spends the all-reduce's 1 s: the two CALLs end at 5,
  // not 4; the transfer then takes both engines 1 s: class 1's last CALL
  // starts at 6.25 (the transfer's end) and ends at 8.25; the collective
  // itself is not slowed.
  CHECK(entry(shared.classes[0], 0, 0).end == Approx(1.5));
  CHECK(entry(shared.classes[0], 1, 1).end == Approx(5));
  CHECK(entry(shared.classes[1], 1, 1).end == Approx(5));
  CHECK(entry(shared.classes[1], 1, 3).start == Approx(6.25));
  CHECK(shared.classes[1].stepTime == Approx(8.25));
  // Latency alone takes nothing from the engines.
  m.linkBytesPerSecond = 0;
  Simulation latency = run({p0, p1}, m);
  CHECK(entry(latency.classes[0], 1, 1).end == Approx(4));
  CHECK(latency.classes[1].stepTime == Approx(4.25 + 2));
}

TEST_CASE("overrides fix durations by pass, then by the longest label "
          "prefix") {
  Plan plan = newPlan(0, {0}, 1);
  int f = addSegment(plan, "stage0_F", 1e15, 0);
  int b = addSegment(plan, "stage0_B", 1e15, 0);
  int u = addSegment(plan, "stage0_U", 1e15, 0);
  call(plan, 0, f, "F PP=0 MB=0");
  call(plan, 0, b, "B PP=0 MB=0");
  call(plan, 0, u, "U PP=0");
  add(plan, 0, Instruction::LOAD_BATCH, "batch MB=1");
  Machine m;
  SimulateOptions o;
  o.overrides = {{"F", 1}, {"B", 2}, {"U PP", 0.5}, {"U", 9}, {"batch", 0.25}};
  Simulation sim = run({plan}, m, o);
  const ClassTime &ct = sim.classes[0];
  CHECK(entry(ct, 0, 0).end == Approx(1));
  CHECK(entry(ct, 0, 1).end == Approx(3));
  // The pass "U" matches first.
  CHECK(entry(ct, 0, 2).end == Approx(3 + 9));
  CHECK(entry(ct, 0, 3).end == Approx(12.25));
  o.overrides.erase("U");
  CHECK(entry(run({plan}, m, o).classes[0], 0, 2).end == Approx(3.5));
  CHECK(segmentPass("stage0_BW") == "BW");
  CHECK(segmentPass("loss") == "");
}

TEST_CASE("a pipeline's bubble is (p - 1)(F + B) per device under GPipe "
          "and 1F1B") {
  auto [p, m] = GENERATE(std::make_pair(4, 8), std::make_pair(2, 4),
                         std::make_pair(3, 1), std::make_pair(4, 2));
  bool oneFOneB = GENERATE(false, true);
  bool blocking = GENERATE(false, true);
  if (oneFOneB && blocking && p > 1 && m > 1)
    return; // one stream with blocking sends: see the deadlock test
  auto [fwd, bwd] =
      GENERATE(std::make_pair(1.0, 2.0), std::make_pair(1.0, 1.0));
  CAPTURE(p, m, oneFOneB, blocking, fwd, bwd);
  SimulateOptions o;
  o.blockingSends = blocking;
  o.overrides = {{"F", fwd}, {"B", bwd}, {"U", 0}};
  Simulation sim = run(pipeline(p, m, oneFOneB), freeMachine(), o);
  REQUIRE(int(sim.classes.size()) == p);
  double step = (m + p - 1) * (fwd + bwd);
  for (const ClassTime &ct : sim.classes) {
    CAPTURE(ct.deviceClass);
    CHECK(ct.stepTime == Approx(step));
    CHECK(ct.computeBusy == Approx(m * (fwd + bwd)));
    CHECK(ct.stepTime - ct.computeBusy == Approx((p - 1) * (fwd + bwd)));
    CHECK(ct.bubbleFraction == Approx(double(p - 1) / (m + p - 1)));
  }
  // Stage 0's last backward ends the pipeline.
  const ClassTime &first = sim.classes[0];
  double lastB = 0;
  for (const TimelineEntry &e : first.timeline)
    if (e.label.rfind("B ", 0) == 0)
      lastB = std::max(lastB, e.end);
  CHECK(lastB == Approx(step));
}

TEST_CASE("the machine's rates give the pipeline's time without "
          "overrides") {
  // F = 1e12 flops, B = 2e12 at 1 TFLOP/s; U moves 1 GB at 1 GB/s.
  Machine m = freeMachine();
  m.memoryBytesPerSecond = 1e9;
  Simulation sim = run(pipeline(4, 8, false), m);
  for (const ClassTime &ct : sim.classes)
    CHECK(ct.stepTime == Approx(11 * 3 + 1));
}

TEST_CASE("1F1B on one stream with blocking sends deadlocks, and the error "
          "names the blocked instructions") {
  Simulation sim;
  std::string error;
  SimulateOptions o;
  o.blockingSends = true;
  REQUIRE_FALSE(simulate(pipeline(2, 2, true), freeMachine(), o, sim, error));
  CHECK_THAT(error, Contains("the plans cannot finish the step (deadlock): "
                             "class 0, stream 'pp', instruction 3 (send act) "
                             "waits for its RECV (tag 1, class 1), stream "
                             "'pp', instruction 4 (recv act), not reached; "
                             "class 1, stream 'pp', instruction 3 (send grad) "
                             "waits for its RECV (tag 1000, class 0), stream "
                             "'pp', instruction 4 (recv grad), not reached"));
}

TEST_CASE("what a blocked stream waits for is named") {
  Simulation sim;
  std::string error;
  Machine m;

  SECTION("an event nobody records") {
    Plan plan = newPlan(0, {0}, 1);
    add(plan, 0, Instruction::WAIT, "wait for x")->set_event(0);
    plan.set_num_events(1);
    REQUIRE_FALSE(simulate({plan}, m, {}, sim, error));
    CHECK(error == "the plans cannot finish the step (deadlock): class 0, "
                   "stream 's0', instruction 0 (wait for x) waits for event "
                   "0, which no instruction records");
  }
  SECTION("a blocking SEND no one receives") {
    Plan p0 = newPlan(0, {0}, 2), p1 = newPlan(1, {1}, 2);
    transfer(p0, 0, true, addGroup(p0, {1}), 3, addBuffer(p0, 4), "send x");
    SimulateOptions o;
    o.blockingSends = true;
    REQUIRE_FALSE(simulate({p0, p1}, m, o, sim, error));
    CHECK(error == "the plans cannot finish the step (deadlock): class 0, "
                   "stream 's0', instruction 0 (send x) waits for its RECV "
                   "(tag 3, class 1), which class 1 never issues on a stream "
                   "named 's0'");
  }
  SECTION("a RECV no one sends") {
    Plan p0 = newPlan(0, {0}, 2), p1 = newPlan(1, {1}, 2);
    transfer(p0, 0, false, addGroup(p0, {1}), 3, addBuffer(p0, 4), "recv x");
    REQUIRE_FALSE(simulate({p0, p1}, m, {}, sim, error));
    CHECK(error == "the plans cannot finish the step (deadlock): class 0, "
                   "stream 's0', instruction 0 (recv x) waits for its SEND "
                   "(tag 3, class 1), which class 1 never issues on a stream "
                   "named 's0'");
  }
  SECTION("a collective a member never reaches") {
    Plan p0 = newPlan(0, {0}, 2), p1 = newPlan(1, {1}, 2);
    add(p0, 0, Instruction::CLIP_GRADS, "clip");
    add(p1, 0, Instruction::WAIT, "stuck")->set_event(0);
    p1.set_num_events(1);
    REQUIRE_FALSE(simulate({p0, p1}, m, {}, sim, error));
    CHECK_THAT(error, Contains("class 0, stream 's0', instruction 0 (clip) "
                               "waits for the world's CLIP_GRADS, which "
                               "class(es) 1 have not reached"));
  }
  SECTION("an asynchronous send no one receives") {
    Plan p0 = newPlan(0, {0}, 2), p1 = newPlan(1, {1}, 2);
    transfer(p0, 0, true, addGroup(p0, {1}), 3, addBuffer(p0, 4), "send x");
    REQUIRE_FALSE(simulate({p0, p1}, m, {}, sim, error));
    CHECK(error == "class 0, stream 's0', instruction 0 (send x): SEND tag 3 "
                   "to class 1 is never received (no RECV of that tag on a "
                   "stream named 's0')");
  }
  SECTION("an instruction it cannot simulate") {
    Plan plan = newPlan(0, {0}, 1);
    add(plan, 0, static_cast<Instruction::Kind>(8), "reserved");
    REQUIRE_FALSE(simulate({plan}, m, {}, sim, error));
    CHECK(error == "class 0, stream 's0', instruction 0 (reserved): cannot "
                   "simulate instruction kind 8");
  }
}

TEST_CASE("the report prints step, bubble and the timeline") {
  SimulateOptions o;
  o.overrides = {{"F", 1}, {"B", 2}, {"U", 0}};
  Simulation sim = run(pipeline(2, 2, false), freeMachine(), o);
  std::string text = simulationReport(sim, true);
  CHECK_THAT(text, Contains("machine: compute 1 TFLOP/s, memory free, link "
                            "free + 0 s latency\n"));
  CHECK_THAT(text, Contains("class 0 ranks [0]: step 9 s, compute busy 6 s, "
                            "bubble 33.33% (3 s), 3 s idle between its first "
                            "and last segment\n"));
  // Stage 1 starts late (the fill) but never waits once it has started.
  CHECK(sim.classes[0].spanIdle == 3);
  CHECK(sim.classes[1].spanIdle == 0);
  CHECK_THAT(text,
             Contains("  stream 0 'pp': busy 6 s (66.67%), ends at 9 s\n"));
  CHECK_THAT(text, Contains("    0 s .. 1 s  stream 0 #0 CALL F PP=0 MB=0\n"));
  CHECK_THAT(text, Contains("step: 9 s (the slowest class)\n"));
  CHECK(formatSeconds(0.0015) == "1.5 ms");
  CHECK(formatSeconds(12.25e-6) == "12.25 us");
  CHECK(formatSeconds(3e-9) == "3 ns");
}

TEST_CASE("the compile report simulates on the default machine, or says "
          "why it cannot") {
  Plan plan = newPlan(0, {0}, 1);
  call(plan, 0, addSegment(plan, "stage0_F", 400e12 * 0.002, 0), "F");
  CHECK(predictedStepReport({plan}) ==
        "predicted step 2 ms on the default machine (docs/simulator.md; "
        "piper-plan --simulate shows the timeline)\n"
        "  class 0: step 2 ms, compute busy 2 ms, bubble 0.00%\n");
  add(plan, 0, Instruction::WAIT, "stuck")->set_event(0);
  plan.set_num_events(1);
  CHECK(predictedStepReport({plan}) ==
        "predicted step: not simulated: the plans cannot finish the step "
        "(deadlock): class 0, stream 's0', instruction 1 (stuck) waits for "
        "event 0, which no instruction records\n");
}

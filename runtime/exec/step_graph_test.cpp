// Steps as graphs (ExecutorOptions::stepGraphs, docs/runtime.md "Steps as
// graphs") on the emulated GPU, whose capture records the device work a
// step issues and whose launch runs that record again
// (runtime/hal/gpu/host/HostCapture.h): a replayed step must give the bits
// of the step issued as usual.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "runtime/exec/Data.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/Validate.h"
#include "runtime/exec/test_plans.h"
#include "runtime/formats/Safetensors.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"

using namespace piper;
using namespace piper::runtime;
using namespace piper::runtime::testplans;
using plan::Operand;
using Graphs = ExecutorOptions::StepGraphs;

namespace {

/// `plan` with a warmup and a cosine decay (the update's constants change
/// every step), clipping and bf16 or fp32.
plan::Plan withGraphTraining(plan::Plan plan, bool bf16) {
  plan::TrainingConfig *t = plan.mutable_training();
  t->set_warmup_steps(3);
  t->set_decay_steps(9);
  t->set_min_lr(t->lr() / 10);
  t->set_clip_grad_norm(0.5);
  addClipBeforeUpdate(plan);
  if (bf16)
    t->set_compute_dtype(plan::BF16);
  withArena(plan);
  return plan;
}

/// The bigram plan with two streams (LOAD_BATCH on its own, the compute
/// stream waiting on an event per microbatch, so the capture has edges
/// between streams), four microbatches, withGraphTraining.
plan::Plan graphPlan(bool bf16) {
  TinyModel m;
  return withGraphTraining(singleClassPlan(m, 4, {0}, 1, /*twoStreams=*/true),
                           bf16);
}

ExecutorOptions emulated(Graphs graphs) {
  ExecutorOptions opts;
  opts.seed = 3;
  opts.stepGraphs = graphs;
  opts.createDevice = [](Communicator *comm) {
    return hal::createEmulatedGpuDevice(comm);
  };
  return opts;
}

struct Run {
  std::vector<double> losses, norms;
  std::vector<int64_t> syncs; // synchronizing calls per step
  std::vector<std::vector<float>> params;
  int64_t captured = 0, replayed = 0;
};

std::vector<std::vector<float>> paramsOf(const Executor &exec, int count) {
  std::vector<std::vector<float>> params(count);
  for (int p = 0; p < count; ++p)
    REQUIRE(exec.stateToHost(p, Operand::PARAM, params[p]));
  return params;
}

void runSteps(Executor &exec, const std::vector<int64_t> &steps, Run &run) {
  for (int64_t t : steps) {
    INFO("step " << t);
    const int64_t before = hal::emulatedSyncCalls();
    double loss = 0;
    Status st = exec.runStep(t, loss);
    INFO(st.message());
    REQUIRE(st);
    run.syncs.push_back(hal::emulatedSyncCalls() - before);
    run.losses.push_back(loss);
    run.norms.push_back(exec.lastGradNorm());
  }
}

Run train(const plan::Plan &plan, Graphs graphs,
          const std::vector<int64_t> &steps) {
  Status status;
  auto exec = Executor::create(plan, emulated(graphs), status);
  INFO(status.message());
  REQUIRE(exec);
  Run run;
  runSteps(*exec, steps, run);
  run.params = paramsOf(*exec, plan.params_size());
  run.captured = exec->capturedSteps();
  run.replayed = exec->replayedSteps();
  return run;
}

/// The graph plan's model data parallel over two ranks (2 microbatches
/// each): its step all-reduces the gradients and sums the squared norm over
/// the ranks, both between kernels on the device.
plan::Plan dataParallelPlan(bool bf16) {
  TinyModel m;
  return withGraphTraining(
      singleClassPlan(m, 2, {0, 1}, 2, /*twoStreams=*/true), bf16);
}

/// Lets the main thread read the process's synchronizing calls between the
/// ranks' steps: every rank stops at `pause()` until release().
class Rendezvous {
public:
  explicit Rendezvous(int ranks) : ranks(ranks) {}
  void pause() {
    std::unique_lock<std::mutex> lock(mu);
    ++arrived;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
  }
  /// Waits until every rank has paused (or `timeout`); false on timeout.
  bool allPaused(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return arrived == ranks; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    cv.notify_all();
  }

private:
  int ranks;
  int arrived = 0;
  bool released = false;
  std::mutex mu;
  std::condition_variable cv;
};

struct RankRun {
  Status status;
  Run run;
};

/// Runs `plan` on rank `rank` of two, on the emulated GPU with a Gloo
/// communicator met through `store`: steps 1 to `pauseAfter`, a pause at
/// `meet`, then steps up to `last`. Returns on the first error (in
/// `out.status`); no Catch2 assertion here (the ranks are threads).
void trainRank(
    const plan::Plan &plan, int rank, Graphs graphs, const std::string &store,
    int64_t pauseAfter, int64_t last, Rendezvous &meet, RankRun &out,
    std::function<std::unique_ptr<hal::Device>(Communicator *)> device) {
  bool paused = false;
  auto pause = [&] {
    if (!paused)
      meet.pause();
    paused = true;
  };
  Status st;
  auto comm = createGlooCommunicator(rank, plan.world_size(), store,
                                     std::chrono::milliseconds(10000), st);
  std::unique_ptr<Executor> exec;
  if (comm) {
    ExecutorOptions opts = emulated(graphs);
    if (device)
      opts.createDevice = device;
    opts.rank = rank;
    opts.comm = comm.get();
    exec = Executor::create(plan, opts, st);
    if (exec)
      st = exec->connect();
  }
  for (int64_t t = 1; st && t <= last; ++t) {
    if (t == pauseAfter + 1)
      pause();
    double loss = 0;
    st = exec->runStep(t, loss);
    out.run.losses.push_back(loss);
    out.run.norms.push_back(exec->lastGradNorm());
  }
  pause(); // never leave the others waiting
  if (st) {
    out.run.params.resize(size_t(plan.params_size()));
    for (int p = 0; st && p < plan.params_size(); ++p)
      st = exec->stateToHost(p, Operand::PARAM, out.run.params[size_t(p)]);
    out.run.captured = exec->capturedSteps();
    out.run.replayed = exec->replayedSteps();
  }
  out.status = st;
}

std::string storeDir(const std::string &name) {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name + "-XXXXXX";
  REQUIRE(::mkdtemp(dir.data()));
  return dir;
}

} // namespace

// Step 1 runs as usual, steps 2 and 3 are captured (one per half of the
// batch staging) and every later step launches the capture of its parity:
// the losses, gradient norms and parameters are those of every step issued
// as usual, bit for bit, also across skipped step numbers (a launch with
// the other parity's capture would read the other half's batches, and one
// without its step's constants would update with the captured step's lr
// and bias corrections: both change the numbers). A replayed step
// synchronizes only at its end, as a step issued as usual does.
TEST_CASE("step graphs: replayed steps give the bits of steps issued as "
          "usual",
          "[step-graph]") {
  const std::vector<int64_t> steps = {1, 2, 3, 4, 6, 7, 8, 11, 12};
  for (bool bf16 : {false, true}) {
    INFO((bf16 ? "bf16" : "fp32"));
    plan::Plan plan = graphPlan(bf16);
    REQUIRE(validatePlan(plan));
    Run usual = train(plan, Graphs::Off, steps);
    Run graphed = train(plan, Graphs::On, steps);
    CHECK(usual.captured == 0);
    CHECK(usual.replayed == 0);
    CHECK(graphed.captured == 2);
    CHECK(graphed.replayed == int64_t(steps.size()) - 3);
    CHECK(graphed.losses == usual.losses);
    CHECK(graphed.norms == usual.norms);
    CHECK(graphed.params == usual.params);
    for (size_t i = 3; i < steps.size(); ++i) {
      INFO("step " << steps[i]);
      CHECK(graphed.syncs[i] == usual.syncs[i]);
      CHECK(graphed.syncs[i] == plan.streams_size() + 2);
    }
  }
}

// Loading state makes the next step refresh the bf16 copies (host code a
// capture would not repeat): the captures are dropped, the next step runs
// as usual and the two after it are captured again. (The checkpoint is of
// step 3, so a launch that kept step 5's copies would compute with other
// weights.)
TEST_CASE("step graphs: loading a checkpoint drops the captures",
          "[step-graph]") {
  plan::Plan plan = graphPlan(/*bf16=*/true);
  const char *tmp = std::getenv("TEST_TMPDIR");
  const std::string path =
      std::string(tmp ? tmp : "/tmp") + "/step-graph-checkpoint.safetensors";
  {
    Status status;
    auto saver = Executor::create(plan, emulated(Graphs::Off), status);
    REQUIRE(saver);
    Run run;
    runSteps(*saver, {1, 2, 3}, run);
    REQUIRE(saver->saveCheckpoint(path, 3));
  }
  Run runs[2];
  for (bool graphs : {false, true}) {
    Status status;
    auto exec = Executor::create(
        plan, emulated(graphs ? Graphs::On : Graphs::Off), status);
    INFO(status.message());
    REQUIRE(exec);
    runSteps(*exec, {1, 2, 3, 4, 5}, runs[graphs]);
    Status st;
    auto reader = SafetensorsReader::open(path, st);
    INFO(st.message());
    REQUIRE(reader);
    REQUIRE(exec->loadCheckpoint(*reader));
    runSteps(*exec, {6, 7, 8, 9}, runs[graphs]);
    runs[graphs].params = paramsOf(*exec, plan.params_size());
    runs[graphs].captured = exec->capturedSteps();
    runs[graphs].replayed = exec->replayedSteps();
  }
  CHECK(runs[1].captured == 4); // steps 2, 3, then 7, 8
  CHECK(runs[1].replayed == 3); // steps 4, 5, then 9
  CHECK(runs[1].losses == runs[0].losses);
  CHECK(runs[1].params == runs[0].params);
  std::remove(path.c_str());
}

TEST_CASE("step graphs: where steps cannot be captured, on is refused at "
          "load and auto runs them as usual, saying why",
          "[step-graph]") {
  plan::Plan plan = graphPlan(/*bf16=*/false);
  struct Case {
    const char *what;
    bool cpu, profile;
    std::string why;
  } cases[] = {
      {"the cpu device", true, false, "the cpu backend does not capture steps"},
      {"--profile", false, true,
       "--profile times each instruction as the host issues it"},
  };
  for (const Case &c : cases) {
    INFO(c.what);
    for (Graphs graphs : {Graphs::On, Graphs::Auto}) {
      ExecutorOptions opts = emulated(graphs);
      if (c.cpu)
        opts.createDevice = nullptr; // the CPU device
      opts.profile = c.profile;
      Status status;
      auto exec = Executor::create(plan, opts, status);
      if (graphs == Graphs::On) {
        CHECK_FALSE(exec);
        CHECK(status.message() ==
              "rank 0: steps cannot run as graphs (--step-graph on): " + c.why);
        continue;
      }
      INFO(status.message());
      REQUIRE(exec);
      CHECK(exec->stepGraphRefusal() == c.why);
      Run run;
      runSteps(*exec, {1, 2, 3, 4}, run);
      CHECK(exec->capturedSteps() == 0);
      CHECK(exec->replayedSteps() == 0);
    }
  }
  Status off;
  auto plain = Executor::create(plan, emulated(Graphs::Off), off);
  REQUIRE(plain);
  CHECK(plain->stepGraphRefusal() == "off");
}

// A device error beginning or ending a capture, or launching one, fails the
// step, naming the step and the way to run without graphs; the executor
// then refuses to run on (as after any failed step).
TEST_CASE("step graphs: a device error capturing or launching a step fails "
          "it, named",
          "[step-graph]") {
  plan::Plan plan = graphPlan(/*bf16=*/false);
  struct Case {
    const char *operation;
    int64_t failingStep;
    std::string context;
  } cases[] = {
      {"beginning a step capture", 2, "rank 0: capturing step 2"},
      {"instantiating a captured step", 3, "rank 0: capturing step 3"},
      {"launching a captured step", 4,
       "rank 0: launching the capture of step 4"},
  };
  for (const Case &c : cases) {
    INFO(c.operation);
    Status status;
    auto exec = Executor::create(plan, emulated(Graphs::On), status);
    REQUIRE(exec);
    for (int64_t t = 1; t < c.failingStep; ++t) {
      double loss = 0;
      REQUIRE(exec->runStep(t, loss));
    }
    hal::injectEmulatedDeviceError(c.operation);
    double loss = 0;
    Status failed = exec->runStep(c.failingStep, loss);
    REQUIRE_FALSE(failed);
    CHECK(failed.message() ==
          c.context + " (piper-run --step-graph off runs steps as usual): " +
              c.operation +
              ": emulated device error (PIPER_FAULT action=device_error)");
    Status after = exec->runStep(c.failingStep + 1, loss);
    CHECK(after.message() ==
          "rank 0: the executor cannot run after a failed step");
  }
}

// An asynchronous device error found when a launched step's streams are
// synchronized fails it as in a step issued as usual, saying that the
// kernel a CUDA error names is the last one issued at capture.
TEST_CASE("step graphs: an asynchronous device error at the end of a "
          "launched step says it was launched",
          "[step-graph]") {
  plan::Plan plan = graphPlan(/*bf16=*/false);
  for (bool graphs : {false, true}) {
    INFO((graphs ? "graphs" : "as usual"));
    Status status;
    auto exec = Executor::create(
        plan, emulated(graphs ? Graphs::On : Graphs::Off), status);
    REQUIRE(exec);
    double loss = 0;
    for (int64_t t = 1; t <= 3; ++t)
      REQUIRE(exec->runStep(t, loss));
    hal::injectEmulatedDeviceError("synchronizing the stream");
    Status failed = exec->runStep(4, loss);
    const std::string what =
        "synchronizing the stream: emulated device error (PIPER_FAULT "
        "action=device_error)";
    CHECK(failed.message() ==
          "rank 0, stream 'compute', end of step" +
              std::string(graphs ? " (launched from its capture: the kernel "
                                   "named last was issued when it was "
                                   "captured; piper-run --step-graph off "
                                   "names the one issued last)"
                                 : "") +
              ": " + what);
  }
}

// The emulated device's capture itself: work issued on a capturing stream
// is kept, not run; each launch runs it (on the memory it was issued on),
// and an event's signal and wait order the streams' work in every launch;
// a copy that would make the host wait for the device is an error; a
// capture cannot begin twice or end before it begins.
TEST_CASE("step graphs: the emulated capture keeps work and runs it at each "
          "launch",
          "[step-graph]") {
  auto device = hal::createEmulatedGpuDevice(nullptr);
  REQUIRE(device->stepCaptureRefusal().empty());
  std::unique_ptr<hal::Stream> first, second;
  REQUIRE(device->createStream("first", first));
  REQUIRE(device->createStream("second", second));
  std::unique_ptr<hal::Event> ready;
  REQUIRE(device->createEvent(ready));
  std::vector<float> x(64, 1.0f), y(64, 0.0f);
  std::unique_ptr<hal::StepGraph> graph;
  CHECK(device->endStepCapture(graph).message() ==
        "ending a step capture: none is under way");
  REQUIRE(device->beginStepCapture({first.get(), second.get()}));
  CHECK(device->beginStepCapture({first.get()}).message() ==
        "beginning a step capture: one is under way");
  // first: x += x, then signal; second: wait, then y += x. Without the
  // edge, second's add could read x before first's doubles it.
  std::atomic<bool> abort{false};
  Status firstDone, secondDone, copied, read;
  std::unique_ptr<hal::SquareSums> sums;
  REQUIRE(device->createSquareSums(1, sums));
  first->enqueue([&] {
    firstDone = device->add(x.data(), x.data(), 64);
    if (firstDone)
      firstDone = ready->signal(1);
  });
  second->enqueue([&] {
    secondDone = ready->wait(1, abort);
    if (secondDone)
      secondDone = device->add(y.data(), x.data(), 64);
    float host = 0;
    copied = device->allocator().copyToHost(&host, y.data(), 4);
    double sum = 0; // the kernel layer's synchronizing copy
    read = sums->read(&sum, 1);
  });
  REQUIRE(first->synchronize());
  REQUIRE(second->synchronize());
  REQUIRE(firstDone);
  REQUIRE(secondDone);
  CHECK(copied.message() ==
        "a synchronizing copy of 4 bytes to the host while the stream "
        "captures a step (the host cannot wait for captured work)");
  CHECK(read.message() ==
        "copying 8 bytes of device memory to the host while the stream "
        "captures a step (the host cannot wait for captured work)");
  REQUIRE(device->endStepCapture(graph));
  REQUIRE(graph);
  CHECK(x[0] == 1.0f); // nothing ran
  CHECK(y[0] == 0.0f);
  for (float want : {2.0f, 4.0f}) {
    hal::StepValues values;
    REQUIRE(graph->launch(values));
    REQUIRE(first->synchronize());
    REQUIRE(second->synchronize());
    CHECK(x[63] == want);
  }
  CHECK(y[63] == 2.0f + 4.0f);
}

namespace {
/// Synthetic data that fails from step `from` on.
class DataFailingFrom : public DataSource {
public:
  DataFailingFrom(int64_t from, int64_t vocab) : from(from), data(3, vocab) {}
  Status fill(int64_t step, int64_t g, int64_t batch, int64_t seqLen,
              int32_t *tokens, int32_t *targets) override {
    if (step >= from)
      return Status::error("token file is unreadable at step " +
                           std::to_string(step));
    return data.fill(step, g, batch, seqLen, tokens, targets);
  }

private:
  int64_t from;
  SyntheticData data;
};
} // namespace

// A batch that cannot be loaded fails its step as it fails a step issued as
// usual, with the same message, whether the step is being captured (its
// LOAD_BATCH fails as the host issues it) or launched from a capture (the
// fills are checked before the launch).
TEST_CASE("step graphs: a batch that cannot be loaded fails a captured or "
          "launched step as it fails a step issued as usual",
          "[step-graph]") {
  plan::Plan plan = graphPlan(/*bf16=*/false);
  for (int64_t failing : {3, 5}) {
    INFO("failing at step " << failing);
    std::string messages[2];
    int callbacks[2] = {0, 0};
    for (bool graphs : {false, true}) {
      DataFailingFrom data(failing, plan.training().vocab_size());
      ExecutorOptions opts = emulated(graphs ? Graphs::On : Graphs::Off);
      opts.data = &data;
      opts.onStreamError = [&](const Status &) { ++callbacks[graphs]; };
      Status status;
      auto exec = Executor::create(plan, opts, status);
      REQUIRE(exec);
      for (int64_t t = 1; t < failing; ++t) {
        double loss = 0;
        REQUIRE(exec->runStep(t, loss));
      }
      double loss = 0;
      Status failed = exec->runStep(failing, loss);
      REQUIRE_FALSE(failed);
      messages[graphs] = failed.message();
    }
    CHECK(messages[1] == messages[0]);
    CHECK(messages[0] == "rank 0, stream 'data', instruction 0 (load MB=0): "
                         "token file is unreadable at step " +
                             std::to_string(failing));
    CHECK(callbacks[1] == callbacks[0]);
  }
}

// A step of two data-parallel ranks is captured with its operations between
// the ranks (the gradients' all-reduce and the norm's sum, which the
// emulated communicator records among the kernels, as NCCL's are captured
// on CUDA) and replayed: every rank's losses, norms and parameters are
// those of the steps issued as usual, bit for bit, and a launched step
// synchronizes only at its end (the streams and the two reads after it:
// an operation waited for on the host in a launched step would add one).
TEST_CASE("step graphs: a step of two data-parallel ranks is captured with "
          "its collectives",
          "[step-graph]") {
  const int64_t last = 8;
  for (bool bf16 : {false, true}) {
    INFO((bf16 ? "bf16" : "fp32"));
    plan::Plan plan = dataParallelPlan(bf16);
    REQUIRE(validatePlan(plan));
    RankRun runs[2][2]; // [graphs][rank]
    for (bool graphs : {false, true}) {
      INFO((graphs ? "graphs" : "as usual"));
      Rendezvous meet(2);
      const std::string store = storeDir("step-graph-dp");
      std::vector<std::thread> ranks;
      for (int r = 0; r < 2; ++r)
        ranks.emplace_back(trainRank, std::cref(plan), r,
                           graphs ? Graphs::On : Graphs::Off, store, 3, last,
                           std::ref(meet), std::ref(runs[graphs][r]), nullptr);
      const bool paused = meet.allPaused(std::chrono::seconds(120));
      const int64_t before = hal::emulatedSyncCalls();
      meet.release();
      for (std::thread &t : ranks)
        t.join();
      const int64_t syncs = hal::emulatedSyncCalls() - before;
      REQUIRE(paused);
      for (int r = 0; r < 2; ++r) {
        INFO("rank " << r << ": " << runs[graphs][r].status.message());
        REQUIRE(runs[graphs][r].status);
      }
      if (graphs) {
        // Steps 4 to 8 launched on both ranks, then each rank's parameters
        // read (a copy each).
        CHECK(syncs == 2 * ((last - 3) * (plan.streams_size() + 2) +
                            plan.params_size()));
      }
    }
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      const Run &usual = runs[0][r].run, &graphed = runs[1][r].run;
      CHECK(usual.captured == 0);
      CHECK(graphed.captured == 2);
      CHECK(graphed.replayed == last - 3);
      CHECK(graphed.losses == usual.losses);
      CHECK(graphed.norms == usual.norms);
      CHECK(graphed.params == usual.params);
    }
    // The replicas agree.
    CHECK(runs[1][0].run.params == runs[1][1].run.params);
    CHECK(runs[1][0].run.losses == runs[1][1].run.losses);
  }
}

// A rank that leaves after step 4: its peer's launched step 5 finds its
// replayed all-reduce failed, skips the step's later operations between
// ranks (no wait for a timeout per operation) and fails the step at its
// end, saying it was launched; nothing hangs.
TEST_CASE("step graphs: a peer lost in a launched step fails it at its end",
          "[step-graph]") {
  plan::Plan plan = dataParallelPlan(/*bf16=*/false);
  Rendezvous meet(2);
  const std::string store = storeDir("step-graph-lost");
  RankRun runs[2];
  std::thread leaver(trainRank, std::cref(plan), 1, Graphs::On, store, 4, 4,
                     std::ref(meet), std::ref(runs[1]), nullptr);
  std::thread stayer(trainRank, std::cref(plan), 0, Graphs::On, store, 4, 6,
                     std::ref(meet), std::ref(runs[0]), nullptr);
  REQUIRE(meet.allPaused(std::chrono::seconds(120)));
  meet.release();
  leaver.join();
  stayer.join();
  INFO(runs[1].status.message());
  REQUIRE(runs[1].status);
  const std::string failed = runs[0].status.message();
  INFO(failed);
  CHECK_FALSE(runs[0].status);
  CHECK(runs[0].run.losses.size() == 5); // step 5 failed
  CHECK(failed.find("rank 0, stream 'compute', end of step (launched from "
                    "its capture") != std::string::npos);
  CHECK(failed.find("rank 0: all-reduce over ranks [0,1] on stream 'compute' "
                    "failed") != std::string::npos);
}

// The emulated communicator records an operation issued while its stream
// captures, and its completion where the work is waited for on that
// stream; a work waited for anywhere else (here: after the capture ended)
// is an internal error, not a silent host wait on work that never ran.
TEST_CASE("step graphs: a captured operation is waited for in its capture "
          "only",
          "[step-graph]") {
  Status made;
  auto gloo = createGlooCommunicator(0, 1, storeDir("step-graph-wait"),
                                     std::chrono::milliseconds(1000), made);
  INFO(made.message());
  REQUIRE(gloo);
  auto device = hal::createEmulatedGpuDevice(gloo.get());
  Communicator *comm = device->communicator();
  REQUIRE(comm);
  CHECK(comm->stepCaptureRefusal().empty());
  std::unique_ptr<hal::Stream> stream;
  REQUIRE(device->createStream("s", stream));
  REQUIRE(device->beginStepCapture({stream.get()}));
  std::vector<float> data(4, 1.0f);
  CommWorkPtr work;
  stream->enqueue([&] {
    work = comm->allReduce(CommKey{"s", {0}}, data.data(), data.size(),
                           CommDType::F32);
  });
  REQUIRE(stream->synchronize());
  std::unique_ptr<hal::StepGraph> graph;
  REQUIRE(device->endStepCapture(graph));
  REQUIRE(work);
  CHECK(work->wait().message() ==
        "internal error: all-reduce over s[0] was captured with a step, and "
        "its completion is waited for outside that stream's capture");
}

namespace {

/// The two data-parallel ranks' bigram plan (vocabulary 2, one microbatch)
/// with an all-to-all of the embeddings' 16 rows between them after the
/// forward, its counts from moe_ep_counts over the tokens (2 experts of
/// capacity 4, one per rank: at most 4 rows to each member, within the 8
/// a captured step moves per member, and 8 received, within its output's
/// 12 rows). Its output is not read.
plan::Plan allToAllPlan() {
  TinyModel m;
  m.vocab = 2;
  plan::Plan plan = singleClassPlan(m, 1, {0, 1}, 2);
  const auto tok = tensorType(plan::I32, {m.batch, m.seqLen});
  const auto two = tensorType(plan::I32, {2});
  const auto perExpert = tensorType(plan::I32, {2, 1});
  const auto rows12 = tensorType(plan::F32, {12, m.hidden});
  plan::Segment *counts =
      addSegment(plan, "counts", {tok, two, perExpert, two}, {0}, {1, 2, 3});
  plan::Kernel *k = addKernel(counts, "moe_ep_counts", {value(0)},
                              {value(1), value(2), value(3)});
  setAttrInt(k, "experts", 2);
  setAttrInt(k, "capacity", 4);
  setAttrInt(k, "members", 2);
  const int countsSegment = plan.segments_size() - 1;
  const int send = addBuffer(plan, two, "send counts"),
            experts = addBuffer(plan, perExpert, "expert counts"),
            expertSend = addBuffer(plan, two, "expert send counts"),
            exchanged = addBuffer(plan, rows12, "exchanged"),
            received = addBuffer(plan, two, "received counts");
  // After the forward (LOAD_BATCH, CALL F, ...): the counts, then the
  // exchange of F's x (its first output).
  plan::Stream *compute = plan.mutable_streams(0);
  std::vector<plan::Instruction> insts(compute->instructions().begin(),
                                       compute->instructions().end());
  compute->clear_instructions();
  for (size_t i = 0; i < insts.size(); ++i) {
    *compute->add_instructions() = insts[i];
    if (i != 1)
      continue;
    const int tokens = insts[0].outputs(0), x = insts[1].outputs(0);
    addInst(compute, plan::Instruction::CALL, "counts", {tokens},
            {send, experts, expertSend})
        ->set_segment(countsSegment);
    plan::Instruction *a2a =
        addInst(compute, plan::Instruction::ALL_TO_ALL, "exchange", {x, send},
                {exchanged, received});
    a2a->set_group(0);
  }
  withArena(plan);
  return plan;
}

/// The emulated GPU, whose `packRowBlocks` call `badCall` (1 = the first)
/// is given counts {9, 0} instead of the step's (9 rows for member 0,
/// above its block of 8), or with `onReceive` whose unpackRowBlocks call
/// `badCall` is given received counts {8, 8} (16 rows, past the output's
/// 12).
class BadCountsDevice : public hal::Device {
public:
  BadCountsDevice(Communicator *comm, int badCall, bool onReceive)
      : inner(hal::createEmulatedGpuDevice(comm)), badCall(badCall),
        onReceive(onReceive) {
    void *p = nullptr;
    const int32_t counts[2] = {onReceive ? 8 : 9, onReceive ? 8 : 0};
    if (inner->allocator().allocate(sizeof counts, p) &&
        inner->allocator().copyFromHost(p, counts, sizeof counts))
      bad = static_cast<int32_t *>(p);
  }
  ~BadCountsDevice() override {
    if (bad)
      inner->allocator().deallocate(bad, 2 * sizeof(int32_t));
  }
  std::string name() const override { return inner->name(); }
  hal::Allocator &allocator() override { return inner->allocator(); }
  Status createStream(const std::string &name,
                      std::unique_ptr<hal::Stream> &stream) override {
    return inner->createStream(name, stream);
  }
  Status createEvent(std::unique_ptr<hal::Event> &event) override {
    return inner->createEvent(event);
  }
  const KernelInfo *findKernel(const std::string &name) const override {
    return inner->findKernel(name);
  }
  std::vector<std::string> kernelNames() const override {
    return inner->kernelNames();
  }
  Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                   const KernelAttrs &attrs,
                   const std::vector<TensorRef> &inputs,
                   const std::vector<TensorRef> &outputs,
                   KernelContext &ctx) override {
    return inner->runKernel(info, kernel, attrs, inputs, outputs, ctx);
  }
  Status prepareKernel(const KernelInfo &info, const plan::Kernel &kernel,
                       const KernelAttrs &attrs,
                       const std::vector<TensorRef> &inputs,
                       const std::vector<TensorRef> &outputs,
                       KernelContext &ctx) override {
    return inner->prepareKernel(info, kernel, attrs, inputs, outputs, ctx);
  }
  bool roundsOutputs(const KernelInfo &info) const override {
    return inner->roundsOutputs(info);
  }
  bool readsPackedInput(const KernelInfo &info, int input) const override {
    return inner->readsPackedInput(info, input);
  }
  bool writesPackedOutput(const KernelInfo &info, int output) const override {
    return inner->writesPackedOutput(info, output);
  }
  Status runAdamwCalls(const KernelInfo &info,
                       const std::vector<AdamwCall> &calls, KernelContext &ctx,
                       size_t &failed) override {
    return inner->runAdamwCalls(info, calls, ctx, failed);
  }
  Status createSquareSums(int slots,
                          std::unique_ptr<hal::SquareSums> &sums) override {
    return inner->createSquareSums(slots, sums);
  }
  Status createLossSums(int slots,
                        std::unique_ptr<hal::LossSums> &sums) override {
    return inner->createLossSums(slots, sums);
  }
  Status add(float *dst, const float *src, int64_t n) override {
    return inner->add(dst, src, n);
  }
  Status packBf16(uint16_t *dst, const float *src, int64_t n) override {
    return inner->packBf16(dst, src, n);
  }
  Status unpackBf16(float *dst, const uint16_t *src, int64_t n) override {
    return inner->unpackBf16(dst, src, n);
  }
  Status roundBf16(float *x, int64_t n) override {
    return inner->roundBf16(x, n);
  }
  Status packRowBlocks(const hal::RowBlocks &shape, const void *input,
                       const int32_t *counts, void *blocks, int32_t *sent,
                       int32_t *fault) override {
    ++packs;
    return inner->packRowBlocks(shape, input,
                                !onReceive && packs == badCall ? bad : counts,
                                blocks, sent, fault);
  }
  Status unpackRowBlocks(const hal::RowBlocks &shape, const void *blocks,
                         const int32_t *received, void *output,
                         int32_t *fault) override {
    ++unpacks;
    return inner->unpackRowBlocks(
        shape, blocks, onReceive && unpacks == badCall ? bad : received, output,
        fault);
  }
  Communicator *communicator() override { return inner->communicator(); }
  std::string stepCaptureRefusal() const override {
    return inner->stepCaptureRefusal();
  }
  Status beginStepCapture(const std::vector<hal::Stream *> &streams) override {
    return inner->beginStepCapture(streams);
  }
  Status endStepCapture(std::unique_ptr<hal::StepGraph> &graph) override {
    return inner->endStepCapture(graph);
  }

private:
  std::unique_ptr<hal::Device> inner;
  int badCall, packs = 0, unpacks = 0;
  bool onReceive;
  int32_t *bad = nullptr;
};

} // namespace

// Where steps are captured an all-to-all moves its rows through blocks of
// a fixed size, its counts on the device (Collectives.cpp): two ranks'
// losses, norms and parameters are those of the steps issued as usual, bit
// for bit. Counts above the block, here given to rank 1's exchange when
// step 3 is captured (and launched), fail that step on both ranks at its
// end, each saying why, without a hang: rank 1 names its counts, rank 0
// the invalid counts it received; and received counts past the output,
// given to rank 0's, fail it on rank 0, naming them, and on rank 1, which
// learns it from the step's world sum. The earlier steps' numbers are
// those of the usual run.
TEST_CASE("step graphs: an all-to-all is captured with its counts on the "
          "device, and counts that do not fit fail the step on every rank",
          "[step-graph]") {
  plan::Plan plan = allToAllPlan();
  {
    INFO(validatePlan(plan).message());
    REQUIRE(validatePlan(plan));
  }
  const int64_t last = 7;
  // [as usual, graphs, bad send counts, bad received counts][rank]
  RankRun runs[4][2];
  for (int mode = 0; mode < 4; ++mode) {
    INFO("mode " << mode);
    Rendezvous meet(2);
    const std::string store = storeDir("step-graph-a2a");
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      std::function<std::unique_ptr<hal::Device>(Communicator *)> device;
      if ((mode == 2 && r == 1) || (mode == 3 && r == 0))
        device = [mode](Communicator *comm) {
          return std::make_unique<BadCountsDevice>(comm, 3, mode == 3);
        };
      ranks.emplace_back(trainRank, std::cref(plan), r,
                         mode == 0 ? Graphs::Off : Graphs::On, store, last,
                         last, std::ref(meet), std::ref(runs[mode][r]), device);
    }
    REQUIRE(meet.allPaused(std::chrono::seconds(120)));
    meet.release();
    for (std::thread &t : ranks)
      t.join();
  }
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << runs[0][r].status.message() << " / "
                 << runs[1][r].status.message());
    REQUIRE(runs[0][r].status);
    REQUIRE(runs[1][r].status);
    const Run &usual = runs[0][r].run, &graphed = runs[1][r].run;
    CHECK(graphed.captured == 2);
    CHECK(graphed.replayed == last - 3);
    CHECK(graphed.losses.size() == size_t(last));
    CHECK(graphed.losses == usual.losses);
    CHECK(graphed.norms == usual.norms);
    CHECK(graphed.params == usual.params);
  }
  const std::string what =
      ": all-to-all over ranks [0, 1] on stream 'compute': ";
  const std::string failed[2] = {runs[2][0].status.message(),
                                 runs[2][1].status.message()},
                    overflow[2] = {runs[3][0].status.message(),
                                   runs[3][1].status.message()};
  INFO(failed[0] << "\n"
                 << failed[1] << "\n"
                 << overflow[0] << "\n"
                 << overflow[1]);
  for (int mode : {2, 3})
    for (int r = 0; r < 2; ++r) {
      CHECK_FALSE(runs[mode][r].status);
      // Steps 1 and 2 ran; step 3 failed at its end.
      REQUIRE(runs[mode][r].run.losses.size() == 3);
      CHECK(std::vector<double>(runs[mode][r].run.losses.begin(),
                                runs[mode][r].run.losses.begin() + 2) ==
            std::vector<double>(runs[0][r].run.losses.begin(),
                                runs[0][r].run.losses.begin() + 2));
    }
  CHECK(failed[1].rfind("rank 1, stream 'compute', instruction 3", 0) == 0);
  CHECK(failed[1].find(", step 3" + what +
                       "a row count is negative or above the 8 rows a "
                       "captured step moves per member (the input's 16 rows "
                       "over 2 members; piper-run --step-graph off moves any "
                       "counts)") != std::string::npos);
  CHECK(failed[0].rfind("rank 0, stream 'compute', instruction 3", 0) == 0);
  CHECK(failed[0].find(", step 3" + what +
                       "a member sent invalid counts (its own error says "
                       "why)") != std::string::npos);
  CHECK(overflow[0].rfind("rank 0, stream 'compute', instruction 3", 0) == 0);
  CHECK(overflow[0].find(", step 3" + what +
                         "it receives more rows than the 12 of its "
                         "output") != std::string::npos);
  CHECK(overflow[1] == "rank 1, end of step 3: another rank's all-to-all "
                       "failed (its own error says why)");
}

// Multi-process executor tests over Gloo: a 2-stage pipeline and 2-way data
// parallelism must compute the single-rank training run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "runtime/exec/Executor.h"
#include "runtime/exec/test_plans.h"

using namespace piper;
using namespace piper::runtime;
using namespace piper::runtime::testplans;

namespace {

std::string tempDir(const std::string &name) {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/" + name + "-XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()));
  return tmpl;
}

/// What one rank reports: its losses and the final parameters it holds.
struct RankResult {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
};

/// Runs `plans[c]` on each of its ranks in a forked child, `steps` steps,
/// and reads back every rank's result. Children report through files and
/// their exit status; the parent kills them after `timeout`.
std::vector<RankResult>
runRanks(const std::vector<plan::Plan> &plans, int steps, uint64_t seed,
         std::chrono::seconds timeout = std::chrono::seconds(60)) {
  int world = plans.at(0).world_size();
  std::string dir = tempDir("multirank");
  std::string store = dir + "/store";
  REQUIRE(::mkdir(store.c_str(), 0755) == 0);
  std::fflush(nullptr);

  std::vector<pid_t> pids;
  for (const plan::Plan &p : plans) {
    for (int rank : p.ranks()) {
      pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid != 0) {
        pids.push_back(pid);
        continue;
      }
      // Child: report errors on stderr and through the exit code.
      Status st;
      auto comm = createGlooCommunicator(rank, world, store,
                                         std::chrono::milliseconds(20000), st);
      if (!comm) {
        std::fprintf(stderr, "rank %d: %s\n", rank, st.message().c_str());
        ::_exit(2);
      }
      ExecutorOptions opts;
      opts.rank = rank;
      opts.seed = seed;
      opts.comm = comm.get();
      auto exec = Executor::create(p, opts, st);
      if (!exec || !(st = exec->connect())) {
        std::fprintf(stderr, "%s\n", st.message().c_str());
        ::_exit(3);
      }
      std::ofstream out(dir + "/rank" + std::to_string(rank) + ".txt");
      out.precision(17);
      for (int t = 1; t <= steps; ++t) {
        double loss = 0;
        st = exec->runStep(t, loss);
        if (!st) {
          std::fprintf(stderr, "%s\n", st.message().c_str());
          ::_exit(4);
        }
        out << loss << "\n";
      }
      // The one arena of the plan's memory plan is all the executor holds.
      if (exec->peakBytes() != p.arena_bytes()) {
        std::fprintf(stderr, "rank %d: peak %lld bytes, arena_bytes %lld\n",
                     rank, static_cast<long long>(exec->peakBytes()),
                     static_cast<long long>(p.arena_bytes()));
        ::_exit(6);
      }
      for (int i = 0; i < p.params_size(); ++i) {
        TensorRef t = exec->state(i, plan::Operand::PARAM);
        out << "param " << t.numel();
        for (int64_t k = 0; k < t.numel(); ++k)
          out << " " << t.f32()[k];
        out << "\n";
      }
      out.close();
      ::_exit(out ? 0 : 5);
    }
  }

  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> statuses(pids.size(), -1);
  size_t done = 0;
  while (done < pids.size() && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (statuses[i] != -1)
        continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        statuses[i] = status;
        ++done;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (statuses[i] == -1) {
      ::kill(pids[i], SIGKILL);
      ::waitpid(pids[i], &statuses[i], 0);
      FAIL("a rank did not finish within the timeout");
    }
    INFO("child " << i << " status " << statuses[i]);
    REQUIRE(WIFEXITED(statuses[i]));
    REQUIRE(WEXITSTATUS(statuses[i]) == 0);
  }

  std::vector<RankResult> results(world);
  for (int r = 0; r < world; ++r) {
    std::ifstream in(dir + "/rank" + std::to_string(r) + ".txt");
    REQUIRE(in);
    for (int t = 0; t < steps; ++t) {
      double loss;
      in >> loss;
      results[r].losses.push_back(loss);
    }
    std::string word;
    while (in >> word) {
      REQUIRE(word == "param");
      int64_t n;
      in >> n;
      std::vector<float> v(n);
      for (float &x : v)
        in >> x;
      results[r].params.push_back(std::move(v));
    }
  }
  return results;
}

/// The single-rank run of the same model, in this process.
RankResult runSingle(const plan::Plan &plan, int steps, uint64_t seed) {
  ExecutorOptions opts;
  opts.seed = seed;
  Status st;
  auto exec = Executor::create(plan, opts, st);
  INFO(st.message());
  REQUIRE(exec);
  RankResult result;
  for (int t = 1; t <= steps; ++t) {
    double loss = 0;
    REQUIRE(exec->runStep(t, loss));
    result.losses.push_back(loss);
  }
  for (int i = 0; i < plan.params_size(); ++i) {
    TensorRef t = exec->state(i, plan::Operand::PARAM);
    result.params.emplace_back(t.f32(), t.f32() + t.numel());
  }
  return result;
}

void checkClose(const std::vector<float> &a, const std::vector<float> &b,
                double tol) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  INFO("max abs difference " << worst);
  CHECK(worst <= tol);
}

} // namespace

TEST_CASE("a 2-stage pipeline computes the single-rank run", "[multirank]") {
  TinyModel m;
  const int steps = 4, mb = 3;
  uint64_t seed = 21;
  std::vector<RankResult> ranks = runRanks(pipelinePlans(m, mb), steps, seed);
  RankResult single = runSingle(singleClassPlan(m, mb, {0}, 1), steps, seed);
  for (int t = 0; t < steps; ++t) {
    // The same kernels in the same order: the loss is the same to the bit
    // or very nearly.
    CHECK(ranks[0].losses[t] == ranks[1].losses[t]);
    CHECK(ranks[0].losses[t] == Approx(single.losses[t]).epsilon(1e-7));
  }
  CHECK(single.losses.back() < single.losses.front());
  checkClose(ranks[0].params.at(0), single.params.at(0), 1e-6); // wte
  checkClose(ranks[1].params.at(0), single.params.at(1), 1e-6); // head
}

TEST_CASE("2-way data parallelism computes the single-rank run",
          "[multirank]") {
  TinyModel m;
  const int steps = 4;
  uint64_t seed = 5;
  // Two replicas of 2 microbatches see global microbatches 0..3, like one
  // rank with 4.
  std::vector<RankResult> ranks =
      runRanks({singleClassPlan(m, 2, {0, 1}, 2)}, steps, seed);
  RankResult single = runSingle(singleClassPlan(m, 4, {0}, 1), steps, seed);
  for (int t = 0; t < steps; ++t) {
    CHECK(ranks[0].losses[t] == ranks[1].losses[t]);
    CHECK(ranks[0].losses[t] == Approx(single.losses[t]).epsilon(1e-6));
  }
  for (int p = 0; p < 2; ++p) {
    // Replicas stay identical; the gradient sum differs from the single run
    // only in the order of additions.
    CHECK(ranks[0].params[p] == ranks[1].params[p]);
    checkClose(ranks[0].params[p], single.params[p], 1e-5);
  }
}

TEST_CASE("context parallelism: members split each sequence and sum their "
          "gradients, as one rank computes", "[multirank]") {
  TinyModel m;
  const int steps = 3;
  uint64_t seed = 9;
  // CP2 x DP2 on 4 ranks: ranks 0, 1 split global microbatches 0 and 1,
  // ranks 2, 3 microbatches 2 and 3, like one rank with 4 (and CP4 alone,
  // each member 2 chunks of 1 token).
  RankResult single = runSingle(singleClassPlan(m, 4, {0}, 1), steps, seed);
  for (auto [cp, mb] : {std::pair{2, 2}, std::pair{4, 4}}) {
    CAPTURE(cp);
    std::vector<RankResult> ranks = runRanks(
        {contextParallelPlan(m, mb, {0, 1, 2, 3}, 4, cp)}, steps, seed);
    for (int t = 0; t < steps; ++t)
      for (const RankResult &r : ranks)
        CHECK(r.losses[t] == Approx(single.losses[t]).epsilon(1e-6));
    for (int p = 0; p < 2; ++p)
      for (const RankResult &r : ranks) {
        CHECK(r.params[p] == ranks[0].params[p]);
        checkClose(r.params[p], single.params[p], 1e-5);
      }
  }
}

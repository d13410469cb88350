// End-to-end tests of piper-run with bad inputs a new user tries: each is a
// clear error before any step, never a hang, a silent success or a file
// left behind.
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <tuple>

#include <unistd.h>

#include "runtime/launch/launcher_test_util.h"

using namespace piper;
using namespace piper::launchertest;

namespace {

/// A checkpoint of TinyModel's parameters whose metadata says `step`.
std::string checkpointAt(const std::string &dir, const std::string &step) {
  static std::vector<float> wte(16 * 8, 0.1f), head(8 * 16, 0.2f);
  std::string path = dir + "/step-" + step + ".safetensors";
  REQUIRE(runtime::writeSafetensors(path,
                                    {{"wte", "F32", {16, 8}, wte.data()},
                                     {"head", "F32", {8, 16}, head.data()}},
                                    {{"format", "pt"}, {"step", step}}));
  return path;
}

/// Whether `dir` holds a file whose name contains `needle`.
bool holdsFileWith(const std::string &dir, const std::string &needle) {
  for (const auto &e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find(needle) != std::string::npos)
      return true;
  return false;
}

} // namespace

TEST_CASE("piper-run: a checkpoint step near 2^63 is an error, not 0 steps",
          "[launcher][inputs]") {
  TinyModel m;
  std::string out = strategy({singleClassPlan(m, 2, {0}, 1)}, "bigstep");
  std::string dir = tempDir("bigstep");
  std::string path = checkpointAt(dir, "9223372036854775807");
  RunResult r = piperRun({out, "--nproc", "1", "--steps", "3", "--load", path});
  CHECK(r.exitCode() == 1);
  CHECK(r.err == "piper-run: checkpoint '" + path +
                     "': its step 9223372036854775807 plus --steps 3 is past "
                     "the largest step number, 9223372036854775807\n");
  CHECK(r.out.empty());
  // Ranks started by another launcher check it too.
  RunResult rank = piperRun({out, "--steps", "1", "--load", path},
                            {"RANK=0", "WORLD_SIZE=1"});
  CHECK(rank.exitCode() == 1);
  CHECK(rank.err.find("is past the largest step number") != std::string::npos);
  // Even for no steps: the step after it has no number.
  CHECK(piperRun({out, "--nproc", "1", "--steps", "0", "--load", path})
            .exitCode() == 1);
  // One below: loading it for no steps is fine, one step is not.
  std::string below = checkpointAt(dir, "9223372036854775806");
  RunResult none =
      piperRun({out, "--nproc", "1", "--steps", "0", "--load", below});
  INFO("stderr: " << none.err);
  CHECK(none.exitCode() == 0);
  CHECK(piperRun({out, "--nproc", "1", "--steps", "1", "--load", below})
            .exitCode() == 1);
}

TEST_CASE("piper-run never replaces a device, and checks every output before "
          "the first step",
          "[launcher][inputs]") {
  TinyModel m;
  std::string out = strategy(pipelinePlans(m, 2), "outputs");
  std::string dir = tempDir("outputs");
  auto fails = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {out, "--nproc", "2", "--steps", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = piperRun(args);
    INFO("stderr: " << r.err);
    CHECK(r.exitCode() != 0);
    // Before the first step, not after the last.
    CHECK(r.out.find("step 1") == std::string::npos);
    return r.err;
  };

  struct stat before;
  REQUIRE(::stat("/dev/null", &before) == 0);
  CHECK(fails({"--save", "/dev/null"}) ==
        "piper-run: --save '/dev/null': exists and is not a regular file (a "
        "device or a FIFO?); refusing to replace it\n");
  struct stat after;
  REQUIRE(::stat("/dev/null", &after) == 0);
  CHECK(S_ISCHR(after.st_mode));
  CHECK(fails({"--save-grads", dir}) ==
        "piper-run: --save-grads '" + dir + "': is a directory\n");

  // A folder that cannot be made (a file is in the way): --save, --metrics,
  // --log-dir and --save-params all fail before any rank trains.
  std::string blocker = dir + "/file";
  std::ofstream(blocker) << "x";
  CHECK(fails({"--save", blocker + "/c.safetensors"}) ==
        "piper-run: --save '" + blocker + "/c.safetensors': '" + blocker +
            "' is not a directory\n");
  CHECK(fails({"--metrics", blocker + "/m.jsonl"}) ==
        "piper-run: --metrics '" + blocker + "/m.jsonl': '" + blocker +
            "' is not a directory\n");
  CHECK(fails({"--log-dir", blocker + "/logs"}) ==
        "piper-run: --log-dir '" + blocker +
            "/logs': cannot create directory '" + blocker +
            "/logs': not a directory\n");
  CHECK(fails({"--save-params", blocker}) == "piper-run: --save-params '" +
                                                 blocker + "': '" + blocker +
                                                 "' is not a directory\n");

  // An empty name (an unset shell variable) is not "no file".
  for (const char *flag : {"--save", "--save-grads", "--metrics", "--log-dir",
                           "--save-params", "--load", "--data"}) {
    RunResult r = piperRun({out, "--nproc", "2", flag, ""});
    CHECK(r.exitCode() == 2);
    CHECK(r.err ==
          std::string("piper-run: ") + flag + " needs a file name, not ''\n");
  }
  RunResult zero = piperRun({out, "--nproc", "0"});
  CHECK(zero.exitCode() == 2);
  CHECK(zero.err == "piper-run: --nproc must be at least 1, not 0\n");
  RunResult never = piperRun({out, "--nproc", "2", "--log-every", "0"});
  CHECK(never.exitCode() == 2);
  CHECK(never.err == "piper-run: --log-every must be at least 1, not 0\n");
}

TEST_CASE("piper-run refuses FIFOs and devices as inputs instead of hanging",
          "[launcher][inputs]") {
  TinyModel m;
  std::string out = strategy(pipelinePlans(m, 2), "fifos");
  std::string dir = tempDir("fifos");
  std::string fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  auto fails = [&](const std::string &strategyDir,
                   std::vector<std::string> extra) {
    std::vector<std::string> args = {strategyDir, "--nproc", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = piperRun(args, {}, std::chrono::seconds(20));
    INFO("stderr: " << r.err);
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.exitCode() == 1);
    return r.err;
  };
  CHECK(fails(out, {"--load", fifo}) ==
        "piper-run: checkpoint '" + fifo + "': is not a regular file\n");
  CHECK(fails(out, {"--load", "/dev/zero"}) ==
        "piper-run: checkpoint '/dev/zero': is not a regular file\n");
  CHECK(fails(out, {"--data", fifo}) ==
        "piper-run: token file '" + fifo + "': is not a regular file\n");
  CHECK(fails(out, {"--data", "/dev/zero"}) ==
        "piper-run: token file '/dev/zero': is not a regular file\n");

  // The manifest and a plan file.
  std::filesystem::remove(out + "/class1.plan");
  REQUIRE(::mkfifo((out + "/class1.plan").c_str(), 0644) == 0);
  CHECK(fails(out, {}) == "piper-run: plan file '" + out +
                              "/class1.plan': is not a regular file\n");
  std::filesystem::remove(out + "/manifest.textproto");
  std::filesystem::create_symlink("/dev/zero", out + "/manifest.textproto");
  CHECK(fails(out, {}) == "piper-run: manifest '" + out +
                              "/manifest.textproto': is not a regular file\n");
}

TEST_CASE("piper-run: a world size of 0 is an error", "[launcher][inputs]") {
  TinyModel m;
  std::string out = strategy({singleClassPlan(m, 2, {0}, 1)}, "world0");
  RunResult a = piperRun({out}, {"PIPER_RANK=0", "PIPER_WORLD_SIZE=0"});
  CHECK(a.exitCode() == 1);
  CHECK(a.err ==
        "piper-run: PIPER_WORLD_SIZE must be a positive number of ranks, not "
        "0\n");
  RunResult b = piperRun({out}, {"RANK=0", "WORLD_SIZE=0"});
  CHECK(b.exitCode() == 1);
  CHECK(b.err ==
        "piper-run: WORLD_SIZE must be a positive number of ranks, not 0\n");
}

TEST_CASE("piper-run --save leaves no temporary files or parts behind",
          "[launcher][inputs][checkpoint]") {
  // Parts of 16 MiB per class: large enough to catch the write in progress.
  TinyModel m;
  m.vocab = 4096;
  m.hidden = 1024;
  std::string out = strategy(pipelinePlans(m, 1), "leftovers");
  std::string dir = tempDir("leftovers");
  std::string path = dir + "/c.safetensors";

  SECTION("stopped with SIGTERM while it writes") {
    // The launcher and its ranks in one process group: the test signals the
    // launcher as a user's ^C or a scheduler would.
    std::string runDir = tempDir("sigterm");
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, STDOUT_FILENO);
      ::dup2(devnull, STDERR_FILENO);
      ::execl(kPiperRun, kPiperRun, out.c_str(), "--nproc", "2", "--steps", "1",
              "--save", path.c_str(), nullptr);
      ::_exit(127);
    }
    // Signal as soon as a part or a temporary file exists (or, at worst,
    // whenever the run ends).
    auto start = std::chrono::steady_clock::now();
    int status = 0;
    bool signalled = false;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (!signalled &&
          (holdsFileWith(dir, ".part") || holdsFileWith(dir, ".tmp-"))) {
        ::kill(pid, SIGTERM);
        signalled = true;
      }
      REQUIRE(std::chrono::steady_clock::now() - start <
              std::chrono::seconds(60));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    INFO("signalled: " << signalled);
    CHECK_FALSE(holdsFileWith(dir, ".part"));
    CHECK_FALSE(holdsFileWith(dir, ".tmp-"));
    if (signalled)
      CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
  }
  SECTION("a failed run removes what a killed rank left") {
    // What a rank killed by SIGKILL in the middle of --save leaves.
    std::ofstream(path + ".class1.part") << "half";
    std::ofstream(path + ".tmp-AbC123") << "half";
    std::ofstream(path + ".class0.part.tmp-XyZ789") << "half";
    std::ofstream(dir + "/other.tmp-keepme") << "not ours";
    RunResult r =
        piperRun({out, "--nproc", "2", "--steps", "3", "--save", path},
                 {"PIPER_TEST_FAIL_RANK=1", "PIPER_TEST_FAIL_STEP=2"});
    CHECK(r.exitCode() == 1);
    CHECK_FALSE(holdsFileWith(dir, ".part"));
    CHECK_FALSE(holdsFileWith(dir, "c.safetensors"));
    CHECK(readFile(dir + "/other.tmp-keepme") == "not ours");
  }
}

TEST_CASE("piper-run: a manifest whose training config disagrees with its "
          "plans is an error before any rank starts",
          "[launcher][inputs]") {
  TinyModel m;
  std::string out = strategy(pipelinePlans(m, 2), "training");
  std::string manifestPath = out + "/manifest.textproto";
  plan::Manifest good;
  REQUIRE(plan::readManifest(manifestPath, good) == "");
  // Rewrites the manifest with `edit` applied; returns piper-run's stderr.
  auto failsWith = [&](const std::function<void(plan::TrainingConfig &)> &edit,
                       const std::vector<std::string> &env = {}) {
    plan::Manifest bad = good;
    edit(*bad.mutable_training());
    REQUIRE(plan::writeManifest(manifestPath, bad) == "");
    RunResult r = piperRun({out, "--nproc", "2", "--steps", "1"}, env);
    CHECK(r.exitCode() == 1);
    CHECK(r.out.empty());
    return r.err;
  };
  std::string prefix = "piper-run: manifest '" + manifestPath +
                       "' disagrees with its plans: training.";
  std::string class0 = "plan file '" + out + "/class0.plan' (device class 0)";
  CHECK(failsWith([](plan::TrainingConfig &t) { t.set_lr(0.01); }) ==
        prefix + "lr is 0.01 in the manifest but 0.05 in " + class0 + "\n");
  CHECK(failsWith([](plan::TrainingConfig &t) { t.set_seq_len(16); }) ==
        prefix + "seq_len is 16 in the manifest but 8 in " + class0 + "\n");
  CHECK(failsWith([](plan::TrainingConfig &t) {
          t.set_compute_dtype(plan::BF16);
        }) == prefix + "compute_dtype is BF16 in the manifest but F32 in " +
                  class0 + "\n");
  // A field no plan sets.
  CHECK(failsWith([](plan::TrainingConfig &t) { t.set_clip_grad_norm(1); }) ==
        prefix + "clip_grad_norm is 1 in the manifest but unset in every "
                 "plan\n");
  // A field the manifest lacks but a plan sets.
  CHECK(failsWith([](plan::TrainingConfig &t) {
          t.clear_num_microbatches();
        }) == prefix + "num_microbatches is unset in the manifest but 2 in " +
                  class0 + "\n");

  // A rank started by another launcher checks its own plan.
  TinyModel one;
  std::string single = strategy({singleClassPlan(one, 2, {0}, 1)}, "train1");
  plan::Manifest manifest;
  REQUIRE(plan::readManifest(single + "/manifest.textproto", manifest) == "");
  manifest.mutable_training()->set_microbatch_size(4);
  REQUIRE(plan::writeManifest(single + "/manifest.textproto", manifest) == "");
  RunResult rank =
      piperRun({single, "--steps", "1"}, {"RANK=0", "WORLD_SIZE=1"});
  CHECK(rank.exitCode() == 1);
  CHECK(rank.err.find("training.microbatch_size is 4 in the manifest but 2 "
                      "in plan file '" +
                      single + "/class0.plan'") != std::string::npos);

  // A manifest without a training config has nothing to disagree with.
  plan::Manifest bare = good;
  bare.clear_training();
  REQUIRE(plan::writeManifest(manifestPath, bare) == "");
  RunResult r = piperRun({out, "--nproc", "2", "--steps", "1"});
  INFO("stderr: " << r.err);
  CHECK(r.exitCode() == 0);
}

TEST_CASE("piper-run: 64-bit flags beyond their range are errors",
          "[launcher][inputs]") {
  TinyModel m;
  std::string out = strategy({singleClassPlan(m, 2, {0}, 1)}, "ranges");
  // CLI11 saturated 2^64 to 2^63-1 steps (a run without end) and wrapped
  // --seed -1 to 2^64-1.
  for (auto [flag, value, range] :
       {std::tuple<const char *, const char *, const char *>{
            "--steps", "18446744073709551616", "0 to 9223372036854775807"},
        {"--steps", "-1", "0 to 9223372036854775807"},
        {"--seed", "-1", "0 to 18446744073709551615"},
        {"--seed", "18446744073709551616", "0 to 18446744073709551615"},
        {"--checkpoint-every", "99999999999999999999",
         "1 to 9223372036854775807"}}) {
    RunResult r = piperRun({out, "--nproc", "1", flag, value,
                            "--checkpoint-dir", tempDir("ranges")},
                           {}, std::chrono::seconds(20));
    INFO(flag << " " << value << ": " << r.err);
    CHECK_FALSE(r.timedOut);
    CHECK(r.exitCode() != 0);
    CHECK(r.err.find(std::string(flag) + ": must be an integer from " + range +
                     ", got '" + value + "'") != std::string::npos);
  }
  // The largest seed is a seed.
  RunResult big = piperRun(
      {out, "--nproc", "1", "--steps", "0", "--seed", "18446744073709551615"});
  INFO("stderr: " << big.err);
  CHECK(big.exitCode() == 0);
}

TEST_CASE("piper-run: a rank whose --log-dir log cannot be written fails",
          "[launcher][inputs]") {
  TinyModel m;
  std::string out = strategy(pipelinePlans(m, 2), "fulllog");
  std::string logs = tempDir("fulllog");
  // A full disk, as /dev/full: every write to rank 0's log fails. The run
  // trained, dropped the lines and exited 0 (or rank 0 aborted in
  // fmt::print, and the launcher then read /dev/full for its tail forever).
  REQUIRE(::symlink("/dev/full", (logs + "/rank-0.log").c_str()) == 0);
  RunResult r =
      piperRun({out, "--nproc", "2", "--steps", "1", "--log-dir", logs}, {},
               std::chrono::seconds(60));
  INFO("stderr: " << r.err);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode() != 0);
  CHECK(r.err.find("piper-run: rank 0 failed (exit code 5: its --log-dir log "
                   "could not be written (a full disk?), lines of it are "
                   "missing)") != std::string::npos);
  // The other rank's log is whole.
  std::ifstream other(logs + "/rank-1.log");
  std::string text((std::istreambuf_iterator<char>(other)),
                   std::istreambuf_iterator<char>());
  CHECK(text.find("peak memory") != std::string::npos);
}

TEST_CASE("piper-run --device-memory refuses a plan that cannot fit before "
          "allocating, and reads sizes as piperc does",
          "[launcher][inputs]") {
  TinyModel m;
  std::string out = strategy(pipelinePlans(m, 2), "devicememory");
  RunResult small =
      piperRun({out, "--nproc", "2", "--steps", "1", "--device-memory", "1KiB"},
               {}, std::chrono::seconds(30));
  INFO("stderr: " << small.err);
  CHECK_FALSE(small.timedOut);
  CHECK(small.exitCode() == 1);
  CHECK(small.err.find(": the plan does not fit this device's memory "
                       "(--device-memory), nothing was allocated: rank ") !=
        std::string::npos);
  CHECK(small.err.find("but the device has 1.0 KiB") != std::string::npos);

  RunResult big = piperRun(
      {out, "--nproc", "2", "--steps", "1", "--device-memory", "1GiB"});
  INFO("stderr: " << big.err);
  CHECK(big.exitCode() == 0);

  RunResult bad = piperRun({out, "--nproc", "2", "--device-memory", "1X"});
  CHECK(bad.exitCode() == 2);
  CHECK(bad.err == "piper-run: --device-memory '1X': expected a size such as "
                   "80GiB, 512MiB, 16GB or a number of bytes\n");
}

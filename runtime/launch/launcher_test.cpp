// End-to-end tests of the piper-run binary: output and metrics, the OpenBLAS
// core, strategies that must agree with one rank, command-line errors, and
// the failure path (a dying rank stops the whole run quickly and is named).
#include "runtime/launch/launcher_test_util.h"

using namespace piper;
using namespace piper::launchertest;

TEST_CASE("piper-run picks OpenBLAS's fast kernels on CPUs OpenBLAS does "
          "not recognise, unless the user chose",
          "[launcher]") {
  // Bazel does not pass it on; a developer's shell might.
  ::unsetenv("OPENBLAS_CORETYPE");
  TinyModel m;
  std::string out = strategy({singleClassPlan(m, 2, {0}, 1)}, "blas");
  auto coreOf = [&](const std::vector<std::string> &env) {
    RunResult r = piperRun({out, "--nproc", "1", "--profile"}, env);
    INFO("stderr: " << r.err);
    REQUIRE(r.exitCode() == 0);
    std::smatch match;
    REQUIRE(
        std::regex_search(r.err, match, std::regex("OpenBLAS (\\S+) core")));
    return match[1].str();
  };
  // OpenBLAS's own choice on this CPU is kept unless it is Prescott.
  std::string detected = coreOf({});
  CHECK(detected != "Prescott");
  // PIPER_TEST_BLAS_CORE pretends OpenBLAS fell back to Prescott: piper-run
  // re-executes itself with the core this CPU's instructions allow.
  std::string expected = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                         : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                           : "Prescott";
  CHECK(coreOf({"PIPER_TEST_BLAS_CORE=Prescott"}) == expected);
  // An explicit OPENBLAS_CORETYPE is never overridden.
  CHECK(coreOf({"PIPER_TEST_BLAS_CORE=Prescott",
                "OPENBLAS_CORETYPE=Prescott"}) == "Prescott");
}

TEST_CASE("piper-run trains one rank and reports every step", "[launcher]") {
  TinyModel m;
  std::string out = strategy({singleClassPlan(m, 2, {0}, 1)}, "single");
  std::string metrics = out + "/metrics.jsonl";
  RunResult r = piperRun({out, "--nproc", "1", "--backend", "cpu", "--steps",
                          "3", "--seed", "4", "--metrics", metrics});
  INFO("stderr: " << r.err);
  REQUIRE(r.exitCode() == 0);
  // A progress line per step, then the summary.
  std::regex line(R"(step (\d)/3 \| loss ([0-9.]+) \| grad_norm \S+ \| )"
                  R"(\d+ tokens/s \| [0-9.]+ ms/step \| ETA \d+:\d\d:\d\d)");
  std::istringstream lines(r.out);
  std::string l;
  int steps = 0, summary = 0;
  while (std::getline(lines, l)) {
    INFO("stdout line: " << l);
    if (l.rfind("summary: ", 0) == 0) {
      ++summary;
      continue;
    }
    CHECK(summary == 0);
    CHECK(std::regex_match(l, line));
    ++steps;
  }
  CHECK(steps == 3);
  CHECK(summary == 3);
  std::vector<double> losses = metricLosses(metrics);
  REQUIRE(losses.size() == 3);
  CHECK(losses[2] < losses[0]);
}

TEST_CASE("piper-run: pipeline and data parallel runs match one rank",
          "[launcher]") {
  TinyModel m;
  std::string single = strategy({singleClassPlan(m, 4, {0}, 1)}, "single4");
  std::string pp = strategy(pipelinePlans(m, 4), "pp2");
  std::string dp = strategy({singleClassPlan(m, 2, {0, 1}, 2)}, "dp2");
  auto run = [&](const std::string &out, int nproc) {
    RunResult r = piperRun({out, "--nproc", std::to_string(nproc), "--steps",
                            "3", "--seed", "9", "--metrics",
                            out + "/metrics.jsonl", "--save-params",
                            out + "/params", "--log-dir", out + "/logs"});
    INFO("stderr: " << r.err);
    REQUIRE(r.exitCode() == 0);
    return metricLosses(out + "/metrics.jsonl");
  };
  std::vector<double> base = run(single, 1);
  std::vector<double> pipe = run(pp, 2);
  std::vector<double> data = run(dp, 2);
  REQUIRE(base.size() == 3);
  REQUIRE(pipe.size() == 3);
  REQUIRE(data.size() == 3);
  for (int t = 0; t < 3; ++t) {
    CHECK(pipe[t] == Approx(base[t]).epsilon(1e-7));
    CHECK(data[t] == Approx(base[t]).epsilon(1e-6));
  }
  for (const char *name : {"wte", "head"}) {
    std::vector<float> a = readFloats(single + "/params/" + name + ".bin");
    REQUIRE(a.size() == 128u);
    for (const std::string &other : {pp, dp}) {
      std::vector<float> b = readFloats(other + "/params/" + name + ".bin");
      REQUIRE(b.size() == a.size());
      for (size_t i = 0; i < a.size(); ++i)
        CHECK(b[i] == Approx(a[i]).margin(1e-5));
    }
  }
  // Each spawned rank had a log file.
  struct stat st;
  CHECK(::stat((pp + "/logs/rank-1.log").c_str(), &st) == 0);
}

TEST_CASE("piper-run stops every rank when one fails", "[launcher]") {
  TinyModel m;
  std::string out = strategy(pipelinePlans(m, 2), "fail");
  std::string metrics = out + "/metrics.jsonl";
  for (int failRank : {1, 0}) {
    RunResult r = piperRun({out, "--nproc", "2", "--steps", "50", "--timeout-s",
                            "30", "--metrics", metrics},
                           {"PIPER_TEST_FAIL_RANK=" + std::to_string(failRank),
                            "PIPER_TEST_FAIL_STEP=2"},
                           std::chrono::seconds(25));
    INFO("stderr: " << r.err);
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.exitCode() != 0);
    CHECK(r.err.find("piper-run: rank " + std::to_string(failRank) +
                     " failed (exit code 3)") != std::string::npos);
    CHECK(r.err.find("failing at the start of step 2 on purpose") !=
          std::string::npos);
    // Far below the communication timeout: the others were stopped, not
    // left to time out.
    CHECK(r.seconds < 10);
    // Step 1 completed and was reported before the failure.
    CHECK(metricLosses(metrics).size() == 1);
  }
}

TEST_CASE("piper-run reports a failing rank's error with its rank",
          "[launcher]") {
  TinyModel m;
  // A plan that validates but fails in a kernel: adamw with beta1 = 1 (a
  // missing 'lr' would be a load error: the kernel table requires it).
  plan::Plan p = singleClassPlan(m, 1, {0, 1}, 2);
  setAttr(p.mutable_segments(2)->mutable_kernels(0), "beta1", 1.0);
  std::string out = strategy({p}, "kernel-error");
  RunResult r = piperRun({out, "--nproc", "2", "--steps", "3"}, {},
                         std::chrono::seconds(25));
  INFO("stderr: " << r.err);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode() == 1);
  CHECK(std::regex_search(r.err, std::regex(R"(piper-run: rank [01] failed )"
                                            R"(\(exit code 1\))")));
  CHECK(std::regex_search(
      r.err, std::regex(R"(rank [01], stream 'compute', instruction \d+ )"
                        R"(\(update\): segment 'update', kernel 0: adamw: )"
                        R"(attributes 'beta1' and 'beta2' must be in )"
                        R"(\[0, 1\))")));
}

TEST_CASE("piper-run command-line and strategy errors", "[launcher]") {
  TinyModel m;
  std::string pp = strategy(pipelinePlans(m, 2), "errors");

  SECTION("wrong --nproc") {
    RunResult r = piperRun({pp, "--nproc", "1", "--steps", "1"});
    CHECK(r.exitCode() == 1);
    CHECK(r.err == "piper-run: strategy needs 2 ranks, --nproc is 1\n");
  }
  SECTION("no --nproc and no cluster launcher") {
    RunResult r = piperRun({pp, "--steps", "1"});
    CHECK(r.exitCode() == 1);
    CHECK(r.err == "piper-run: --nproc is required (the strategy needs 2 "
                   "ranks), unless srun, mpirun or torchrun-style variables "
                   "start the ranks (docs/operations.md)\n");
  }
  // A Slurm batch script is not an srun step: piper-run is the launcher.
  SECTION("under sbatch, without srun") {
    RunResult r = piperRun({pp, "--nproc", "2", "--steps", "1"},
                           {"SLURM_JOB_ID=7", "SLURM_PROCID=0",
                            "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=n[1-2]"});
    INFO("stderr: " << r.err);
    CHECK(r.exitCode() == 0);
    CHECK(r.out.find("step 1/1 |") != std::string::npos);
  }
  SECTION("unknown backend") {
    RunResult r = piperRun({pp, "--nproc", "2", "--backend", "tpu"});
    CHECK(r.exitCode() == 1);
    CHECK(r.err.find("backend 'tpu' is not available in this build "
                     "(available: cpu") != std::string::npos);
  }
  // Without CUDA in the build, or without a usable GPU, --backend cuda
  // stops before any rank starts and says why; on a GPU machine the two
  // ranks share the GPU through --comm gloo and train.
  SECTION("cuda backend, where it cannot run") {
    RunResult r =
        piperRun({pp, "--nproc", "2", "--backend", "cuda", "--comm", "gloo"});
    INFO("stderr: " << r.err);
    if (r.exitCode() != 0) {
      CHECK(r.exitCode() == 1);
      CHECK(std::regex_search(
          r.err,
          std::regex("backend 'cuda': (this piper-run was built without CUDA "
                     "\\(no toolkit at .* at build time\\); see docs/gpu.md|"
                     "no usable CUDA device: cudaGetDeviceCount\\(&count\\): "
                     "cudaError\\w+: .* "
                     "\\(runtime/hal/cuda/CudaDevice.cpp:\\d+\\))")));
    }
  }
  SECTION("nccl needs the cuda backend") {
    RunResult r = piperRun({pp, "--nproc", "2", "--comm", "nccl"});
    CHECK(r.exitCode() == 1);
    CHECK(r.err.find("--comm nccl needs --backend cuda") != std::string::npos);
  }
  SECTION("--attention cudnn needs a GPU backend and a bf16 plan") {
    RunResult cpu = piperRun({pp, "--nproc", "2", "--attention", "cudnn"});
    CHECK(cpu.exitCode() == 1);
    CHECK(cpu.err.find("--attention cudnn needs --backend cuda") !=
          std::string::npos);
    // These plans are fp32.
    RunResult fp32 = piperRun({pp, "--nproc", "2", "--backend",
                               "cuda-emulation", "--attention", "cudnn"});
    CHECK(fp32.exitCode() == 1);
    CHECK(fp32.err.find("--attention cudnn: cuDNN's fused attention runs "
                        "bf16 plans only, and this strategy is fp32") !=
          std::string::npos);
    RunResult bad = piperRun({pp, "--nproc", "2", "--attention", "flash"});
    CHECK(bad.exitCode() == 2);
    CHECK(bad.err.find("--attention") != std::string::npos);
  }
  SECTION("unknown communicator") {
    RunResult r = piperRun({pp, "--nproc", "2", "--comm", "mpi"});
    CHECK(r.exitCode() == 2);
    CHECK(r.err.find("--comm") != std::string::npos);
  }
  SECTION("missing strategy folder") {
    RunResult r = piperRun({pp + "/nope", "--nproc", "2"});
    CHECK(r.exitCode() == 1);
    CHECK(r.err.find("manifest.textproto': cannot open") != std::string::npos);
  }
  SECTION("corrupted plan file") {
    std::string path = pp + "/class1.plan";
    std::string bytes = readFile(path);
    bytes[bytes.size() - 3] ^= 0x55;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    RunResult r = piperRun({pp, "--nproc", "2"});
    CHECK(r.exitCode() == 1);
    CHECK(r.err.find("class1.plan': corrupted: checksum mismatch") !=
          std::string::npos);
  }
  SECTION("mismatched transfers across plans") {
    std::vector<plan::Plan> plans = pipelinePlans(m, 2);
    plans[1].mutable_streams(0)->mutable_instructions(0)->set_tag(77);
    std::string bad = strategy(plans, "badtag");
    RunResult r = piperRun({bad, "--nproc", "2"});
    CHECK(r.exitCode() == 1);
    CHECK(r.err.find("piper-run: invalid strategy: ") != std::string::npos);
    CHECK(r.err.find("tag 0") != std::string::npos);
  }
  SECTION("bad option") {
    RunResult r = piperRun({pp, "--nproc", "2", "--steps", "zero"});
    CHECK(r.exitCode() != 0);
    CHECK(r.err.find("--steps") != std::string::npos);
  }
}

TEST_CASE("piper-run: a cross-rank deadlock fails after --timeout-s",
          "[launcher]") {
  TinyModel m;
  std::vector<plan::Plan> plans = pipelinePlans(m, 1);
  // Stage 0 waits for the gradient before sending the activation that
  // stage 1 needs to compute it: each rank waits for the other.
  plan::Stream *s = plans[0].mutable_streams(0);
  REQUIRE(s->instructions(3).kind() == plan::Instruction::RECV);
  for (int i = 3; i > 0; --i)
    s->mutable_instructions()->SwapElements(i, i - 1);
  std::string out = strategy(plans, "deadlock");
  RunResult r =
      piperRun({out, "--nproc", "2", "--steps", "2", "--timeout-s", "2"}, {},
               std::chrono::seconds(30));
  INFO("stderr: " << r.err);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode() == 1);
  CHECK(std::regex_search(r.err,
                          std::regex(R"(piper-run: rank [01] failed \(exit )"
                                     R"(code 1\))")));
  // The error names the peer the rank was waiting for.
  CHECK(std::regex_search(r.err, std::regex(R"(from rank [01])")));
  CHECK(r.seconds < 20);
}

TEST_CASE("--profile=gpu adds the device time of every launch", "[launcher]") {
  TinyModel m;
  std::string out = strategy({singleClassPlan(m, 2, {0}, 1)}, "gpuprofile");
  // On the emulation the launches are timed by the host clock.
  RunResult gpu = piperRun({out, "--nproc", "1", "--steps", "3", "--backend",
                            "cuda-emulation", "--profile=gpu"});
  INFO("stderr: " << gpu.err);
  REQUIRE(gpu.exitCode() == 0);
  CHECK(gpu.err.find("device time per launch (--profile=gpu") !=
        std::string::npos);
  // The tiny model's linear layers run as GEMMs; every launch row and the
  // busy and idle totals are there.
  CHECK(std::regex_search(gpu.err, std::regex("\n  gemm +[0-9]+ ")));
  CHECK(gpu.err.find("(device busy)") != std::string::npos);
  CHECK(gpu.err.find("(device idle)") != std::string::npos);
  // Plain --profile times the host side only.
  RunResult host = piperRun({out, "--nproc", "1", "--steps", "3", "--backend",
                             "cuda-emulation", "--profile"});
  REQUIRE(host.exitCode() == 0);
  CHECK(host.err.find("profile of") != std::string::npos);
  CHECK(host.err.find("device time per launch") == std::string::npos);
  // The cpu backend has no device launches; an unknown mode is a CLI error.
  RunResult cpu = piperRun({out, "--nproc", "1", "--profile=gpu"});
  CHECK(cpu.exitCode() == 1);
  CHECK(cpu.err.find("--profile=gpu needs --backend cuda or cuda-emulation") !=
        std::string::npos);
  RunResult bad = piperRun({out, "--nproc", "1", "--profile=tpu"});
  CHECK(bad.exitCode() == 2);
  CHECK(bad.err.find("--profile") != std::string::npos);
}

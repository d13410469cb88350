// Helpers of the end-to-end tests of piper-run and piper-tokenize: running a
// binary with a timeout, writing a strategy, reading metrics.
#ifndef PIPER_RUNTIME_LAUNCH_LAUNCHER_TEST_UTIL_H
#define PIPER_RUNTIME_LAUNCH_LAUNCHER_TEST_UTIL_H

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "runtime/data/TokenFile.h"
#include "runtime/exec/test_plans.h"
#include "runtime/formats/Safetensors.h"

extern char **environ;

namespace piper::launchertest {

using namespace piper::runtime::testplans;

/// The binaries under test, from the test's runfiles (the working directory).
inline const char *kPiperRun = "tools/piper-run";
inline const char *kPiperTokenize = "tools/piper-tokenize";

inline std::string tempDir(const std::string &name) {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/" + name + "-XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()));
  return tmpl;
}

inline std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct RunResult {
  int status = -1;
  bool timedOut = false;
  std::string out, err;
  double seconds = 0;
  int exitCode() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

/// Starts `binary` with `args` and the environment plus `env`, its stdout
/// and stderr written to `outPath` and `errPath`; returns its pid.
inline pid_t spawnBinary(const char *binary,
                         const std::vector<std::string> &args,
                         const std::vector<std::string> &env,
                         const std::string &outPath,
                         const std::string &errPath) {
  std::vector<std::string> argStrings = {binary};
  argStrings.insert(argStrings.end(), args.begin(), args.end());
  std::vector<char *> argv;
  for (std::string &s : argStrings)
    argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> envStrings;
  for (char **e = environ; *e; ++e)
    envStrings.push_back(*e);
  envStrings.insert(envStrings.end(), env.begin(), env.end());
  std::vector<char *> envp;
  for (std::string &s : envStrings)
    envp.push_back(s.data());
  envp.push_back(nullptr);

  std::fflush(nullptr);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int out = ::open(outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = ::open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::execve(binary, argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

/// Runs `binary` with `args` and extra environment `env`, killing it after
/// `timeout`.
inline RunResult runBinary(const char *binary,
                           const std::vector<std::string> &args,
                           const std::vector<std::string> &env,
                           std::chrono::seconds timeout) {
  std::string dir = tempDir("run");
  std::string outPath = dir + "/stdout", errPath = dir + "/stderr";
  auto start = std::chrono::steady_clock::now();
  pid_t pid = spawnBinary(binary, args, env, outPath, errPath);
  RunResult r;
  while (true) {
    pid_t done = ::waitpid(pid, &r.status, WNOHANG);
    if (done == pid)
      break;
    if (std::chrono::steady_clock::now() - start > timeout) {
      r.timedOut = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &r.status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  r.out = readFile(outPath);
  r.err = readFile(errPath);
  return r;
}

/// Runs piper-run with `args` and extra environment `env`, killing it after
/// `timeout`.
inline RunResult
piperRun(const std::vector<std::string> &args,
         const std::vector<std::string> &env = {},
         std::chrono::seconds timeout = std::chrono::seconds(60)) {
  return runBinary(kPiperRun, args, env, timeout);
}

/// Writes `plans` as a compiled strategy in a fresh folder.
inline std::string strategy(const std::vector<plan::Plan> &plans,
                            const std::string &name) {
  std::string dir = tempDir(name);
  REQUIRE(writeStrategy(dir, plans, name) == "");
  return dir;
}

/// The "loss" of every line of a metrics file.
inline std::vector<double> metricLosses(const std::string &path) {
  std::vector<double> losses;
  std::istringstream in(readFile(path));
  std::string line;
  std::regex re(R"(^\{"step": (\d+), "loss": ([-+0-9.eE]+), "tokens_per_s": )"
                R"([-+0-9.eE]+, "step_time_s": [-+0-9.eE]+)"
                R"((, "[a-z_]+": [^,]+)*\}$)");
  while (std::getline(in, line)) {
    std::smatch m;
    INFO("metrics line: " << line);
    REQUIRE(std::regex_match(line, m, re));
    CHECK(std::stoi(m[1]) == static_cast<int>(losses.size()) + 1);
    losses.push_back(std::stod(m[2]));
  }
  return losses;
}

inline std::vector<float> readFloats(const std::string &path) {
  std::string bytes = readFile(path);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

} // namespace piper::launchertest

#endif // PIPER_RUNTIME_LAUNCH_LAUNCHER_TEST_UTIL_H

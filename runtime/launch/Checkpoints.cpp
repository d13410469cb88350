// Periodic checkpoint directories: DIR/step-<N>.tmp/ filled by every class,
// completed by rank 0 with state.json and one rename, pruned to the last K;
// and the search for the newest complete one on --resume.
#include "runtime/launch/Checkpoints.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/data/AtomicFile.h"
#include "runtime/launch/CheckpointIO.h"

namespace piper::runtime {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

constexpr const char *kFormat = "piper-checkpoint";
// 2: the sharded layout ("layout": "shards"); whole checkpoints stay 1.
constexpr int kVersion = 2;

/// The step of a directory named "step-<N>" (digits only), else -1.
int64_t stepOfName(const std::string &name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix))
    return -1;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10)
      return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

/// The step-<N> directories of `dir` by step (complete or not).
std::map<int64_t, fs::path> stepDirectories(const std::string &dir) {
  std::map<int64_t, fs::path> out;
  std::error_code ec;
  for (const auto &entry : fs::directory_iterator(dir, ec)) {
    int64_t step = stepOfName(entry.path().filename().string());
    if (step >= 0 && entry.is_directory(ec))
      out[step] = entry.path();
  }
  return out;
}

bool isComplete(const fs::path &stepDir) {
  std::error_code ec;
  return fs::is_regular_file(stepDir / kCheckpointStateFile, ec);
}

/// Removes a checkpoint directory, its completion marker first, so that one
/// cut off half-removed is never taken for complete.
void removeCheckpointDir(const fs::path &stepDir) {
  std::error_code ec;
  fs::remove(stepDir / kCheckpointStateFile, ec);
  fs::remove_all(stepDir, ec);
}

Status syncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return Status::error(
        fmt::format("cannot open '{}': {}", dir, errnoMessage(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0)
    return Status::error(
        fmt::format("cannot sync '{}': {}", dir, errnoMessage(err)));
  return Status::ok();
}

Json identityJson(const RunIdentity &id) {
  return Json{{"seed", id.seed},
              {"data", id.data},
              {"microbatches_per_step", id.microbatches},
              {"microbatch_size", id.microbatchSize},
              {"seq_len", id.seqLen},
              {"world_size", id.worldSize}};
}

/// Why a checkpoint written under `saved` cannot continue this run
/// (`now`); empty when it can.
std::string identityMismatch(const Json &saved, const RunIdentity &now) {
  Json want = identityJson(now);
  std::vector<std::string> diffs;
  for (const char *key :
       {"seed", "data", "microbatches_per_step", "microbatch_size", "seq_len"})
    if (!saved.contains(key) || saved[key] != want[key])
      diffs.push_back(
          fmt::format("{} {} (this run: {})", key,
                      saved.contains(key) ? saved[key].dump() : "missing",
                      want[key].dump()));
  std::string out;
  for (const std::string &d : diffs)
    out += (out.empty() ? "" : ", ") + d;
  return out;
}

} // namespace

std::string checkpointStepDir(const std::string &dir, int64_t step) {
  return fmt::format("{}/step-{}", dir, step);
}

RunIdentity runIdentity(const RunOptions &options,
                        const plan::Manifest &manifest,
                        const plan::Plan &plan) {
  const plan::TrainingConfig &t = manifest.training().num_microbatches() > 0
                                      ? manifest.training()
                                      : plan.training();
  RunIdentity id;
  id.seed = options.seed;
  id.data = options.dataPath.empty() ? "synthetic" : options.dataPath;
  id.microbatches =
      int64_t(std::max(1, t.num_replicas())) * t.num_microbatches();
  id.microbatchSize = t.microbatch_size();
  id.seqLen = t.seq_len();
  id.worldSize = manifest.world_size();
  return id;
}

Status findResumePoint(const std::string &dir,
                       const std::vector<plan::Plan> &plans,
                       const RunIdentity &identity, ResumePoint &out) {
  out = ResumePoint();
  std::map<int64_t, fs::path> dirs = stepDirectories(dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const std::string path = it->second.string();
    auto skip = [&](const std::string &why) {
      out.skipped.push_back(fmt::format("skipping '{}': {}", path, why));
    };
    if (!isComplete(it->second)) {
      skip(fmt::format("incomplete (no {})", kCheckpointStateFile));
      continue;
    }
    Json state;
    std::ifstream in(it->second / kCheckpointStateFile);
    state = Json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!state.is_object() || state.value("format", "") != kFormat ||
        !state.contains("step") || !state["step"].is_number_integer() ||
        state["step"].get<int64_t>() != it->first) {
      skip(fmt::format("{} is not a piper checkpoint state of step {}",
                       kCheckpointStateFile, it->first));
      continue;
    }
    if (state.value("version", 0) > kVersion) {
      skip(fmt::format("written by a newer piper (version {})",
                       state.value("version", 0)));
      continue;
    }
    // A whole checkpoint of another model or run is an error, not a reason
    // to start over from an older one.
    auto sameRun = [&]() -> Status {
      std::string mismatch = identityMismatch(
          state.contains("run") ? state["run"] : Json(), identity);
      if (mismatch.empty())
        return Status::ok();
      return Status::error(fmt::format(
          "checkpoint '{}' is of another run: {}; resume with the options it "
          "was written with, or use another --checkpoint-dir",
          path, mismatch));
    };
    const Json &sizes = state.contains("files") ? state["files"] : Json();
    if (state.value("layout", "") == "shards") {
      // Every rank's slices (ZeRO, expert parallelism): the files must be
      // whole and together hold every tensor of this strategy.
      std::vector<std::string> files;
      std::string broken;
      for (auto &[name, size] : sizes.items()) {
        std::error_code ec;
        uintmax_t actual = fs::file_size(path + "/" + name, ec);
        if (ec || !size.is_number_integer() ||
            size.get<int64_t>() != static_cast<int64_t>(actual)) {
          broken = fmt::format("'{}/{}' is missing or not of the {} bytes "
                               "written",
                               path, name, size.dump());
          break;
        }
        files.push_back(name);
      }
      auto index = std::make_unique<ShardIndex>();
      if (broken.empty())
        if (Status st = index->open(path, files, it->first); !st)
          broken = st.message();
      if (!broken.empty()) {
        skip(broken);
        continue;
      }
      PIPER_RETURN_IF_ERROR(sameRun());
      PIPER_RETURN_IF_ERROR(
          index->check(strategyParams(plans))
              .withContext(fmt::format("checkpoint '{}'", path)));
      out.step = it->first;
      out.dir = path;
      out.shards = std::move(index);
      return Status::ok();
    }
    // Files that are missing, truncated or of another size than written.
    std::string broken;
    std::unique_ptr<SafetensorsReader> readers[2];
    const char *names[2] = {kCheckpointModelFile, kCheckpointOptimizerFile};
    for (int f = 0; f < 2 && broken.empty(); ++f) {
      std::string file = path + "/" + names[f];
      std::error_code ec;
      uintmax_t size = fs::file_size(file, ec);
      if (!ec && sizes.contains(names[f]) &&
          sizes[names[f]] != static_cast<int64_t>(size)) {
        broken = fmt::format("'{}' has {} bytes, {} were written", file, size,
                             sizes[names[f]].dump());
        break;
      }
      Status st;
      readers[f] = SafetensorsReader::open(file, st);
      int64_t fileStep = 0;
      if (readers[f])
        st = checkpointStep(*readers[f], fileStep);
      if (!readers[f] || !st)
        broken = st.message();
      else if (fileStep != it->first)
        broken = fmt::format("'{}' holds step {}", file, fileStep);
    }
    if (!broken.empty()) {
      skip(broken);
      continue;
    }
    PIPER_RETURN_IF_ERROR(sameRun());
    std::vector<ParamSpec> params = strategyParams(plans);
    PIPER_RETURN_IF_ERROR(
        checkCheckpointParams(*readers[0], params, /*rejectExtra=*/true));
    std::vector<ParamSpec> moments;
    for (const ParamSpec &p : params) {
      moments.push_back(ParamSpec{p.name + ".exp_avg", p.shape});
      moments.push_back(ParamSpec{p.name + ".exp_avg_sq", p.shape});
    }
    PIPER_RETURN_IF_ERROR(
        checkCheckpointParams(*readers[1], moments, /*rejectExtra=*/true));
    out.step = it->first;
    out.dir = path;
    out.model = std::move(readers[0]);
    out.optimizer = std::move(readers[1]);
    return Status::ok();
  }
  return Status::ok();
}

void removeIncompleteCheckpoints(const std::string &dir) {
  std::error_code ec;
  for (const auto &entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    const std::string suffix = ".tmp";
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        stepOfName(name.substr(0, name.size() - suffix.size())) >= 0)
      fs::remove_all(entry.path(), ec);
  }
}

Status writeStepCheckpoint(const std::string &dir, int keep,
                           const RunIdentity &identity,
                           const plan::Manifest &manifest, Executor &exec,
                           Communicator *comm, int rank, int64_t step,
                           CheckpointStats &stats) {
  auto start = std::chrono::steady_clock::now();
  const std::string who = fmt::format("rank {}", rank);
  const std::string finalDir = checkpointStepDir(dir, step);
  const std::string tmpDir = finalDir + ".tmp";
  // Under ZeRO or expert parallelism (in any class: the ranks agree) each
  // rank writes the slices it alone holds; otherwise whole tensors, one
  // part per class merged by rank 0.
  double shardedRanks = exec.shardsState() ? 1 : 0;
  if (comm)
    PIPER_RETURN_IF_ERROR(comm->allReduceSumWorld(&shardedRanks, 1)
                              .withContext(who + ": checkpoint step " +
                                           std::to_string(step)));
  const bool sharded = shardedRanks > 0;
  if (sharded) {
    PIPER_RETURN_IF_ERROR(makeDirectories(tmpDir).withContext(who));
    PIPER_RETURN_IF_ERROR(
        exec.saveShards(tmpDir + "/" + shardFileName(rank), step));
  } else {
    PIPER_RETURN_IF_ERROR(writeCheckpoint(tmpDir + "/" + kCheckpointModelFile,
                                          CheckpointContent::Params, manifest,
                                          exec, comm, rank, step));
    PIPER_RETURN_IF_ERROR(
        writeCheckpoint(tmpDir + "/" + kCheckpointOptimizerFile,
                        CheckpointContent::Optimizer, manifest, exec, comm,
                        rank, step));
  }
  if (comm) {
    // With one class no merge waited for the writers: the files are whole
    // once every rank is past this barrier.
    double done = 1;
    PIPER_RETURN_IF_ERROR(comm->allReduceSumWorld(&done, 1).withContext(
        who + ": waiting for every rank to write checkpoint step " +
        std::to_string(step)));
  }
  if (rank != 0)
    return Status::ok();

  auto fail = [&](const std::string &what) {
    return Status::error(
        fmt::format("{}: checkpoint '{}': {}", who, finalDir, what));
  };
  Json files = Json::object();
  stats.bytes = 0;
  std::vector<std::string> written;
  if (sharded) {
    std::error_code ec;
    for (const auto &entry : fs::directory_iterator(tmpDir, ec))
      if (entry.path().extension() == ".safetensors")
        written.push_back(entry.path().filename().string());
    std::sort(written.begin(), written.end());
  } else {
    written = {kCheckpointModelFile, kCheckpointOptimizerFile};
  }
  for (const std::string &name : written) {
    std::error_code ec;
    uintmax_t size = fs::file_size(tmpDir + "/" + name, ec);
    if (ec)
      return fail(fmt::format("{} was not written: {}", name, ec.message()));
    files[name] = static_cast<int64_t>(size);
    stats.bytes += static_cast<int64_t>(size);
  }
  Json state = {{"format", kFormat},
                {"version", sharded ? 2 : 1},
                {"step", step},
                {"layout", sharded ? "shards" : "whole"},
                {"run", identityJson(identity)},
                {"files", files}};
  std::string text = state.dump(2) + "\n";
  AtomicFile marker;
  Status st = marker.open(tmpDir + "/" + kCheckpointStateFile);
  if (st)
    st = marker.write(text.data(), text.size());
  if (st)
    st = marker.commit();
  if (!st)
    return fail(st.message());
  // A checkpoint of this step left by an earlier run (one that was skipped
  // as broken) gives way to this one.
  std::error_code ec;
  if (fs::exists(finalDir, ec))
    removeCheckpointDir(finalDir);
  fs::rename(tmpDir, finalDir, ec);
  if (ec)
    return fail("cannot rename '" + tmpDir + "': " + ec.message());
  PIPER_RETURN_IF_ERROR(syncDirectory(dir).withContext(who));

  // Keep the newest `keep` complete checkpoints up to this step; newer ones
  // (of an earlier, longer run) are replaced when their step comes.
  int kept = 0;
  std::map<int64_t, fs::path> dirs = stepDirectories(dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->first > step)
      continue;
    if (isComplete(it->second) && kept < keep) {
      ++kept;
      continue;
    }
    removeCheckpointDir(it->second);
  }
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return Status::ok();
}

Status keepMetricsUpTo(const std::string &path, int64_t step) {
  std::ifstream in(path);
  if (!in)
    return Status::ok();
  std::string kept, line;
  while (std::getline(in, line)) {
    Json object = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (object.is_object() && object.contains("step") &&
        object["step"].is_number_integer() &&
        object["step"].get<int64_t>() <= step)
      kept += line + "\n";
  }
  AtomicFile out;
  Status st = out.open(path);
  if (st)
    st = out.write(kept.data(), kept.size());
  if (st)
    st = out.commit();
  return st.withContext("--metrics '" + path + "'");
}

} // namespace piper::runtime

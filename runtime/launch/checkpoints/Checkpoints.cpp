// Periodic checkpoint directories: DIR/step-<N>.tmp/ filled by every class,
// completed by rank 0 with state.json and one rename, pruned to the last K;
// and the search for the newest complete one on --resume.
#include "runtime/launch/checkpoints/Checkpoints.h"

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

#include "proto/PlanShards.h"
#include "runtime/formats/CheckpointManifest.h"
#include "runtime/formats/Integrity.h"
#include "runtime/formats/Json.h"
#include "runtime/launch/checkpoints/CheckpointIO.h"
#include "support/AtomicFile.h"
#include "support/Errno.h"

namespace piper::runtime {

namespace fs = std::filesystem;

namespace {

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
  // Context members share their microbatches: a checkpoint of a CP run
  // resumes under any CP degree with the same global batch.
  id.microbatches = plan::globalMicrobatches(t);
  id.microbatchSize = t.microbatch_size();
  id.seqLen = t.seq_len();
  id.worldSize = manifest.world_size();
  return id;
}

namespace {

/// What to do with one step-<N> directory when resuming.
struct Candidate {
  /// Set when it cannot be used, with why.
  std::string skip;
  /// The skip is for a complete checkpoint that failed verification.
  bool corrupt = false;
  CheckpointManifest manifest;
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
};

Status readText(const fs::path &path, std::string &out) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof())
    return Status::error(fmt::format("cannot read '{}'", path.string()));
  out = text.str();
  return Status::ok();
}

/// Reads, parses and verifies step directory `stepDir` of step `step`.
void examine(const fs::path &stepDir, int64_t step, Candidate &c) {
  const std::string path = stepDir.string();
  std::string text;
  Status st = readText(stepDir / kCheckpointStateFile, text);
  if (st)
    st = parseCheckpointManifest(text, c.manifest)
             .withContext(std::string(kCheckpointStateFile));
  if (st && c.manifest.step != step)
    st = Status::error(
        fmt::format("{} is of step {}", kCheckpointStateFile, c.manifest.step));
  if (st && c.manifest.layout == "whole") {
    // The files a whole checkpoint loads from.
    for (const char *name : {kCheckpointModelFile, kCheckpointOptimizerFile})
      if (std::none_of(c.manifest.files.begin(), c.manifest.files.end(),
                       [&](const ManifestFile &f) { return f.name == name; }))
        st = Status::error(
            fmt::format("{} does not list {}", kCheckpointStateFile, name));
  }
  if (!st) {
    c.skip = st.message();
    return;
  }
  CheckpointFault fault;
  st = verifyCheckpointDir(path, c.manifest, c.readers, fault);
  if (!st) {
    c.skip = st.message();
    c.corrupt = fault == CheckpointFault::Corrupt;
  }
}

/// The reader of file `name` among a whole checkpoint's.
std::unique_ptr<SafetensorsReader> takeReader(Candidate &c,
                                              const std::string &name) {
  for (size_t i = 0; i < c.manifest.files.size(); ++i)
    if (c.manifest.files[i].name == name)
      return std::move(c.readers[i]);
  return nullptr;
}

/// Checks a verified whole checkpoint against the strategy's parameters
/// and moves its readers into `out`.
Status useWhole(Candidate &c, const std::vector<plan::Plan> &plans,
                ResumePoint &out) {
  out.model = takeReader(c, kCheckpointModelFile);
  out.optimizer = takeReader(c, kCheckpointOptimizerFile);
  std::vector<ParamSpec> params = strategyParams(plans);
  PIPER_RETURN_IF_ERROR(
      checkCheckpointParams(*out.model, params, /*rejectExtra=*/true));
  std::vector<ParamSpec> moments;
  for (const ParamSpec &p : params) {
    moments.push_back(ParamSpec{p.name + ".exp_avg", p.shape});
    moments.push_back(ParamSpec{p.name + ".exp_avg_sq", p.shape});
  }
  return checkCheckpointParams(*out.optimizer, moments, /*rejectExtra=*/true);
}

} // namespace

Status findResumePoint(const std::string &dir,
                       const std::vector<plan::Plan> &plans,
                       const RunIdentity &identity, bool fallback,
                       ResumePoint &out) {
  out = ResumePoint();
  std::map<int64_t, fs::path> dirs = stepDirectories(dir);
  // Checkpoints passed over for more than a missing state.json: when no
  // other is left, starting afresh would silently throw them away.
  std::vector<std::string> broken;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const std::string path = it->second.string();
    if (!isComplete(it->second)) {
      out.skipped.push_back(fmt::format("skipping '{}': incomplete (no {})",
                                        path, kCheckpointStateFile));
      continue;
    }
    Candidate c;
    examine(it->second, it->first, c);
    if (c.corrupt && !fallback)
      return Status::error(fmt::format(
          "{}; refusing to resume from '{}' (--resume-fallback resumes from "
          "the newest older checkpoint that verifies instead)",
          c.skip, path));
    if (!c.skip.empty()) {
      out.skipped.push_back(fmt::format("skipping '{}'{}: {}", path,
                                        c.corrupt ? " (--resume-fallback)" : "",
                                        c.skip));
      broken.push_back(out.skipped.back());
      continue;
    }
    // A checkpoint of another model or run is an error, not a reason to
    // start over from an older one.
    std::string mismatch = identityMismatch(c.manifest.run, identity);
    if (!mismatch.empty())
      return Status::error(fmt::format(
          "checkpoint '{}' is of another run: {}; resume with the options it "
          "was written with, or use another --checkpoint-dir",
          path, mismatch));
    if (!c.manifest.checksummed())
      out.warnings.push_back(fmt::format(
          "'{}' was written before checkpoints carried run ids and CRC-32s "
          "(version {}): only its sizes, headers, steps and values were "
          "checked",
          path, c.manifest.version));
    if (c.manifest.layout == "shards") {
      // Every rank's slices (ZeRO, expert parallelism): together they must
      // hold every tensor of this strategy.
      auto index = std::make_unique<ShardIndex>();
      PIPER_RETURN_IF_ERROR(
          index->open(std::move(c.readers))
              .withContext(fmt::format("checkpoint '{}'", path)));
      PIPER_RETURN_IF_ERROR(
          index->check(strategyParams(plans))
              .withContext(fmt::format("checkpoint '{}'", path)));
      out.shards = std::move(index);
    } else {
      PIPER_RETURN_IF_ERROR(useWhole(c, plans, out));
    }
    out.step = it->first;
    out.dir = path;
    out.runId = c.manifest.runId;
    return Status::ok();
  }
  if (!broken.empty()) {
    std::string list;
    for (const std::string &b : broken)
      list += (list.empty() ? "" : "; ") + b;
    return Status::error(fmt::format(
        "--resume: no checkpoint of '{}' can be resumed: {}; move {} away "
        "to start afresh",
        dir, list, broken.size() == 1 ? "it" : "them"));
  }
  return Status::ok();
}

Status shareRunId(Communicator *comm, int rank, std::string &runId) {
  if (!comm)
    return Status::ok();
  // A world sum in which only rank 0's 4 x 32 bits are not zero: exact in
  // doubles.
  double words[4] = {0, 0, 0, 0};
  if (rank == 0) {
    if (!isRunId(runId))
      return Status::error("internal: run id '" + runId + "' is malformed");
    for (int i = 0; i < 4; ++i)
      words[i] = double(std::stoul(runId.substr(8 * i, 8), nullptr, 16));
  }
  PIPER_RETURN_IF_ERROR(comm->allReduceSumWorld(words, 4).withContext(
      fmt::format("rank {}: sharing the run id", rank)));
  runId.clear();
  for (double w : words)
    runId += fmt::format("{:08x}", static_cast<uint32_t>(w));
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
                           CheckpointStats &stats,
                           const CheckpointHooks &hooks) {
  auto start = std::chrono::steady_clock::now();
  const std::string who = fmt::format("rank {}", rank);
  const std::string finalDir = checkpointStepDir(dir, step);
  const std::string tmpDir = finalDir + ".tmp";
  // Under ZeRO or expert parallelism (in any class: the ranks agree) each
  // rank writes the slices it alone holds; otherwise whole tensors, one
  // part per class merged by rank 0.
  auto collective = [&](Status st) {
    if (!st && hooks.collectiveFailed)
      hooks.collectiveFailed(st);
    return st;
  };
  double shardedRanks = exec.shardsState() ? 1 : 0;
  if (comm)
    PIPER_RETURN_IF_ERROR(collective(
        comm->allReduceSumWorld(&shardedRanks, 1)
            .withContext(who + ": checkpoint step " + std::to_string(step))));
  const bool sharded = shardedRanks > 0;
  if (sharded) {
    PIPER_RETURN_IF_ERROR(makeDirectories(tmpDir).withContext(who));
    PIPER_RETURN_IF_ERROR(
        exec.saveShards(tmpDir + "/" + shardFileName(rank), step));
  } else {
    PIPER_RETURN_IF_ERROR(writeCheckpoint(
        tmpDir + "/" + kCheckpointModelFile, CheckpointContent::Params,
        manifest, exec, comm, rank, step, hooks.collectiveFailed));
    PIPER_RETURN_IF_ERROR(writeCheckpoint(
        tmpDir + "/" + kCheckpointOptimizerFile, CheckpointContent::Optimizer,
        manifest, exec, comm, rank, step, hooks.collectiveFailed));
  }
  if (hooks.filesWritten)
    hooks.filesWritten();
  if (comm) {
    // With one class no merge waited for the writers: the files are whole
    // once every rank is past this barrier.
    double done = 1;
    PIPER_RETURN_IF_ERROR(
        collective(comm->allReduceSumWorld(&done, 1).withContext(
            who +
            ": waiting for every rank to "
            "write checkpoint step " +
            std::to_string(step))));
  }
  if (rank != 0)
    return Status::ok();

  auto fail = [&](const std::string &what) {
    return Status::error(
        fmt::format("{}: checkpoint '{}': {}", who, finalDir, what));
  };
  CheckpointManifest state;
  state.step = step;
  state.layout = sharded ? "shards" : "whole";
  state.runId = exec.runId();
  state.run = identityJson(identity);
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
  // Every file's size and CRC-32s (from its header: each writer computed
  // them from the bytes it wrote), the manifest written last.
  for (const std::string &name : written) {
    ManifestFile file;
    Status described =
        describeCheckpointFile(tmpDir, name, state.runId, step, file);
    if (!described)
      return fail(described.message());
    stats.bytes += static_cast<int64_t>(file.bytes);
    state.files.push_back(std::move(file));
  }
  std::string text = formatCheckpointManifest(state);
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
    // A line that is not a metrics object with an integer step is dropped.
    StatusOr<Json> object = parseJson(line);
    StatusOr<int64_t> lineStep =
        object ? jsonInt(*object, "step") : object.status();
    if (lineStep && *lineStep <= step)
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

// state.json: parsing with every field's type checked, writing, and the
// verification of a checkpoint directory's files against it.
#include "runtime/formats/CheckpointManifest.h"

#include <map>
#include <set>

#include <sys/stat.h>

#include <fmt/format.h>

#include "runtime/formats/Integrity.h"

namespace piper::runtime {

namespace {

/// A file name that stays in the checkpoint's directory.
bool isPlainName(const std::string &name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

/// A CRC-32 member of `object` (8 hex digits).
Status crcField(const Json &object, const std::string &key, uint32_t &out) {
  PIPER_ASSIGN_OR_RETURN(std::string text, jsonString(object, key));
  if (!parseCrc32(text, out))
    return Status::error(fmt::format("{} is {}, expected 8 hex digits",
                                     jsonQuote(key), jsonQuote(text)));
  return Status::ok();
}

/// One entry of "files" of a version 3 manifest: {"bytes": N,
/// "header_crc32": "...", "tensors": {"<name>": "<crc>", ...}}.
Status parseFile(const Json &entry, ManifestFile &file) {
  PIPER_ASSIGN_OR_RETURN(file.bytes, jsonUint(entry, "bytes"));
  PIPER_RETURN_IF_ERROR(crcField(entry, "header_crc32", file.headerCrc));
  PIPER_ASSIGN_OR_RETURN(const Json *tensors, jsonObject(entry, "tensors"));
  for (const auto &[name, value] : tensors->items()) {
    uint32_t crc;
    PIPER_RETURN_IF_ERROR(
        crcField(*tensors, name, crc).withContext("\"tensors\""));
    (void)value;
    file.tensors.emplace_back(name, crc);
  }
  return Status::ok();
}

Status parseFiles(const Json &root, CheckpointManifest &out) {
  PIPER_ASSIGN_OR_RETURN(const Json *files, jsonObject(root, "files"));
  for (const auto &[name, value] : files->items()) {
    if (!isPlainName(name))
      return Status::error(fmt::format(
          "\"files\": {} is not a file name of the checkpoint's directory",
          jsonQuote(name)));
    ManifestFile file;
    file.name = name;
    if (out.checksummed()) {
      PIPER_RETURN_IF_ERROR(
          parseFile(value, file)
              .withContext(fmt::format("\"files\": {}", jsonQuote(name))));
    } else {
      PIPER_ASSIGN_OR_RETURN(file.bytes,
                             jsonUint(*files, name).withContext("\"files\""));
    }
    out.files.push_back(std::move(file));
  }
  return Status::ok();
}

} // namespace

Status parseCheckpointManifest(const std::string &text,
                               CheckpointManifest &out) {
  out = CheckpointManifest();
  PIPER_ASSIGN_OR_RETURN(Json root, parseJson(text));
  if (!root.is_object())
    return Status::error(
        fmt::format("expected a JSON object, found {}", jsonKindName(root)));
  PIPER_ASSIGN_OR_RETURN(std::string format, jsonString(root, "format"));
  if (format != kCheckpointFormat)
    return Status::error(fmt::format("\"format\" is {}, not \"{}\"",
                                     jsonQuote(format), kCheckpointFormat));
  PIPER_ASSIGN_OR_RETURN(out.version, jsonInt(root, "version"));
  if (out.version < 1)
    return Status::error(
        fmt::format("\"version\" is {}, expected 1 or more", out.version));
  if (out.version > kCheckpointVersion)
    return Status::error(fmt::format(
        "written by a newer piper (version {}; this one reads up to {})",
        out.version, kCheckpointVersion));
  PIPER_ASSIGN_OR_RETURN(out.step, jsonInt(root, "step"));
  if (out.step < 0)
    return Status::error(
        fmt::format("\"step\" is {}, expected 0 or more", out.step));
  // Before version 3 "layout" and "run" could be absent (whole; no run).
  if (out.checksummed() || jsonHas(root, "layout")) {
    PIPER_ASSIGN_OR_RETURN(out.layout, jsonString(root, "layout"));
  }
  if (out.layout != "whole" && out.layout != "shards")
    return Status::error(
        fmt::format("\"layout\" is {}, expected \"whole\" or \"shards\"",
                    jsonQuote(out.layout)));
  if (out.checksummed() || jsonHas(root, "run")) {
    PIPER_ASSIGN_OR_RETURN(const Json *run, jsonObject(root, "run"));
    out.run = *run;
  }
  if (out.checksummed()) {
    PIPER_ASSIGN_OR_RETURN(out.runId, jsonString(root, "run_id"));
    if (!isRunId(out.runId))
      return Status::error(fmt::format("\"run_id\" is {}, expected 32 "
                                       "lowercase hex digits",
                                       jsonQuote(out.runId)));
  }
  return parseFiles(root, out);
}

std::string formatCheckpointManifest(const CheckpointManifest &m) {
  Json files = Json::object();
  for (const ManifestFile &f : m.files) {
    if (!m.checksummed()) {
      files[f.name] = f.bytes;
      continue;
    }
    Json tensors = Json::object();
    for (const auto &[name, crc] : f.tensors)
      tensors[name] = formatCrc32(crc);
    files[f.name] = Json{{"bytes", f.bytes},
                         {"header_crc32", formatCrc32(f.headerCrc)},
                         {"tensors", tensors}};
  }
  Json state = {{"format", kCheckpointFormat},
                {"version", m.version},
                {"step", m.step},
                {"layout", m.layout}};
  if (m.checksummed())
    state["run_id"] = m.runId;
  state["run"] = m.run.is_null() ? Json::object() : m.run;
  state["files"] = files;
  return state.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

Status describeCheckpointFile(const std::string &dir, const std::string &name,
                              const std::string &runId, int64_t step,
                              ManifestFile &out) {
  const std::string path = dir + "/" + name;
  out = ManifestFile();
  out.name = name;
  Status st;
  auto reader = SafetensorsReader::open(path, st);
  if (!reader)
    return st;
  std::string fileRunId;
  int64_t fileStep = 0;
  PIPER_RETURN_IF_ERROR(recordedRunId(*reader, fileRunId));
  PIPER_RETURN_IF_ERROR(checkpointStep(*reader, fileStep));
  if (fileRunId != runId || fileStep != step)
    return Status::error(fmt::format(
        "checkpoint '{}': internal: written with run id '{}' and step {}, "
        "expected '{}' and {}",
        path, fileRunId, fileStep, runId, step));
  std::map<std::string, uint32_t> crcs;
  bool present = false;
  PIPER_RETURN_IF_ERROR(recordedCrcs(*reader, crcs, present));
  if (!present)
    return Status::error(fmt::format(
        "checkpoint '{}': internal: written without CRC-32s", path));
  out.bytes = reader->fileSize();
  out.headerCrc = reader->headerCrc32();
  for (const SafetensorsEntry &e : reader->tensors())
    out.tensors.emplace_back(e.name, crcs.at(e.name));
  return Status::ok();
}

namespace {

/// The checks of one version 3 file after its size: run id, step, header
/// CRC-32, tensor names, then every tensor's bytes.
Status verifyFile(const SafetensorsReader &reader,
                  const CheckpointManifest &manifest,
                  const ManifestFile &file) {
  const std::string &path = reader.path();
  std::string runId;
  PIPER_RETURN_IF_ERROR(recordedRunId(reader, runId));
  if (runId != manifest.runId)
    return Status::error(fmt::format(
        "checkpoint '{}' is of another run: its run id is {}, state.json's "
        "is '{}' (a file copied from another run's checkpoint?)",
        path, runId.empty() ? "missing" : "'" + runId + "'", manifest.runId));
  int64_t step = 0;
  PIPER_RETURN_IF_ERROR(checkpointStep(reader, step));
  if (step != manifest.step)
    return Status::error(
        fmt::format("checkpoint '{}' holds step {}, state.json step {}", path,
                    step, manifest.step));
  if (reader.headerCrc32() != file.headerCrc)
    return Status::error(fmt::format(
        "checkpoint '{}': its header does not match its CRC-32 in "
        "state.json (recorded {}, read {}): the file was corrupted or "
        "replaced",
        path, formatCrc32(file.headerCrc), formatCrc32(reader.headerCrc32())));
  std::map<std::string, uint32_t> expected(file.tensors.begin(),
                                           file.tensors.end());
  for (const SafetensorsEntry &e : reader.tensors())
    if (!expected.count(e.name))
      return Status::error(fmt::format(
          "checkpoint '{}': tensor '{}' is not in state.json", path, e.name));
  for (const auto &[name, crc] : file.tensors)
    if (!reader.find(name))
      return Status::error(fmt::format(
          "checkpoint '{}': state.json lists tensor '{}', which the file "
          "does not hold",
          path, name));
  return verifyTensors(reader, &expected, "state.json");
}

} // namespace

Status
verifyCheckpointDir(const std::string &dir, const CheckpointManifest &manifest,
                    std::vector<std::unique_ptr<SafetensorsReader>> &readers,
                    CheckpointFault &fault) {
  readers.clear();
  fault = CheckpointFault::None;
  auto failed = [&](CheckpointFault kind, Status st) {
    fault = kind;
    readers.clear();
    return st;
  };
  for (const ManifestFile &file : manifest.files) {
    const std::string path = dir + "/" + file.name;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0)
      return failed(CheckpointFault::Incomplete,
                    Status::error(fmt::format("'{}' is missing", path)));
    // Sizes are recorded from version 1 on (0 could mean "not recorded"
    // only in files no piper wrote).
    if (static_cast<uint64_t>(st.st_size) != file.bytes)
      return failed(CheckpointFault::Incomplete,
                    Status::error(fmt::format("'{}' has {} bytes, {} were "
                                              "written",
                                              path, st.st_size, file.bytes)));
    Status opened;
    auto reader = SafetensorsReader::open(path, opened);
    if (!reader)
      return failed(manifest.checksummed() ? CheckpointFault::Corrupt
                                           : CheckpointFault::Incomplete,
                    opened);
    Status checked;
    if (manifest.checksummed()) {
      checked = verifyFile(*reader, manifest, file);
    } else {
      int64_t step = 0;
      checked = checkpointStep(*reader, step);
      if (checked && step != manifest.step)
        checked = Status::error(
            fmt::format("checkpoint '{}' holds step {}, state.json step {}",
                        path, step, manifest.step));
      if (checked)
        checked = verifyTensors(*reader);
    }
    if (!checked)
      return failed(CheckpointFault::Corrupt, checked);
    readers.push_back(std::move(reader));
  }
  return Status::ok();
}

} // namespace piper::runtime

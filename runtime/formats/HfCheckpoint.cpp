// Hugging Face model folders: see HfCheckpoint.h.
#include "runtime/formats/HfCheckpoint.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "proto/InputFile.h"
#include "runtime/formats/Json.h"
#include "support/AtomicFile.h"
#include "support/Errno.h"
#include "support/Precision.h"

namespace piper::runtime {

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

namespace {

/// The limit on index files (a large index is a few MB); config.json has
/// kMaxHfConfigBytes.
constexpr int64_t kMaxIndexFileBytes = int64_t(256) << 20;
/// Problems one error lists before "and N more".
constexpr size_t kMaxListed = 20;

/// Reads the text file at `path` with the shared input reader: a regular
/// file (a FIFO, a device or a symlink to one refused unread) of at most
/// `limit` bytes.
Status readText(const std::string &path, std::string &out, int64_t limit) {
  if (std::string err = readInputFile(path, out, limit); !err.empty())
    return Status::error(inputError("file", path, err));
  return Status::ok();
}

int64_t numel(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// Where a placed source lies in its parameter: `rows` rows of `cols`
/// elements, row r starting at element `base + r * stride`.
struct Layout {
  int64_t rows = 1, cols = 0, stride = 0, base = 0;
};

/// The layout of `s` in parameter `p`, or an error when it does not fit
/// (the compiler checks this; a damaged plan may not).
Status layoutOf(const HfParam &p, const HfPlacement &s, Layout &out) {
  std::vector<int64_t> placed = s.shape;
  if (s.transpose && placed.size() == 2)
    std::swap(placed[0], placed[1]);
  const std::vector<int64_t> &g = p.shape;
  bool fits = !placed.empty() && placed.size() <= 2 && !g.empty() &&
              (!s.transpose || placed.size() == 2) && s.offset >= 0 &&
              s.index >= 0 && g.size() >= placed.size() &&
              g.size() - placed.size() <= 1;
  const size_t lead = fits ? g.size() - placed.size() : 0;
  if (fits) {
    fits = (lead == 0 ? s.index == 0 : s.index < g[0]) &&
           s.offset + placed.back() <= g.back() &&
           (placed.size() == 1 || placed[0] == g[lead]);
    for (int64_t d : placed)
      fits = fits && d > 0;
  }
  if (!fits)
    return Status::error(fmt::format(
        "Hugging Face tensor '{}' of shape {} does not fit parameter '{}' of "
        "shape {}",
        s.name, formatShape(s.shape), p.name, formatShape(p.shape)));
  out.rows = placed.size() == 2 ? placed[0] : 1;
  out.cols = placed.back();
  out.stride = g.back();
  out.base = (lead ? s.index * (numel(g) / g[0]) : 0) + s.offset;
  return Status::ok();
}

/// Source `s`'s elements out of parameter `param`.
void extract(const HfPlacement &s, const Layout &l, const float *param,
             float *dst) {
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t c = 0; c < l.cols; ++c)
      (s.transpose ? dst[c * l.rows + r] : dst[r * l.cols + c]) =
          param[l.base + r * l.stride + c];
}

/// Float16 bits to float (exact).
float f16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else { // subnormal: normalize
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits =
        sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FFu) << 13);
  }
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

bool readableDType(const std::string &dtype) {
  return dtype == "F32" || dtype == "BF16" || dtype == "F16";
}

/// Tensors a folder may hold that no parameter is made of, and which
/// `transformers` ignores as well.
bool ignorable(const std::string &name, const std::set<std::string> &used) {
  auto endsWith = [&](const char *suffix) {
    size_t n = std::strlen(suffix);
    return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
  };
  if (endsWith(".rotary_emb.inv_freq") || endsWith(".attn.bias") ||
      endsWith(".attn.masked_bias"))
    return true; // buffers older checkpoints saved (rotary, GPT-2's masks)
  // A tied head: transformers ties lm_head to the embedding and drops it.
  return name == "lm_head.weight" && (used.count("model.embed_tokens.weight") ||
                                      used.count("transformer.wte.weight"));
}

} // namespace

std::unique_ptr<HfFolder> HfFolder::open(const std::string &dir,
                                         Status &status) {
  const std::string who = "Hugging Face folder '" + dir + "': ";
  std::unique_ptr<HfFolder> f(new HfFolder());
  f->folder = dir;
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    status = Status::error(who + "not a directory");
    return nullptr;
  }
  // A config.json that is there but not a regular file (a FIFO, a
  // symlink to /dev/zero) is an error, not an absent configuration.
  const std::string configPath = dir + "/" + kHfConfigFile;
  struct stat link;
  if (::lstat(configPath.c_str(), &link) == 0) {
    status = readText(configPath, f->config, kMaxHfConfigBytes)
                 .withContext(who.substr(0, who.size() - 2));
    if (!status)
      return nullptr;
  }
  auto openFile = [&](const std::string &name) -> SafetensorsReader * {
    std::unique_ptr<SafetensorsReader> r =
        SafetensorsReader::open(dir + "/" + name, status);
    if (!r) {
      status = status.withContext(who.substr(0, who.size() - 2));
      return nullptr;
    }
    f->files.push_back(std::move(r));
    return f->files.back().get();
  };
  // transformers' order: the single file first, then the index.
  const std::string single = dir + "/" + kHfWeightsFile;
  const std::string index = dir + "/" + kHfIndexFile;
  if (isRegularFile(single) || !isRegularFile(index)) {
    if (!isRegularFile(single)) {
      status = Status::error(who + "has neither " + kHfWeightsFile + " nor " +
                             kHfIndexFile);
      return nullptr;
    }
    SafetensorsReader *r = openFile(kHfWeightsFile);
    if (!r)
      return nullptr;
    for (const SafetensorsEntry &e : r->tensors())
      f->where[e.name] = 0;
    status = Status::ok();
    return f;
  }
  std::string text;
  status = readText(index, text, kMaxIndexFileBytes);
  StatusOr<Json> root = status ? parseJson(text) : StatusOr<Json>(status);
  StatusOr<const Json *> found =
      root ? jsonObject(*root, "weight_map") : root.status();
  if (!found) {
    status = found.status().withContext(who + kHfIndexFile);
    return nullptr;
  }
  const Json *map = *found;
  std::map<std::string, size_t> fileIndex;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it.value().is_string()) {
      status = Status::error(who + kHfIndexFile + ": weight_map[" +
                             jsonQuote(it.key()) + "] is " +
                             jsonKindName(it.value()) + ", expected a string");
      return nullptr;
    }
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." ||
        file == "..") {
      status = Status::error(who + kHfIndexFile + ": weight_map[" +
                             jsonQuote(it.key()) + "] names " +
                             jsonQuote(file) + ", not a file of the folder");
      return nullptr;
    }
    auto [pos, fresh] = fileIndex.emplace(file, f->files.size());
    if (fresh && !openFile(file))
      return nullptr;
    const SafetensorsReader &r = *f->files[pos->second];
    if (!r.find(it.key())) {
      status =
          Status::error(who + kHfIndexFile + " maps " + jsonQuote(it.key()) +
                        " to " + file + ", which does not hold it");
      return nullptr;
    }
    f->where[it.key()] = pos->second;
  }
  for (const auto &[file, i] : fileIndex)
    for (const SafetensorsEntry &e : f->files[i]->tensors()) {
      auto w = f->where.find(e.name);
      if (w == f->where.end() || w->second != i) {
        status = Status::error(
            who + file + " holds " + jsonQuote(e.name) + ", which " +
            kHfIndexFile +
            (w == f->where.end() ? " does not list" : " maps to another file"));
        return nullptr;
      }
    }
  status = Status::ok();
  return f;
}

std::vector<std::string> HfFolder::names() const {
  std::vector<std::string> out;
  for (const auto &[name, file] : where)
    out.push_back(name);
  return out;
}

std::string HfFolder::resolve(const std::string &name) const {
  if (where.count(name))
    return name;
  for (const char *prefix : {"transformer.", "model."}) {
    const size_t n = std::strlen(prefix);
    if (name.compare(0, n, prefix) == 0 && where.count(name.substr(n)))
      return name.substr(n);
  }
  return "";
}

const SafetensorsEntry *HfFolder::find(const std::string &name) const {
  auto it = where.find(resolve(name));
  return it == where.end() ? nullptr : files[it->second]->find(it->first);
}

Status HfFolder::readFloat(const std::string &name,
                           std::vector<float> &out) const {
  auto it = where.find(resolve(name));
  if (it == where.end())
    return Status::error("Hugging Face folder '" + folder +
                         "' has no tensor '" + name + "'");
  const SafetensorsReader &r = *files[it->second];
  const SafetensorsEntry &e = *r.find(it->first);
  if (!readableDType(e.dtype))
    return Status::error(
        fmt::format("{}: tensor '{}' is {}; Piper reads F32, BF16 and F16",
                    r.path(), name, e.dtype));
  const size_t n = static_cast<size_t>(numel(e.shape));
  out.resize(n);
  if (e.dtype == "F32")
    return r.read(e, out.data());
  std::vector<uint16_t> half(n);
  PIPER_RETURN_IF_ERROR(r.read(e, half.data()));
  for (size_t i = 0; i < n; ++i)
    out[i] = e.dtype == "BF16" ? bf16ToFloat(half[i]) : f16ToFloat(half[i]);
  return Status::ok();
}

Status checkHfFolder(const HfFolder &folder,
                     const std::vector<HfParam> &params) {
  std::vector<std::string> problems;
  std::set<std::string> used;
  for (const HfParam &p : params) {
    int64_t covered = 0;
    for (const HfPlacement &s : p.sources) {
      Layout l;
      if (Status st = layoutOf(p, s, l); !st) {
        problems.push_back(st.message());
        continue;
      }
      covered += numel(s.shape);
      used.insert(s.name);
      if (std::string stored = folder.resolve(s.name); !stored.empty())
        used.insert(stored);
      const SafetensorsEntry *e = folder.find(s.name);
      if (!e)
        problems.push_back(fmt::format("missing tensor '{}' (of parameter "
                                       "'{}')",
                                       s.name, p.name));
      else if (e->shape != s.shape)
        problems.push_back(fmt::format(
            "tensor '{}' has shape {}, the model needs {} (parameter '{}')",
            s.name, formatShape(e->shape), formatShape(s.shape), p.name));
      else if (!readableDType(e->dtype))
        problems.push_back(
            fmt::format("tensor '{}' is {}; Piper reads F32, BF16 and F16",
                        s.name, e->dtype));
    }
    if (covered != numel(p.shape))
      problems.push_back(fmt::format(
          "parameter '{}': its Hugging Face tensors cover {} of its {} "
          "elements",
          p.name, covered, numel(p.shape)));
  }
  for (const std::string &name : folder.names())
    if (!used.count(name) && !ignorable(name, used))
      problems.push_back("unexpected tensor '" + name +
                         "' (no parameter of the model is made of it)");
  if (problems.empty())
    return Status::ok();
  std::string message =
      "Hugging Face folder '" + folder.dir() + "' does not fit the model:";
  for (size_t i = 0; i < problems.size() && i < kMaxListed; ++i)
    message += "\n  " + problems[i];
  if (problems.size() > kMaxListed)
    message += fmt::format("\n  and {} more", problems.size() - kMaxListed);
  return Status::error(message);
}

Status readHfParam(const HfFolder &folder, const HfParam &param,
                   std::vector<float> &out) {
  out.assign(static_cast<size_t>(numel(param.shape)), 0.0f);
  HfSourceCache cache;
  return readHfParamRange(folder, param, 0, static_cast<int64_t>(out.size()),
                          out.data(), cache);
}

Status readHfParamRange(const HfFolder &folder, const HfParam &param,
                        int64_t start, int64_t count, float *out,
                        HfSourceCache &cache) {
  const int64_t total = numel(param.shape), end = start + count;
  if (start < 0 || count < 0 || end > total)
    return Status::error(fmt::format(
        "Hugging Face folder '{}': internal: elements [{}, {}) of parameter "
        "'{}', which has {}",
        folder.dir(), start, end, param.name, total));
  std::fill(out, out + count, 0.0f);
  for (const HfPlacement &s : param.sources) {
    Layout l;
    PIPER_RETURN_IF_ERROR(layoutOf(param, s, l));
    // The source's elements lie in [first, last) of the global tensor.
    const int64_t first = l.base,
                  last = l.base + (l.rows - 1) * l.stride + l.cols;
    if (last <= start || first >= end)
      continue;
    auto it = cache.find(s.name);
    if (it == cache.end()) {
      std::vector<float> src;
      PIPER_RETURN_IF_ERROR(folder.readFloat(s.name, src));
      if (static_cast<int64_t>(src.size()) != numel(s.shape))
        return Status::error(fmt::format(
            "Hugging Face folder '{}': tensor '{}' has {} elements, the "
            "model needs {}",
            folder.dir(), s.name, src.size(), numel(s.shape)));
      // As --load FILE (Integrity.h): a training never starts from a
      // non-finite weight.
      for (size_t i = 0; i < src.size(); ++i)
        if (!std::isfinite(src[i]))
          return Status::error(fmt::format(
              "Hugging Face folder '{}': tensor '{}' holds a non-finite "
              "value ({} at element {}); piper does not start from it",
              folder.dir(), s.name, src[i], i));
      it = cache.emplace(s.name, std::move(src)).first;
    }
    const float *src = it->second.data();
    for (int64_t r = 0; r < l.rows; ++r) {
      const int64_t row = l.base + r * l.stride;
      const int64_t c0 = std::max<int64_t>(0, start - row);
      const int64_t c1 = std::min<int64_t>(l.cols, end - row);
      for (int64_t c = c0; c < c1; ++c)
        out[row + c - start] =
            s.transpose ? src[c * l.rows + r] : src[r * l.cols + c];
    }
  }
  return Status::ok();
}

Status checkHfConfigsMatch(const std::string &folderConfig,
                           const std::string &modelConfig,
                           const std::string &folderName) {
  // Keys that do not change the model (HfConfig.cpp's neutral keys).
  static const std::set<std::string> kNeutral = {
      "_name_or_path",     "transformers_version",
      "torch_dtype",       "dtype",
      "use_cache",         "_attn_implementation",
      "output_attentions", "output_hidden_states",
      "return_dict",       "tokenizer_class",
      "bos_token_id",      "eos_token_id",
      "pad_token_id"};
  const std::string who = folderName + "/" + kHfConfigFile;
  PIPER_ASSIGN_OR_RETURN(Json folder, parseJson(folderConfig).withContext(who));
  PIPER_ASSIGN_OR_RETURN(
      Json model, parseJson(modelConfig)
                      .withContext("the model's Hugging Face configuration"));
  if (!folder.is_object() || !model.is_object())
    return Status::error(who + ": not a JSON object");
  std::set<std::string> keys;
  for (const Json *obj : {&folder, &model})
    for (auto it = obj->begin(); it != obj->end(); ++it)
      keys.insert(it.key());
  std::vector<std::string> diffs;
  for (const std::string &k : keys) {
    if (kNeutral.count(k))
      continue;
    const bool inFolder = folder.contains(k), inModel = model.contains(k);
    if (inFolder && inModel && folder[k] == model[k])
      continue;
    diffs.push_back(fmt::format("{}: {} here, {} in the compiled model",
                                jsonQuote(k),
                                inFolder ? folder[k].dump() : "absent",
                                inModel ? model[k].dump() : "absent"));
  }
  if (diffs.empty())
    return Status::ok();
  std::string message =
      who + " describes another model than the one compiled (piperc model "
            "--hf):";
  for (const std::string &d : diffs)
    message += "\n  " + d;
  return Status::error(message);
}

namespace {

/// The export itself, into the empty folder `dir`.
Status writeHfFolderInto(const std::string &dir, const std::string &configText,
                         const std::vector<HfParam> &params,
                         const HfParamReader &read, const std::string &dtype,
                         uint64_t maxShardBytes) {
  const int width = dtype == "F32" ? 4 : 2;
  // The tensors in parameter order, cut into shards.
  struct Out {
    size_t param, source;
    uint64_t bytes;
  };
  std::vector<std::vector<Out>> shards(1);
  uint64_t shardBytes = 0, total = 0;
  for (size_t p = 0; p < params.size(); ++p)
    for (size_t s = 0; s < params[p].sources.size(); ++s) {
      Layout l;
      PIPER_RETURN_IF_ERROR(layoutOf(params[p], params[p].sources[s], l));
      uint64_t bytes =
          static_cast<uint64_t>(width * numel(params[p].sources[s].shape));
      if (!shards.back().empty() && shardBytes + bytes > maxShardBytes) {
        shards.emplace_back();
        shardBytes = 0;
      }
      shards.back().push_back(Out{p, s, bytes});
      shardBytes += bytes;
      total += bytes;
    }
  const size_t n = shards.size();
  auto fileName = [&](size_t k) {
    return n == 1 ? std::string(kHfWeightsFile)
                  : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, n);
  };
  Json weightMap = Json::object();
  size_t cached = params.size();
  std::vector<float> whole;
  for (size_t k = 0; k < n; ++k) {
    std::vector<std::vector<char>> data;
    std::vector<SafetensorsTensor> tensors;
    data.reserve(shards[k].size());
    for (const Out &o : shards[k]) {
      const HfParam &p = params[o.param];
      const HfPlacement &s = p.sources[o.source];
      if (cached != o.param) {
        PIPER_RETURN_IF_ERROR(read(p, whole));
        if (static_cast<int64_t>(whole.size()) != numel(p.shape))
          return Status::error("Hugging Face export: internal: parameter '" +
                               p.name + "' read with a wrong size");
        cached = o.param;
      }
      Layout l;
      PIPER_RETURN_IF_ERROR(layoutOf(p, s, l));
      std::vector<float> src(static_cast<size_t>(numel(s.shape)));
      extract(s, l, whole.data(), src.data());
      data.emplace_back(static_cast<size_t>(o.bytes));
      if (width == 4) {
        std::memcpy(data.back().data(), src.data(), data.back().size());
      } else {
        auto *bf = reinterpret_cast<uint16_t *>(data.back().data());
        for (size_t i = 0; i < src.size(); ++i)
          bf[i] = floatToBf16(src[i]);
      }
      tensors.push_back(
          SafetensorsTensor{s.name, dtype, s.shape, data.back().data()});
      weightMap[s.name] = fileName(k);
    }
    PIPER_RETURN_IF_ERROR(
        writeSafetensors(dir + "/" + fileName(k), tensors, {{"format", "pt"}}));
  }
  auto writeText = [&](const std::string &name, const std::string &text) {
    AtomicFile f;
    PIPER_RETURN_IF_ERROR(f.open(dir + "/" + name));
    PIPER_RETURN_IF_ERROR(f.write(text.data(), text.size()));
    return f.commit();
  };
  if (n > 1) {
    Json index = Json::object();
    index["metadata"] = Json::object({{"total_size", total}});
    index["weight_map"] = weightMap;
    PIPER_RETURN_IF_ERROR(writeText(kHfIndexFile, index.dump(2) + "\n"));
  }
  return writeText(kHfConfigFile, configText);
}

/// Whether `name` is a file an export writes (the others of a folder are
/// carried over to the next export).
bool exportFile(const std::string &name) {
  if (name == kHfConfigFile || name == kHfWeightsFile || name == kHfIndexFile)
    return true;
  // model-00001-of-00003.safetensors
  unsigned k = 0, n = 0;
  char tail[32] = {0};
  return std::sscanf(name.c_str(), "model-%5u-of-%5u.%31s", &k, &n, tail) ==
             3 &&
         std::string(tail) == "safetensors";
}

/// rm -rf `path`.
Status removeTree(const std::string &path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec)
    return Status::error("cannot remove '" + path + "': " + ec.message());
  return Status::ok();
}

/// The names in folder `dir` that `keep` accepts.
template <class F>
Status listFolder(const std::string &dir, F keep,
                  std::vector<std::string> &names) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec))
    if (std::string name = it->path().filename().string(); keep(name))
      names.push_back(name);
  if (ec)
    return Status::error("cannot list '" + dir + "': " + ec.message());
  return Status::ok();
}

/// Removes the temporary folders earlier exports to `base` left in
/// `parent` (killed before their exchange).
Status removeStaleExports(const std::string &parent, const std::string &base) {
  const std::string prefix = "." + base + ".piper-export-";
  std::vector<std::string> stale;
  PIPER_RETURN_IF_ERROR(listFolder(
      parent,
      [&](const std::string &name) {
        return name.compare(0, prefix.size(), prefix) == 0;
      },
      stale));
  for (const std::string &name : stale)
    PIPER_RETURN_IF_ERROR(removeTree(parent + "/" + name)
                              .withContext("removing an earlier export's "
                                           "temporary folder"));
  return Status::ok();
}

/// Carries the files of `dir` that are not an export's into `tmp`
/// (hard links: nothing is copied, `dir` keeps them until the exchange).
Status carryOver(const std::string &dir, const std::string &tmp) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  PIPER_RETURN_IF_ERROR(listFolder(
      dir, [](const std::string &name) { return !exportFile(name); }, names));
  for (const std::string &name : names) {
    const fs::path from = dir + "/" + name, to = tmp + "/" + name;
    std::error_code ec;
    fs::file_status status = fs::symlink_status(from, ec);
    if (ec)
      continue; // gone since it was listed
    if (fs::is_symlink(status))
      fs::copy_symlink(from, to, ec);
    else if (fs::is_regular_file(status))
      fs::create_hard_link(from, to, ec);
    else
      return Status::error(
          "'" + from.string() +
          "' is a folder or special file; an export to a folder replaces it "
          "whole and carries over only files (move it out of the folder)");
    if (ec)
      return Status::error("cannot carry '" + from.string() +
                           "' over: " + ec.message());
  }
  return Status::ok();
}

} // namespace

Status writeHfFolder(const std::string &dirGiven, const std::string &configText,
                     const std::vector<HfParam> &params,
                     const HfParamReader &read, const std::string &dtype,
                     uint64_t maxShardBytes) {
  if (dtype != "F32" && dtype != "BF16")
    return Status::error("Hugging Face export: dtype " + dtype +
                         " is not F32 or BF16");
  // A folder given through a symbolic link is exchanged where it is.
  std::string dir = dirGiven;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  bool exists = false;
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      return Status::error("'" + dir + "' is not a folder");
    exists = true;
    if (char *real = ::realpath(dir.c_str(), nullptr)) {
      dir = real;
      std::free(real);
    }
  }
  const std::string parent = parentDirectory(dir),
                    base = std::filesystem::path(dir).filename().string();
  PIPER_RETURN_IF_ERROR(makeDirectories(parent));
  PIPER_RETURN_IF_ERROR(removeStaleExports(parent, base));
  const std::string tmp = parent + "/." + base + ".piper-export-" +
                          std::to_string(static_cast<long>(::getpid()));
  if (::mkdir(tmp.c_str(), 0777) != 0)
    return Status::error("cannot create '" + tmp + "': " + errnoMessage(errno));
  Status st2 = [&]() -> Status {
    PIPER_RETURN_IF_ERROR(
        writeHfFolderInto(tmp, configText, params, read, dtype, maxShardBytes));
    if (exists) {
      PIPER_RETURN_IF_ERROR(carryOver(dir, tmp));
      ::chmod(tmp.c_str(), st.st_mode & 07777);
    }
    PIPER_RETURN_IF_ERROR(syncDirectory(tmp));
    if (!exists) {
      if (::rename(tmp.c_str(), dir.c_str()) != 0)
        return Status::error("cannot rename '" + tmp + "' to '" + dir +
                             "': " + errnoMessage(errno));
      return syncDirectory(parent);
    }
    // One atomic step: the new export takes the folder's place, the earlier
    // one goes to the temporary name and is removed.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(),
                    RENAME_EXCHANGE) != 0)
      return Status::error("cannot exchange '" + tmp + "' with '" + dir +
                           "' (renameat2 RENAME_EXCHANGE): " +
                           errnoMessage(errno) + "; the folder is unchanged");
    PIPER_RETURN_IF_ERROR(syncDirectory(parent));
    return removeTree(tmp).withContext(
        "the export is complete; removing the earlier one");
  }();
  if (!st2) {
    Status cleaned = removeTree(tmp);
    (void)cleaned; // the export's own error is the one to report
  }
  return st2;
}

} // namespace piper::runtime

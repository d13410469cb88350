// Reading a rank's place from the variables of the launcher that started
// it, and Slurm's compressed host lists.
#include "runtime/launch/rendezvous/LaunchEnv.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include <fmt/format.h>

namespace piper::runtime {

namespace {

/// One piece of a host-list item: literal text, or a bracket of ranges.
struct Piece {
  std::string text;
  /// [lo, hi] pairs with the zero-padded width of lo; empty for text.
  struct Range {
    uint64_t lo, hi;
    size_t width;
  };
  std::vector<Range> ranges;
};

std::string padded(uint64_t v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width)
    s.insert(0, width - s.size(), '0');
  return s;
}

Status parseNumber(const std::string &list, const std::string &text,
                   uint64_t &v) {
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos)
    return Status::error(fmt::format(
        "host list '{}': '{}' is not a number in brackets", list, text));
  v = std::stoull(text);
  return Status::ok();
}

/// Splits `list` at the commas outside brackets.
Status splitItems(const std::string &list, std::vector<std::string> &items) {
  int depth = 0;
  std::string item;
  for (char c : list) {
    if (c == '[')
      ++depth;
    if (c == ']')
      --depth;
    if (depth < 0 || depth > 1)
      return Status::error(
          fmt::format("host list '{}': unbalanced brackets", list));
    if (c == ',' && depth == 0) {
      items.push_back(item);
      item.clear();
    } else {
      item += c;
    }
  }
  if (depth != 0)
    return Status::error(
        fmt::format("host list '{}': unbalanced brackets", list));
  items.push_back(item);
  for (const std::string &i : items)
    if (i.empty())
      return Status::error(fmt::format("host list '{}': an empty host", list));
  return Status::ok();
}

Status parseItem(const std::string &list, const std::string &item,
                 std::vector<Piece> &pieces) {
  size_t pos = 0;
  while (pos < item.size()) {
    size_t open = item.find('[', pos);
    if (open != pos) {
      Piece text;
      text.text = item.substr(pos, open - pos);
      pieces.push_back(text);
      if (open == std::string::npos)
        break;
    }
    size_t close = item.find(']', open);
    std::string inside = item.substr(open + 1, close - open - 1);
    Piece bracket;
    size_t start = 0;
    while (start <= inside.size()) {
      size_t comma = inside.find(',', start);
      std::string range =
          inside.substr(start, comma == std::string::npos ? std::string::npos
                                                          : comma - start);
      size_t dash = range.find('-');
      std::string loText = range.substr(0, dash);
      std::string hiText =
          dash == std::string::npos ? loText : range.substr(dash + 1);
      Piece::Range r;
      PIPER_RETURN_IF_ERROR(parseNumber(list, loText, r.lo));
      PIPER_RETURN_IF_ERROR(parseNumber(list, hiText, r.hi));
      if (r.hi < r.lo)
        return Status::error(fmt::format(
            "host list '{}': the range '{}' runs backwards", list, range));
      r.width = loText.size();
      bracket.ranges.push_back(r);
      if (comma == std::string::npos)
        break;
      start = comma + 1;
    }
    pieces.push_back(bracket);
    pos = close + 1;
  }
  return Status::ok();
}

/// A variable's value, or "" when unset.
std::string value(const EnvLookup &env, const char *name) {
  const char *v = env(name);
  return v ? v : "";
}

/// Reads the integer variable `name`: false when unset or empty; an error
/// when it is not an integer.
Status intVar(const EnvLookup &env, const char *name, bool &set,
              long long &out) {
  std::string text = value(env, name);
  set = !text.empty();
  if (!set)
    return Status::ok();
  char *end = nullptr;
  errno = 0;
  out = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0')
    return Status::error(fmt::format("{}='{}' is not an integer", name, text));
  return Status::ok();
}

/// A port: from MASTER_PORT when set, else `fallback`.
Status masterPort(const EnvLookup &env, int fallback, int &port) {
  // Set but empty is a launcher's mistake, not "unset": the ranks would
  // meet on a default port nobody chose.
  if (const char *raw = env("MASTER_PORT"); raw && !*raw)
    return Status::error("MASTER_PORT is set but empty: give rank 0's free "
                         "TCP port (1-65535), or unset it");
  bool set = false;
  long long p = 0;
  PIPER_RETURN_IF_ERROR(intVar(env, "MASTER_PORT", set, p));
  if (!set) {
    port = fallback;
    return Status::ok();
  }
  if (p < 1 || p > 65535)
    return Status::error(
        fmt::format("MASTER_PORT={} is not a TCP port (1-65535)", p));
  port = static_cast<int>(p);
  return Status::ok();
}

/// A port from a launcher's job id, so that two jobs on one machine do not
/// pick the same one: 20000 + (a hash of the id) % 10000.
int portFromJobId(const std::string &jobId) {
  if (jobId.empty())
    return 29500;
  uint64_t h = 14695981039346656037ull;
  for (char c : jobId)
    h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return 20000 + static_cast<int>(h % 10000);
}

/// Reads one launcher's rank, world and local rank.
struct Scheme {
  const char *launcher;
  const char *rankVar, *worldVar, *localVar;
};

} // namespace

Status expandNodeList(const std::string &list, std::vector<std::string> &hosts,
                      size_t limit) {
  hosts.clear();
  std::vector<std::string> items;
  PIPER_RETURN_IF_ERROR(splitItems(list, items));
  for (const std::string &item : items) {
    std::vector<Piece> pieces;
    PIPER_RETURN_IF_ERROR(parseItem(list, item, pieces));
    std::vector<std::string> names = {""};
    for (const Piece &p : pieces) {
      std::vector<std::string> next;
      for (const std::string &prefix : names) {
        if (p.ranges.empty()) {
          next.push_back(prefix + p.text);
          continue;
        }
        for (const Piece::Range &r : p.ranges)
          for (uint64_t v = r.lo; v <= r.hi; ++v) {
            if (hosts.size() + next.size() >= limit)
              return Status::error(fmt::format(
                  "host list '{}': more than {} hosts", list, limit));
            next.push_back(prefix + padded(v, r.width));
          }
      }
      names.swap(next);
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
  }
  return Status::ok();
}

Status firstNodeListHost(const std::string &list, std::string &host) {
  std::vector<std::string> items;
  PIPER_RETURN_IF_ERROR(splitItems(list, items));
  std::vector<Piece> pieces;
  PIPER_RETURN_IF_ERROR(parseItem(list, items.front(), pieces));
  host.clear();
  for (const Piece &p : pieces)
    host +=
        p.ranges.empty() ? p.text : padded(p.ranges[0].lo, p.ranges[0].width);
  return Status::ok();
}

Status readRankEnv(int nproc, bool &isRank, RankEnv &out) {
  return readRankEnv(
      nproc, [](const char *name) { return std::getenv(name); }, isRank, out);
}

std::string jobName(const RankEnv &env) {
  return env.jobId.empty() ? env.launcher : env.launcher + ":" + env.jobId;
}

/// Reads the launcher's place (readRankEnv without the job id).
static Status readPlace(int nproc, const EnvLookup &env, bool &isRank,
                        RankEnv &out);

Status readRankEnv(int nproc, const EnvLookup &env, bool &isRank,
                   RankEnv &out) {
  PIPER_RETURN_IF_ERROR(readPlace(nproc, env, isRank, out));
  if (!isRank)
    return Status::ok();
  // An explicit id names the job whatever started it (PIPER_JOB_TOKEN is
  // its older name).
  const char *var = "the launcher's job id";
  for (const char *name : {"PIPER_JOB_ID", "PIPER_JOB_TOKEN"})
    if (!value(env, name).empty()) {
      out.jobId = value(env, name);
      var = name;
      break;
    }
  bool printable = std::all_of(out.jobId.begin(), out.jobId.end(), [](char c) {
    return c > ' ' && c < 127 && c != '\'' && c != '"' && c != '\\';
  });
  if (out.jobId.size() > kMaxJobIdSize || !printable)
    return Status::error(fmt::format(
        "{} '{}' is not a job id: at most {} printable characters without "
        "spaces or quotes",
        var, out.jobId.substr(0, 64), kMaxJobIdSize));
  return Status::ok();
}

static Status readPlace(int nproc, const EnvLookup &env, bool &isRank,
                        RankEnv &out) {
  isRank = false;
  out = RankEnv();
  // Under Slurm, only an srun step (SLURM_STEP_ID) holds ranks: a batch
  // script also has SLURM_PROCID, and there piper-run is the launcher.
  bool inSrunStep = !value(env, "SLURM_STEP_ID").empty() ||
                    !value(env, "SLURM_STEPID").empty();
  const Scheme schemes[] = {
      {"piper-run", "PIPER_RANK", "PIPER_WORLD_SIZE", nullptr},
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
       "OMPI_COMM_WORLD_LOCAL_RANK"}};
  const Scheme *scheme = nullptr;
  long long rank = -1, world = -1, local = 0;
  for (const Scheme &s : schemes) {
    if (std::string(s.launcher) == "slurm" && !inSrunStep)
      continue;
    bool set = false;
    PIPER_RETURN_IF_ERROR(intVar(env, s.rankVar, set, rank));
    if (!set)
      continue;
    scheme = &s;
    PIPER_RETURN_IF_ERROR(intVar(env, s.worldVar, set, world));
    if (!set && std::string(s.launcher) == "slurm")
      PIPER_RETURN_IF_ERROR(intVar(env, "SLURM_NPROCS", set, world));
    if (!set)
      return Status::error(
          fmt::format("{} is set but {} is not", s.rankVar, s.worldVar));
    if (world < 1 || world > 1000000)
      return Status::error(fmt::format(
          "{} must be a positive number of ranks, not {}", s.worldVar, world));
    if (rank < 0 || rank >= world)
      return Status::error(fmt::format("{} {} is out of range for {} {}",
                                       s.rankVar, rank, s.worldVar, world));
    if (s.localVar) {
      PIPER_RETURN_IF_ERROR(intVar(env, s.localVar, set, local));
      if (!set)
        local = 0;
      if (local < 0 || local >= world)
        return Status::error(
            fmt::format("{} {} is out of range", s.localVar, local));
    }
    break;
  }
  if (!scheme)
    return Status::ok();
  std::string launcher = scheme->launcher;
  // `piper-run out/ --nproc 4` inside `srun -n 1` or a one-rank torchrun:
  // the process spawns its own ranks.
  if (launcher != "piper-run" && world == 1 && nproc > 1)
    return Status::ok();
  if (nproc != 0 && nproc != world)
    return Status::error(fmt::format("--nproc is {} but {} is {}", nproc,
                                     scheme->worldVar, world));
  out.rank = static_cast<int>(rank);
  out.worldSize = static_cast<int>(world);
  out.localRank = static_cast<int>(local);
  out.launcher = launcher;
  out.masterAddr = value(env, "MASTER_ADDR");
  isRank = true;
  // Informative only (BLAS threads): a malformed value counts as unknown.
  const char *localSizeVar = launcher == "torchrun" ? "LOCAL_WORLD_SIZE"
                             : launcher == "slurm"  ? "SLURM_NTASKS_PER_NODE"
                             : launcher == "openmpi"
                                 ? "OMPI_COMM_WORLD_LOCAL_SIZE"
                                 : nullptr;
  if (localSizeVar) {
    // Slurm writes "4" or "4(x2)"; the leading count is this node's.
    long long n = std::atoll(value(env, localSizeVar).c_str());
    if (n > 0 && n <= world)
      out.localWorldSize = static_cast<int>(n);
  }

  if (launcher == "piper-run") {
    out.storeDir = value(env, "PIPER_STORE_DIR");
    if (world > 1 && out.storeDir.empty() && out.masterAddr.empty())
      return Status::error("PIPER_STORE_DIR must name a shared, empty "
                           "directory when PIPER_WORLD_SIZE > 1 (or set "
                           "MASTER_ADDR and MASTER_PORT to meet over TCP)");
    if (out.storeDir.empty())
      PIPER_RETURN_IF_ERROR(masterPort(env, 29500, out.masterPort));
    return Status::ok();
  }
  if (launcher == "torchrun") {
    out.jobId = value(env, "TORCHELASTIC_RUN_ID");
    if (world > 1 && (out.masterAddr.empty() || !env("MASTER_PORT")))
      return Status::error("RANK and WORLD_SIZE are set but MASTER_ADDR or "
                           "MASTER_PORT is not (rank 0's address and a free "
                           "port on it)");
    return masterPort(env, 29500, out.masterPort);
  }
  if (launcher == "slurm") {
    std::string step = value(env, "SLURM_STEP_ID");
    out.jobId = value(env, "SLURM_JOB_ID") + "." +
                (step.empty() ? value(env, "SLURM_STEPID") : step);
    if (out.masterAddr.empty()) {
      std::string list = value(env, "SLURM_JOB_NODELIST");
      if (list.empty())
        list = value(env, "SLURM_NODELIST");
      if (list.empty())
        return Status::error("under srun, SLURM_JOB_NODELIST (or "
                             "MASTER_ADDR) must name rank 0's host");
      PIPER_RETURN_IF_ERROR(firstNodeListHost(list, out.masterAddr));
    }
    return masterPort(env, portFromJobId(out.jobId), out.masterPort);
  }
  // Open MPI: its job id is the same on every rank of one mpirun.
  out.jobId = value(env, "OMPI_MCA_ess_base_jobid");
  if (out.jobId.empty())
    out.jobId = value(env, "PMIX_NAMESPACE");
  if (out.masterAddr.empty()) {
    bool set = false;
    long long localSize = 0;
    PIPER_RETURN_IF_ERROR(
        intVar(env, "OMPI_COMM_WORLD_LOCAL_SIZE", set, localSize));
    if (set && localSize == world)
      out.masterAddr = "127.0.0.1"; // every rank on this machine
    else if (world > 1)
      return Status::error("under mpirun across machines, MASTER_ADDR must "
                           "name an address of rank 0's machine (mpirun -x "
                           "MASTER_ADDR=...)");
  }
  return masterPort(env, portFromJobId(out.jobId), out.masterPort);
}

} // namespace piper::runtime

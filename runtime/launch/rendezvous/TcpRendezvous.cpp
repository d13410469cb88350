// The TCP rendezvous of ranks started by torchrun, srun or mpirun, and the
// job id that keeps two jobs on one port apart.
#include "runtime/launch/rendezvous/TcpRendezvous.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "proto/PlanFile.h"

namespace piper::runtime {

namespace {

uint64_t fnv1a(const std::string &text) {
  uint64_t h = 14695981039346656037ull;
  for (char c : text)
    h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

std::string numericHost(const sockaddr *addr, socklen_t len) {
  char host[NI_MAXHOST];
  if (::getnameinfo(addr, len, host, sizeof(host), nullptr, 0,
                    NI_NUMERICHOST) != 0)
    return "";
  return host;
}

/// "0, 2 and 5" for messages.
std::string rankList(const std::vector<int> &ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0)
      out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

} // namespace

Status runFingerprint(const RunOptions &options, const plan::Manifest &manifest,
                      std::string &fingerprint) {
  std::string text = manifest.SerializeAsString();
  // The header of a plan file holds its payload's size and CRC: enough to
  // tell two compiles apart without reading every plan.
  for (const plan::Manifest::Class &c : manifest.classes()) {
    std::string path = c.plan_file();
    if (path.empty() || path[0] != '/')
      path = options.outDir + "/" + path;
    // (Non-blocking and regular files only: a FIFO must not hang a rank.)
    char header[plan::kPlanHeaderSize] = {};
    int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st = {};
    bool ok = fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
              ::pread(fd, header, sizeof(header), 0) == ssize_t(sizeof(header));
    if (fd >= 0)
      ::close(fd);
    if (!ok)
      return Status::error(fmt::format(
          "cannot read the header of plan file '{}' (for the job id)", path));
    text.append(header, sizeof(header));
  }
  text += fmt::format("|seed {}|steps {}|backend {}|comm {}|data-dtype {}|"
                      "checkpoint-every {}|data {}|load {}|resume {}",
                      options.seed, options.steps, options.backend,
                      options.comm, options.dataDType, options.checkpointEvery,
                      !options.dataPath.empty(), !options.loadPath.empty(),
                      options.resume);
  fingerprint = fmt::format("{:016x}", fnv1a(text));
  return Status::ok();
}

std::string jobIdentity(const RankEnv &env, const std::string &fingerprint) {
  return jobName(env) + "/" + fingerprint;
}

Status localAddressFor(const std::string &master, std::string &address) {
  const char *forced = std::getenv("PIPER_HOST_ADDR");
  if (forced && *forced) {
    address = forced;
    return Status::ok();
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo *addrs = nullptr;
  int rc = ::getaddrinfo(master.c_str(), "9", &hints, &addrs);
  if (rc != 0)
    return Status::error(fmt::format("cannot resolve MASTER_ADDR '{}': {}",
                                     master, gai_strerror(rc)));
  std::string error = "no address";
  for (addrinfo *a = addrs; a && address.empty(); a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0)
      continue;
    // The master's own address, when this machine has it (the master's
    // node, and every loopback run).
    sockaddr_storage self = {};
    std::memcpy(&self, a->ai_addr, a->ai_addrlen);
    if (self.ss_family == AF_INET)
      reinterpret_cast<sockaddr_in *>(&self)->sin_port = 0;
    else
      reinterpret_cast<sockaddr_in6 *>(&self)->sin6_port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr *>(&self), a->ai_addrlen) == 0) {
      address = numericHost(a->ai_addr, a->ai_addrlen);
    } else if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      // Otherwise the interface the route to the master leaves by (a UDP
      // connect sends nothing).
      sockaddr_storage local = {};
      socklen_t len = sizeof(local);
      if (::getsockname(fd, reinterpret_cast<sockaddr *>(&local), &len) == 0)
        address = numericHost(reinterpret_cast<sockaddr *>(&local), len);
    } else {
      error = std::strerror(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(addrs);
  if (address.empty())
    return Status::error(fmt::format(
        "no local address reaches MASTER_ADDR '{}' ({}); set PIPER_HOST_ADDR",
        master, error));
  return Status::ok();
}

Status meetOverTcp(const RankEnv &env, const std::string &jobId,
                   std::chrono::milliseconds timeout, TcpMeeting &out) {
  std::string who = fmt::format("rank {}", env.rank);
  std::string where = fmt::format("{}:{}", env.masterAddr, env.masterPort);
  PIPER_RETURN_IF_ERROR(
      localAddressFor(env.masterAddr, out.bindAddress).withContext(who));
  Status st;
  if (env.rank == 0) {
    // The connections it refuses are rank 0's to report (the stranger
    // reports its own side).
    auto log = [who](const std::string &line) {
      std::fprintf(stderr, "piper-run: %s: rendezvous store: %s\n", who.c_str(),
                   line.c_str());
      std::fflush(stderr);
    };
    // Only the master's address, never every interface.
    out.server =
        TcpStoreServer::start(env.masterAddr, env.masterPort, jobId,
                              env.worldSize, st, TcpStoreLimits(), log);
    if (!out.server)
      return st.withContext(who);
  }
  out.store = TcpStore::connect(env.masterAddr, env.masterPort, jobId, env.rank,
                                env.worldSize, timeout, st);
  if (!out.store)
    return st.withContext(who);
  PIPER_RETURN_IF_ERROR(
      out.store
          ->setValue(fmt::format("piper/arrived/{}", env.rank), out.bindAddress)
          .withContext(who));
  std::vector<std::string> keys;
  for (int r = 0; r < env.worldSize; ++r)
    keys.push_back(fmt::format("piper/arrived/{}", r));
  std::vector<std::string> missing;
  PIPER_RETURN_IF_ERROR(
      out.store->waitFor(keys, timeout, missing).withContext(who));
  if (!missing.empty()) {
    std::vector<int> ranks;
    for (const std::string &key : missing)
      ranks.push_back(std::atoi(key.c_str() + std::strlen("piper/arrived/")));
    return Status::error(fmt::format(
        "{}: rank{} {} did not join the rendezvous at {} within {} s "
        "(--timeout-s)",
        who, ranks.size() == 1 ? "" : "s", rankList(ranks), where,
        timeout.count() / 1000));
  }
  return Status::ok();
}

} // namespace piper::runtime

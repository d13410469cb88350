// The TCP rendezvous of ranks started by torchrun, srun or mpirun.
#include "runtime/launch/TcpRendezvous.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

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

std::string jobToken(const RankEnv &env, const plan::Manifest &manifest) {
  const char *explicitToken = std::getenv("PIPER_JOB_TOKEN");
  if (explicitToken && *explicitToken)
    return explicitToken;
  return fmt::format("{}/{}/{}:{}/{:016x}", env.launcher, env.jobId,
                     env.masterAddr, env.masterPort,
                     fnv1a(manifest.SerializeAsString()));
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

Status meetOverTcp(const RankEnv &env, const std::string &token,
                   std::chrono::milliseconds timeout, TcpMeeting &out) {
  std::string who = fmt::format("rank {}", env.rank);
  std::string where = fmt::format("{}:{}", env.masterAddr, env.masterPort);
  PIPER_RETURN_IF_ERROR(
      localAddressFor(env.masterAddr, out.bindAddress).withContext(who));
  Status st;
  if (env.rank == 0) {
    // Only the master's address, never every interface.
    out.server = TcpStoreServer::start(env.masterAddr, env.masterPort, token,
                                       env.worldSize, st);
    if (!out.server)
      return st.withContext(who);
  }
  out.store = TcpStore::connect(env.masterAddr, env.masterPort, token, env.rank,
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

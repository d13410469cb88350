// The Gloo communicator met through any rendezvous store (TcpStore.h), for
// ranks that share no file system.
#include <csignal>

#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>

#include "runtime/comm/GlooCommunicator.h"
#include "runtime/comm/TcpStore.h"

namespace piper::runtime {

std::unique_ptr<Communicator>
createGlooCommunicator(int rank, int worldSize,
                       std::shared_ptr<gloo::rendezvous::Store> store,
                       std::chrono::milliseconds timeout, Status &status,
                       const std::string &hostname) {
  std::string what = "rank " + std::to_string(rank) +
                     ": creating the gloo communicator failed: ";
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    status = Status::error(what + "rank outside the world of " +
                           std::to_string(worldSize) + " ranks");
    return nullptr;
  }
  if (timeout <= std::chrono::milliseconds::zero()) {
    // Gloo reads a zero timeout as "wait forever".
    status = Status::error(what + "the timeout must be positive");
    return nullptr;
  }
  if (!store) {
    status = Status::error(what + "no rendezvous store");
    return nullptr;
  }
  // As the file-store variant: a dead peer must be an error, not SIGPIPE.
  struct sigaction current = {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL)
    std::signal(SIGPIPE, SIG_IGN);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    status = Status::ok();
    return std::make_unique<gloo_comm::GlooCommunicator>(
        rank, worldSize, timeout, std::move(device), std::move(store));
  } catch (const std::exception &e) {
    status = Status::error(what + "host '" + hostname +
                           "': " + gloo_comm::describe(e));
    return nullptr;
  }
}

} // namespace piper::runtime

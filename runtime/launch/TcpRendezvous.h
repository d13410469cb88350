// Meeting the other ranks without a shared file system: rank 0 serves a TCP
// store at MASTER_ADDR:MASTER_PORT, every rank checks in, and the Gloo pairs
// bind to this machine's address on the way to the master.
#ifndef PIPER_RUNTIME_LAUNCH_TCPRENDEZVOUS_H
#define PIPER_RUNTIME_LAUNCH_TCPRENDEZVOUS_H

#include <chrono>
#include <memory>
#include <string>

#include "proto/plan.pb.h"
#include "runtime/comm/TcpStore.h"
#include "runtime/launch/LaunchEnv.h"
#include "runtime/support/Status.h"

namespace piper::runtime {

/// The token that keeps two jobs apart: PIPER_JOB_TOKEN when set, else the
/// launcher and its job id, the master's address and a fingerprint of the
/// strategy (so ranks of another job or another strategy are refused).
std::string jobToken(const RankEnv &env, const plan::Manifest &manifest);

/// The address of this machine that Gloo's pairs bind to: PIPER_HOST_ADDR
/// when set; else `master` itself when it is an address of this machine;
/// else the source address of the route to `master` (its interface).
Status localAddressFor(const std::string &master, std::string &address);

/// A rank's side of a TCP rendezvous; rank 0 also holds the server, which
/// must outlive every use of the store.
struct TcpMeeting {
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<TcpStore> store;
  /// What localAddressFor chose.
  std::string bindAddress;
};

/// Starts the store (rank 0), connects to it, checks in and waits for
/// every rank to check in. Errors after `timeout` name the ranks that never
/// arrived.
Status meetOverTcp(const RankEnv &env, const std::string &token,
                   std::chrono::milliseconds timeout, TcpMeeting &out);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_TCPRENDEZVOUS_H

// Meeting the other ranks without a shared file system: rank 0 serves a TCP
// store at MASTER_ADDR:MASTER_PORT, every rank checks in, and the Gloo pairs
// bind to this machine's address on the way to the master.
#ifndef PIPER_RUNTIME_LAUNCH_RENDEZVOUS_TCPRENDEZVOUS_H
#define PIPER_RUNTIME_LAUNCH_RENDEZVOUS_TCPRENDEZVOUS_H

#include <chrono>
#include <memory>
#include <string>

#include "proto/plan.pb.h"
#include "runtime/comm/TcpStore.h"
#include "runtime/launch/options/RunOptions.h"
#include "runtime/launch/rendezvous/LaunchEnv.h"
#include "support/Status.h"

namespace piper::runtime {

/// A fingerprint (16 hex digits) of what every rank of one job agrees on:
/// the manifest, every plan file's header (its size and checksum) and the
/// options that change what is computed (--seed, --steps, --backend,
/// --comm, --data-dtype, --checkpoint-every, and whether --data, --load and
/// --resume are given).
Status runFingerprint(const RunOptions &options, const plan::Manifest &manifest,
                      std::string &fingerprint);

/// The id the rendezvous admits, "<jobName(env)>/<fingerprint>": ranks of
/// another job, or of the same job with another strategy or options, are
/// refused with a message naming both ids.
std::string jobIdentity(const RankEnv &env, const std::string &fingerprint);

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

/// Starts the store (rank 0, which reports the connections it refuses on
/// stderr), connects to it as job `jobId` (jobIdentity), checks in and
/// waits for every rank to check in. Errors after `timeout` name the ranks
/// that never arrived.
Status meetOverTcp(const RankEnv &env, const std::string &jobId,
                   std::chrono::milliseconds timeout, TcpMeeting &out);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_RENDEZVOUS_TCPRENDEZVOUS_H

// Collective and point-to-point communication between the ranks of a run:
// asynchronous operations issued on a logical stream and completed by waits.
// The Gloo implementation runs over TCP on CPUs; an NCCL one will follow.
#ifndef PIPER_RUNTIME_COMM_COMMUNICATOR_H
#define PIPER_RUNTIME_COMM_COMMUNICATOR_H

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "support/Status.h"

namespace piper::runtime {

/// A communicator key: the logical stream that issues the operations and the
/// world ranks taking part. Every stream has its own connections, so streams
/// never share a Gloo context across threads.
struct CommKey {
  std::string stream;
  std::vector<int> ranks; // sorted, unique, contains this rank
  std::string str() const;
  bool operator<(const CommKey &o) const { return str() < o.str(); }
};

/// Sorts `key.ranks` and checks that they are unique, within a world of
/// `worldSize` and contain `rank`; the error reads "rank R: connecting
/// communicator 'K' failed: ...". For the communicators' connect().
Status normalizeCommKey(CommKey &key, int rank, int worldSize);

/// Element types of communicated buffers. Reductions support F32 and BF16
/// (bf16 sums accumulate in fp32 and round once, to nearest even); the
/// others only move data.
enum class CommDType { F32, BF16, I32, F64 };

/// Bytes of one element of `type`.
size_t commDTypeSize(CommDType type);
/// "f32", "bf16", "i32" or "f64".
const char *commDTypeName(CommDType type);

/// The completion handle of an asynchronous operation. The buffers an
/// operation reads or writes must stay valid, and must not be touched, until
/// wait() has returned. A work must not outlive its communicator; the works
/// of point-to-point operations are waited for by their stream's thread.
class CommWork {
public:
  virtual ~CommWork() = default;
  /// Blocks until the operation completes and returns its status; later
  /// calls return the same status at once.
  virtual Status wait() = 0;
};
using CommWorkPtr = std::shared_ptr<CommWork>;

/// A work that is complete when created, e.g. an error found at issue time
/// or an operation over one rank.
CommWorkPtr completedWork(Status status = Status::ok());

/// Point-to-point and collective operations between the ranks of a run.
///
/// Operations are issued on a key's stream and run asynchronously: each
/// returns a CommWork at once. On every member of a key, operations of that
/// key must be issued in the same order (the compiler guarantees it; NCCL
/// requires it too). All calls on one stream come from one thread at a time;
/// different streams may be used concurrently. Counts are in elements; the
/// per-rank vectors are indexed by position in the key's sorted ranks.
/// Errors name the operation, the stream and the peer rank(s).
class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;

  /// Connects every communicator this rank will use. `keys` may come in any
  /// order; they are connected in a globally consistent (sorted) order so that
  /// ranks with different plans never wait on each other crosswise.
  virtual Status connect(std::vector<CommKey> keys) = 0;

  /// Binds logical stream `stream` (the name operations are issued on:
  /// isend's stream, CommKey::stream) to the device stream whose work its
  /// operations are ordered with: an opaque handle, a cudaStream_t for
  /// NCCL. A device binds each stream it creates, before the stream's first
  /// operation, and unbinds it (only if still bound to `deviceStream`) when
  /// it destroys it. Operations of an unbound stream run on a stream of the
  /// communicator and complete on the host. Communicators of host memory
  /// (Gloo) ignore both.
  virtual void bindDeviceStream(const std::string &stream, void *deviceStream) {
    (void)stream;
    (void)deviceStream;
  }
  virtual void unbindDeviceStream(const std::string &stream,
                                  void *deviceStream) {
    (void)stream;
    (void)deviceStream;
  }

  /// Starts sending `bytes` at `data` to world rank `peer` on the connection
  /// of (stream, {this rank, peer}).
  virtual CommWorkPtr isend(const std::string &stream, const void *data,
                            size_t bytes, int peer, uint32_t tag) = 0;
  /// Starts receiving exactly `bytes` from `peer` into `data`.
  virtual CommWorkPtr irecv(const std::string &stream, void *data, size_t bytes,
                            int peer, uint32_t tag) = 0;
  /// In-place sum of `count` elements over the ranks of `key`.
  virtual CommWorkPtr allReduce(const CommKey &key, void *data, size_t count,
                                CommDType type) = 0;
  /// Sums `input` (the concatenation of every member's slice, member i's
  /// slice having counts[i] elements) over the ranks of `key` and leaves
  /// this rank's slice of the sum in `output` (counts[position] elements).
  /// Slices are summed in rank order, so every member sees the same bits.
  virtual CommWorkPtr reduceScatter(const CommKey &key, const void *input,
                                    void *output,
                                    const std::vector<size_t> &counts,
                                    CommDType type) = 0;
  /// Concatenates every member's `input` (counts[i] elements from member i;
  /// this rank's count is counts[position]) into `output`, in rank order
  /// (allgatherv).
  virtual CommWorkPtr allGather(const CommKey &key, const void *input,
                                void *output, const std::vector<size_t> &counts,
                                CommDType type) = 0;
  /// Sends sendCounts[i] elements to member i (consecutive slices of
  /// `input`) and receives recvCounts[i] elements from member i (consecutive
  /// slices of `output`); the counts must agree pairwise across members.
  virtual CommWorkPtr allToAll(const CommKey &key, const void *input,
                               const std::vector<size_t> &sendCounts,
                               void *output,
                               const std::vector<size_t> &recvCounts,
                               CommDType type) = 0;

  /// In-place sum over all ranks, synchronous, on a dedicated control
  /// connection (used for step metrics such as the loss). Thread-safe.
  virtual Status allReduceSumWorld(double *data, size_t count) = 0;
  /// allReduceSumWorld of `count` doubles in device memory, ordered after
  /// the work queued so far on logical stream `stream` and before what it
  /// queues next (the clipped step's gradient norm: no host wait on a GPU).
  /// Communicators of host memory sum at once, as allReduceSumWorld, which
  /// is the default; NCCL queues the sum on the device stream bound to
  /// `stream`. Every rank calls it once per clipped step.
  virtual Status allReduceSumWorldOn(const std::string &stream, double *data,
                                     size_t count) {
    (void)stream;
    return allReduceSumWorld(data, count);
  }

  /// Why a step that issues this communicator's operations cannot be
  /// captured as one device graph (hal::Device::beginStepCapture), or ""
  /// where it can: every operation is queued on the device stream bound to
  /// its logical stream and its completion waited for there, never on the
  /// host (NCCL; the emulated GPU's model of it). Host communicators
  /// (Gloo) cannot: their operations run on the host as it issues them.
  virtual std::string stepCaptureRefusal() const {
    return "its operations run on the host as they are issued";
  }

  // Blocking conveniences over the asynchronous operations.

  /// isend, keeping the work until waitSends(stream).
  Status send(const std::string &stream, const void *data, size_t bytes,
              int peer, uint32_t tag);
  /// irecv and wait.
  Status recv(const std::string &stream, void *data, size_t bytes, int peer,
              uint32_t tag);
  /// Waits for every send started by send() on `stream`; reports the first
  /// error after waiting for all of them.
  Status waitSends(const std::string &stream);
  /// allReduce of floats over `ranks` on `stream`, and wait.
  Status allReduceSum(const std::string &stream, const std::vector<int> &ranks,
                      float *data, size_t count);

private:
  std::mutex pendingMu; // guards the map, not the per-stream lists
  std::map<std::string, std::vector<CommWorkPtr>> pendingSends;
};

/// Creates a Gloo communicator over TCP on 127.0.0.1 (or `hostname`), meeting
/// the other ranks through a file store in `storeDir`. Operations that wait
/// longer than `timeout` fail with an error naming the peer. Sets SIGPIPE to
/// be ignored (unless a handler is installed) so a dead peer is an error.
std::unique_ptr<Communicator>
createGlooCommunicator(int rank, int worldSize, const std::string &storeDir,
                       std::chrono::milliseconds timeout, Status &status,
                       const std::string &hostname = "127.0.0.1");

} // namespace piper::runtime

#endif // PIPER_RUNTIME_COMM_COMMUNICATOR_H

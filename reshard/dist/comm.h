// Comm: the one MPI wrapper of the tree (the trainer's collectives and the distributed reshard).
// A Comm is a communicator: the world (MPI_COMM_WORLD when the process was started by mpirun,
// env OMPI_COMM_WORLD_SIZE set; otherwise a one-rank world that never touches MPI), or a group
// split from it (RAII: a split communicator is freed with its Comm). Every operation returns a
// Status; MPI errors are returned (MPI_ERRORS_RETURN), never an abort without a message.
// Bounded waits: every operation runs as its non-blocking MPI form and waits in a poll loop
// (MPI_Test, then the control channel, then a yield for the first 200 us, then a sleep of 20 us
// growing to 1 ms); an operation whose peers do not arrive within CKPT_COMM_TIMEOUT_S seconds
// (default 600) fails with CommTimeout naming the operation, the communicator size and the
// element count (split waits boundedly for every rank to arrive, then calls the blocking
// MPI_Comm_split).
// Failures: fail_all() sends this rank's Status to every other world rank over a control
// communicator (a dup of the world); every pending or later operation on any rank then returns it
// with "rank R: " before the message (the same text on every rank when one rank fails). A
// timeout or an MPI error of an operation is sent the same way. A failure is sticky: every later
// operation of the process returns it at once (failure()), and its pending requests are left to
// MPI (a late message may still land in a send/recv buffer of a collective: after a failure, exit).
// Exit path under MPI after an error: print the message, then Comm::abandon(why), then exit with
// the error's code (cli/ report_error and error_exit do this). abandon() sends the failure to the
// other ranks (unless one is known already), waits at most min(CKPT_COMM_TIMEOUT_S, 10) s for
// every rank to reach abandon too (so that each prints before mpirun ends the job), and makes the
// process exit without MPI_Finalize, which could block on requests a peer never matched; mpirun
// then sees a nonzero exit, ends the job and exits with that code. A process exiting normally
// finalizes MPI at exit, unless a failure is known (then it exits without MPI_Finalize, which
// mpirun reports as an error).
// LayoutGroups: the groups of a Layout's rank (rank order of reshard/layout/layout.h, either form): TP,
// DP, PP, model replica, the embedding group (first and last stage) for tied embeddings, and a
// copy of the world for the pipeline exchanges and world-wide reductions.
// Thread safety: call from the main thread only (MPI_THREAD_FUNNELED); background threads must
// not use a Comm.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "reshard/layout/layout.h"

namespace ckpt {

class Comm {
 public:
  // True when mpirun (Open MPI) started this process: reads the environment only.
  static bool launched_under_mpi();
  // The process-wide world communicator (MPI initialized on first call, finalized at exit).
  static Comm& world();

  Comm() = default;  // an empty communicator: size() == 0, every operation fails
  Comm(Comm&& o) noexcept;
  Comm& operator=(Comm&& o) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_mpi() const { return mpi_; }

  // Collective over this communicator: the ranks passing the same `color` form a new
  // communicator, ordered by `key` (ties: by rank here).
  Result<Comm> split(int color, int key) const;

  // Collectives: every rank of the communicator calls them in the same order with the same n.
  // T is float, double or int64_t.
  template <class T> Status all_reduce_sum(T* buf, int64_t n);
  template <class T> Status all_reduce_max(T* buf, int64_t n);
  // in: size() * n elements, block r = [r*n, (r+1)*n); out (n elements) = the sum over ranks of
  // their block rank(). in and out must not overlap.
  template <class T> Status reduce_scatter_sum(const T* in, T* out, int64_t n);
  // in: n elements; out: size() * n elements, rank r's at [r*n, (r+1)*n). May be in place
  // (in == out + rank()*n).
  template <class T> Status all_gather(const T* in, T* out, int64_t n);
  // Point to point (peer is a rank of this communicator). send returns once `buf` may be reused.
  template <class T> Status send(const T* buf, int64_t n, int peer, int tag);
  template <class T> Status recv(T* buf, int64_t n, int peer, int tag);
  // Sends sbuf to `dst` and receives rbuf from `src` at once (no deadlock when two ranks exchange;
  // dst or src may be -1: that half is skipped). The one-send, one-receive case of exchange().
  template <class T> Status sendrecv(const T* sbuf, int64_t sn, int dst, T* rbuf, int64_t rn, int src, int tag);
  // Posts every send and every receive at once (non-blocking), then waits for all of them
  // (bounded, as every wait): a rank may send to several peers and receive from several in one
  // step without ordering them. Receive buffers must not overlap each other or a send buffer.
  // Without MPI (one-rank world) only exchanges with itself: the k-th send is copied into the
  // k-th receive.
  template <class T> struct Send { const T* buf; int64_t n; int peer; };
  template <class T> struct Recv { T* buf; int64_t n; int peer; };
  template <class T> Status exchange(const std::vector<Send<T>>& sends, const std::vector<Recv<T>>& recvs, int tag);
  Status barrier();

  // Agreement: every rank passes its own status; all get Ok when every one is Ok, else the
  // status (code, message, file, tensor) of the lowest failing rank, identical on every rank.
  Status agree(const Status& mine);
  // Rank 0 receives every rank's string (in rank order); other ranks get an empty vector.
  Result<std::vector<std::string>> gather(const std::string& mine);
  // Rank 0's string, on every rank.
  Result<std::string> broadcast(const std::string& from_root);
  // Tells every rank of the world that this rank failed with `why` (does not wait for them);
  // their pending and later operations return it, as do this rank's ("rank R: " + message).
  // No-op when a failure is already known here.
  void fail_all(const Status& why);
  // The failure that stops every operation of this process ("rank R: ..."), OK while none.
  static Status failure();
  // The timeout of every wait of this process, seconds (CKPT_COMM_TIMEOUT_S; CommTimeoutScope).
  static double timeout_s();
  // Seconds this process has spent waiting for MPI operations to complete, over all Comms (0
  // without MPI): callers take differences to split a span into compute and communication.
  static double seconds_waiting();
  // The exit path after an error (see the top of this file): call it after printing `why`, then
  // exit with the error's code. No-op when MPI was not started (no world() under mpirun).
  static void abandon(const Status& why);

 private:
  friend struct CommAccess;
  int rank_ = 0, size_ = 0;
  bool mpi_ = false;
  bool owned_ = false;   // a split communicator, freed by the destructor
  intptr_t handle_ = 0;  // MPI_Comm (Open MPI: a pointer)
};

// Replaces the timeout of every wait of this process while it lives, then restores the previous
// one: for waits whose length is the peers' work, not a fault (a distributed reshard waiting for
// the other processes' shard files and for rank 0's commit).
class CommTimeoutScope {
 public:
  explicit CommTimeoutScope(double seconds);
  ~CommTimeoutScope();
  CommTimeoutScope(const CommTimeoutScope&) = delete;
  CommTimeoutScope& operator=(const CommTimeoutScope&) = delete;

 private:
  double previous_;
};

// The groups of `layout` that contain this rank (symmetric form: rank = (pp_rank * dp + dp_rank) *
// tp + tp_rank; general form: reshard/layout/layout.h's order, stage slowest, then pipeline, then TP rank).
struct LayoutGroups {
  int pp_rank = 0, dp_rank = 0, tp_rank = 0;  // = place_of_rank: stage, pipeline, TP rank
  Comm tp;         // same (pipeline, stage): its TP ranks in order
  Comm dp;         // uniform_pipelines(): same (stage, TP rank) of every pipeline, in pipeline order
                   // (ZeRO-1's data-parallel peers); otherwise a one-rank group
  Comm pp;         // same (pipeline, TP rank): the stages having that TP rank, in order
  Comm model;      // same pipeline: all its ranks (one model replica), in rank order
  Comm embedding;  // first and last stage at the same (pipeline, TP rank), first stage rank 0, when
                   // the pipeline has more than one stage and both have the same tp; otherwise a
                   // one-rank group (the trainer sums tied embeddings with trainer/optim/replica_sum.h)
  Comm world;      // every rank, in world order (pipeline exchanges, world-wide reductions)
  // Collective over `world`. world.size() must equal layout.world_size() (error
  // WorldSizeMismatch naming both); a general layout is validated first.
  static Result<LayoutGroups> make(Comm& world, const Layout& layout);
};

}  // namespace ckpt

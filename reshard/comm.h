// Comm: the one MPI wrapper of the tree (the trainer's collectives and the distributed reshard).
// A Comm is a communicator: the world (MPI_COMM_WORLD when the process was started by mpirun,
// env OMPI_COMM_WORLD_SIZE set; otherwise a one-rank world that never touches MPI), or a group
// split from it (RAII: a split communicator is freed with its Comm). Every operation returns a
// Status; MPI errors are returned (MPI_ERRORS_RETURN), never an abort without a message.
// Waits are bounded (CKPT_COMM_TIMEOUT_S, default 600 s): an operation whose peers do not arrive
// fails with CommTimeout naming the operation. fail_all() tells every rank that this rank failed;
// every pending or later operation on any rank then returns that Status ("rank R: ...").
// LayoutGroups: the TP, DP, PP groups of a Layout (rank order of reshard/layout.h) and the
// embedding group (first and last stage) for tied embeddings.
// Thread safety: call from the main thread only (MPI_THREAD_FUNNELED); background threads must
// not use a Comm.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/status.h"
#include "reshard/layout.h"

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
  // dst or src may be -1: that half is skipped).
  template <class T> Status sendrecv(const T* sbuf, int64_t sn, int dst, T* rbuf, int64_t rn, int src, int tag);
  Status barrier();

  // Agreement: every rank passes its own status; all get Ok when every one is Ok, else the
  // status (code, message, file, tensor) of the lowest failing rank, identical on every rank.
  Status agree(const Status& mine);
  // Rank 0 receives every rank's string (in rank order); other ranks get an empty vector.
  Result<std::vector<std::string>> gather(const std::string& mine);
  // Rank 0's string, on every rank.
  Result<std::string> broadcast(const std::string& from_root);
  // Tells every rank of the world that this rank failed with `why` (does not wait for them);
  // their pending and later operations return it.
  void fail_all(const Status& why);

 private:
  friend struct CommAccess;
  int rank_ = 0, size_ = 0;
  bool mpi_ = false;
  bool owned_ = false;   // a split communicator, freed by the destructor
  intptr_t handle_ = 0;  // MPI_Comm (Open MPI: a pointer)
};

// The groups of `layout` that contain this rank (rank = (pp_rank * dp + dp_rank) * tp + tp_rank).
struct LayoutGroups {
  int pp_rank = 0, dp_rank = 0, tp_rank = 0;
  Comm tp;         // same (pp, dp): tp ranks in order
  Comm dp;         // same (pp, tp): dp ranks in order
  Comm pp;         // same (dp, tp): stages in order
  Comm model;      // same dp: all tp*pp ranks of one model replica, in rank order
  Comm embedding;  // first and last stage at the same (dp, tp), first stage rank 0; on other
                   // stages (and when pp == 1) a one-rank group
  // Collective over `world`. world.size() must equal layout.world_size() (error
  // WorldSizeMismatch naming both).
  static Result<LayoutGroups> make(Comm& world, const Layout& layout);
};

}  // namespace ckpt

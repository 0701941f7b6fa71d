// Dist: the few collective operations the distributed reshard needs, over MPI when the process
// was launched by mpirun (env OMPI_COMM_WORLD_SIZE set), else a single-process no-op that never
// touches MPI. MPI is initialized on first use and finalized at exit.
// Thread safety: call from the main thread only (MPI_THREAD_SINGLE usage).
#pragma once

#include <string>
#include <vector>

#include "formats/status.h"

namespace ckpt {

class Dist {
 public:
  // True when mpirun (Open MPI) started this process: env OMPI_COMM_WORLD_SIZE is set. Reads the
  // environment only; MPI is not touched.
  static bool launched_under_mpi();
  // The process-wide instance: MPI (MPI_Init on first call) when launched under mpirun.
  static Dist& get();
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_mpi() const { return mpi_; }
  void barrier();
  // Logical AND of `ok` over all ranks.
  bool all_ok(bool ok);
  // Rank 0 receives every rank's string (in rank order); other ranks get an empty vector.
  std::vector<std::string> gather(const std::string& mine);
  // Rank 0's string, on every rank.
  std::string broadcast(const std::string& from_root);

 private:
  Dist();
  int rank_ = 0, size_ = 1;
  bool mpi_ = false;
};

}  // namespace ckpt

#include "reshard/dist.h"

#include <mpi.h>

#include <cstdlib>

namespace ckpt {

namespace {
void finalize_mpi() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}
}  // namespace

bool Dist::launched_under_mpi() {
  const char* ws = std::getenv("OMPI_COMM_WORLD_SIZE");
  return ws && *ws;
}

Dist::Dist() {
  if (!launched_under_mpi()) return;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    MPI_Init(nullptr, nullptr);
    std::atexit(finalize_mpi);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  mpi_ = true;
}

Dist& Dist::get() {
  static Dist d;
  return d;
}

void Dist::barrier() {
  if (mpi_) MPI_Barrier(MPI_COMM_WORLD);
}

bool Dist::all_ok(bool ok) {
  if (!mpi_) return ok;
  int in = ok ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return out == 1;
}

std::vector<std::string> Dist::gather(const std::string& mine) {
  if (!mpi_) return {mine};
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(rank_ == 0 ? size_ : 0), displs;
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<char> all;
  if (rank_ == 0) {
    displs.resize(size_);
    int total = 0;
    for (int i = 0; i < size_; ++i) {
      displs[i] = total;
      total += lens[i];
    }
    all.resize(static_cast<size_t>(total) + 1);
  }
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank_ == 0)
    for (int i = 0; i < size_; ++i) out.emplace_back(all.data() + displs[i], static_cast<size_t>(lens[i]));
  return out;
}

std::string Dist::broadcast(const std::string& from_root) {
  if (!mpi_) return from_root;
  int len = static_cast<int>(from_root.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string s = rank_ == 0 ? from_root : std::string(static_cast<size_t>(len), '\0');
  MPI_Bcast(s.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
  return s;
}

}  // namespace ckpt

// mpi_pingpong: a plain MPI ping-pong between ranks 0 and 1, written against the MPI C API alone
// (not reshard/dist/comm.h), the independent reference for the calibration's MPI latency and
// bandwidth in tests/python/test_calibrate.py.
//   mpirun -np 2 mpi_pingpong [SECONDS]
// Rank 0 prints one JSON line: "latency_s": half the median round trip of 8 bytes, "bytes_per_s":
// 16 MiB / half the median round trip of 16 MiB, with blocking MPI_Send / MPI_Recv; "polled_*":
// the same with nonblocking calls, a polling wait (polled_wait) and a polled barrier.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

// Waits for `n` requests the way an MPI application that must notice a failed peer does (and as
// reshard/dist/comm_wait.cc documents for ckpt's communicator): test and yield the CPU for the
// first 200 us, then test and sleep, 20 us doubling up to 1 ms.
void polled_wait(MPI_Request* reqs, int n) {
  int done = 0;
  const double t0 = MPI_Wtime();
  double pause = 20e-6;
  while (MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS && !done) {
    if (MPI_Wtime() - t0 < 200e-6) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(pause));
      pause = std::min(2 * pause, 1e-3);
    }
  }
}

void transfer(std::vector<char>& buf, int bytes, int peer, bool send, bool polled) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (!polled) {
    if (send) MPI_Send(buf.data(), bytes, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
    else MPI_Recv(buf.data(), bytes, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return;
  }
  if (send) MPI_Isend(buf.data(), bytes, MPI_BYTE, peer, 3, MPI_COMM_WORLD, &r);
  else MPI_Irecv(buf.data(), bytes, MPI_BYTE, peer, 3, MPI_COMM_WORLD, &r);
  polled_wait(&r, 1);
}

// Lines both ranks up before a timed round trip. Polled (as ckpt's Comm::barrier): a rank may still
// be in a sleep of polled_wait when the barrier completes, and the round trip timed after it starts
// late by up to that sleep, as ckpt's calibration's does.
void barrier(bool polled) {
  if (!polled) {
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Ibarrier(MPI_COMM_WORLD, &r);
  polled_wait(&r, 1);
}

// The median of `reps` round trips of `bytes` bytes (rank 0 sends, rank 1 echoes), each timed
// alone after a barrier, in seconds.
double median_round_trip(std::vector<char>& buf, int bytes, int reps, int rank, bool polled) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    barrier(polled);
    const double t0 = MPI_Wtime();
    transfer(buf, bytes, 1 - rank, rank == 0, polled);
    transfer(buf, bytes, 1 - rank, rank != 0, polled);
    t.push_back(MPI_Wtime() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) std::fprintf(stderr, "mpi_pingpong: run under mpirun -np 2 (world of %d)\n", size);
    MPI_Finalize();
    return 2;
  }
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;
  const int big = 16 << 20;
  std::vector<char> buf(static_cast<size_t>(big), 1);
  const int small_reps = std::clamp(static_cast<int>(seconds * 1000), 100, 5000);
  const int big_reps = std::clamp(static_cast<int>(seconds * 20), 5, 100);
  double lat[2], bw[2];
  for (int polled = 0; polled < 2; ++polled) {
    median_round_trip(buf, 8, 20, rank, polled);  // warm-up
    lat[polled] = median_round_trip(buf, 8, small_reps, rank, polled) / 2;
    median_round_trip(buf, big, 2, rank, polled);
    bw[polled] = big / (median_round_trip(buf, big, big_reps, rank, polled) / 2);
  }
  if (rank == 0)
    std::printf("{\"latency_s\": %.9g, \"bytes_per_s\": %.9g, \"polled_latency_s\": %.9g, \"polled_bytes_per_s\": %.9g}\n", lat[0], bw[0],
                lat[1], bw[1]);
  MPI_Finalize();
  return 0;
}

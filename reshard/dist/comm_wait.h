// The process-wide MPI state behind Comm (reshard/dist/comm.h; internal to reshard/dist/comm*.cc): MPI
// start-up, the control communicator (an MPI_Comm_dup of the world) over which a failing rank
// sends its Status to every other rank, the sticky failure, the timeout, and wait(), the bounded
// poll loop every Comm operation waits in (MPI_Testall, then the control channel, then a yield of
// the CPU for the first 200 us, then a back-off sleep of 20 us growing to 1 ms, so that
// oversubscribed ranks leave the CPU to those computing).
// Thread safety: main thread only, as Comm.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include "formats/base/status.h"

namespace ckpt::comm_detail {

// What an operation was, for its timeout message: "all_reduce_sum (float) on a communicator of
// 4 ranks, 1024 elements".
struct OpInfo {
  const char* op;
  const char* type;  // element type name, or "" (barrier)
  int comm_size;
  int64_t count;
};

// MPI_Init_thread (FUNNELED, finalize at exit unless a failure or abandon() forbids it),
// MPI_ERRORS_RETURN on the world, the control communicator, the timeout (CKPT_COMM_TIMEOUT_S).
// Fills the world rank and size.
void start_mpi(int* rank, int* size);
bool mpi_started();
int world_rank();

// The timeout of every wait, seconds (CKPT_COMM_TIMEOUT_S, default 600, until set_timeout_s).
double timeout_s();
void set_timeout_s(double seconds);

// The failure that stops every operation of this process ("rank R: ..."), OK while there is none.
const Status& failure();
// Records this rank's own failure `why` (first one wins) and sends it to every other rank over
// the control communicator (without waiting for them). No-op when a failure is already known.
void fail_local(const Status& why);

// An MPI return code as a Status (code Mpi, the MPI error string), OK for MPI_SUCCESS.
Status mpi_status(int rc, const char* op);

// Waits for the `n` requests (bounded): OK when all completed; the failure a peer sent over the
// control channel, or CommTimeout (this rank's failure, sent to the others), or an MPI error.
// On error, requests still pending are left to MPI (receives, reqs[first_recv..n), are
// cancelled; -1: none) and MPI_Finalize will be skipped.
Status wait(MPI_Request* reqs, int n, const OpInfo& info, int first_recv = -1);
// Total seconds this process has spent in wait() (every operation of every Comm).
double seconds_waiting();

// The exit path after an error (Comm::abandon): see reshard/dist/comm.h.
void abandon(const Status& why);

}  // namespace ckpt::comm_detail

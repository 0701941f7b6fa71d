// Executes a Plan into a new native-store checkpoint: one HDF5 shard file per writing rank,
// written under `<dst>.partial/` and renamed to `<dst>` by one process after every file is
// complete. Under mpirun (the world of reshard/dist/comm.h) the shard files are divided among the processes,
// each reading only the source regions its files need; piece records are gathered to rank 0,
// which finalizes. Output bytes are identical for any process or thread count.
// Thread safety: one call at a time per process (HDF5 is used from the calling thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/store/store_writer.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/executor.h"
#include "reshard/planner.h"

namespace ckpt {

class Comm;

// Memory a reshard into the store keeps out of its chunk budget: the store writer's buffers,
// HDF5's caches and the process itself.
inline constexpr uint64_t kStoreWriterReserveBytes = uint64_t{48} << 20;

struct StoreExecOptions {
  ExecOptions exec;
  store::StoreOptions store;
  // Called before the output is finalized (e.g. to verify the source's checksums); an error
  // aborts without committing. Run by rank 0 only.
  std::function<Status()> before_commit;
  // Optional (profile conversions): each process's note (e.g. an exactness report), taken after its files are
  // written and gathered to rank 0 with its piece records; rank 0 then lets amend_metadata change
  // the manifest metadata from every note (rank order) before before_commit. An error aborts.
  std::function<std::string()> process_note;
  std::function<Status(const std::vector<std::string>& notes, nlohmann::json& metadata)> amend_metadata;
};

// Files of `plan` handled by process `proc` of `nprocs` (greedy by bytes, deterministic).
std::vector<size_t> files_for_process(const Plan& plan, int proc, int nprocs);

// Writes `plan` from `src` to the new checkpoint dir `dst` (must not exist). `dist` (the world
// communicator under mpirun) null means a single process. On error nothing at `dst` exists (a `<dst>.partial` may remain after a crash;
// it is never taken for a checkpoint and is replaced by the next run).
Status execute_plan_to_store(TensorSource& src, const Plan& plan, const std::string& dst,
                             const StoreExecOptions& opts, Comm* dist = nullptr);

}  // namespace ckpt

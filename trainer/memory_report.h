// The trainer's side of the memory estimate (trainer/memory_estimate.h): the check before training
// against a cluster file (`ckpt train --cluster FILE`), and the report at the end of a run: every
// rank's peak RSS gathered to rank 0, written with the estimates to <run>/memory.json and, with a
// cluster file, printed as a short table.
// Thread safety: main thread only (Comm).
#pragma once

#include <cstdint>
#include <string>

#include "formats/base/status.h"
#include "reshard/dist/comm.h"
#include "trainer/memory_estimate.h"

namespace ckpt::trainer {

// The estimate inputs of a run (data_bytes: the size of `data_path`, 0 when empty or unreadable).
MemoryInputs memory_inputs(const LlamaConfig& config, const Layout& layout, int64_t seq_len, int64_t grad_accum,
                           bool checkpoints, const std::string& data_path);

// Without a cluster file: Ok. Else loads it (BadCluster), checks it against the layout
// (ClusterMismatch) and every rank's estimate against its device memory (RankOutOfMemory).
// Pure computation, the same answer on every rank: call it before anything is allocated.
// `summary` (optional) receives one line about the tightest rank.
Status check_cluster_memory(const std::string& cluster_file, const MemoryInputs& in, std::string* summary = nullptr);

// Collective over `world`: rank 0 gathers every rank's peak RSS; writes <run_dir>/memory.json
// {"ranks": [{rank, pipeline, stage, tp_rank, device, <estimate fields>, total, peak_rss, ratio}]}
// when run_dir is set, and prints the table when `print`.
Status report_memory(Comm& world, const MemoryInputs& in, const std::string& run_dir, bool print);

}  // namespace ckpt::trainer

// Run directories: `<run>/step-00000100/` checkpoints and a `latest` file naming the newest
// complete one (replaced atomically: temp + fsync + rename). A `*.partial` directory is never a
// checkpoint. Inside a checkpoint, rank r writes `shards/r<r:05>.h5`.
// Thread safety: stateless functions.
#pragma once

#include <cstdint>
#include <string>

#include "formats/base/status.h"

namespace ckpt::store {

inline constexpr const char* kLatestFile = "latest";

std::string step_dir_name(int64_t step);  // "step-00000100"
std::string shard_file_name(int rank);     // "shards/r00003.h5" (relative to the checkpoint dir)
bool is_partial_name(const std::string& name);  // ends in ".partial"
// Replaces `<run_dir>/latest` with `name` (a directory name inside run_dir) atomically.
Status write_latest(const std::string& run_dir, const std::string& name);
// `path` is a checkpoint dir (has manifest.json) or a run dir (has `latest`, followed):
// returns the checkpoint dir. A `.partial` dir is refused (NotCheckpoint / BadLatest errors).
Result<std::string> resolve_checkpoint(const std::string& path);

}  // namespace ckpt::store

// MemoryFit: what a streaming job (reshard, from-hf, to-hf) can keep of --max-memory.
//
// A job's fixed buffers are reserved out of the budget before its chunks are sized: the store
// writer, HDF5 and the process (48 MiB), a compressed output's chunks in flight, a compressed
// source's decoding threads, to-hf's own process (converters/jobs/reshard_job.h). Those plus the
// smallest chunk budget the executor is given (kMinChunkBudgetBytes) are the job's floor:
//  - at or above the floor, the peak RSS stays under --max-memory plus a few MiB
//    (tests/python/test_memory.py);
//  - below it the job runs at its floor, the least it can do (it is never refused: tiny budgets
//    are how tests force tiny chunks), and the CLI says so on stderr (note()); --json reports both.
// A compressed -> compressed reshard on --threads 2 has a floor of 114 MiB; an uncompressed one 52
// (docs/RESHARD.md lists the others).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"

namespace ckpt {

class SourceBlocks;

// The smallest chunk budget handed to the executor, whatever --max-memory says.
inline constexpr uint64_t kMinChunkBudgetBytes = uint64_t{4} << 20;

struct MemoryFit {
  uint64_t max_memory = 0;  // bytes of --max-memory
  uint64_t floor = 0;       // the job's fixed buffers + kMinChunkBudgetBytes
  uint64_t read_ahead = 0;  // of max_memory: direct copies' source read-ahead (formats/io/source_blocks.h), 0: none

  bool below_floor() const { return max_memory < floor; }
  nlohmann::json to_json() const;  // {"max_memory": bytes, "floor": bytes, "read_ahead": bytes}
  // Below the floor: one line for stderr saying what was asked, what the job needs at the least
  // with `threads`, and what to change; "" otherwise.
  std::string note(int threads) const;
};

// `max_memory` as given ("256M"; errors name --max-memory) against `reserve`, the job's fixed bytes;
// `read_ahead`'s capacity, part of them (fit_read_ahead: what the budget left over), is reported, not
// part of the floor.
Result<MemoryFit> memory_fit(const std::string& max_memory, uint64_t reserve, const SourceBlocks* read_ahead = nullptr);

}  // namespace ckpt

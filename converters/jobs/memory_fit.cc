#include "converters/jobs/memory_fit.h"

#include <algorithm>

#include "formats/base/byte_size.h"
#include "formats/io/source_blocks.h"

namespace ckpt {

namespace {

std::string mib(uint64_t bytes) { return std::to_string((bytes + (uint64_t{1} << 20) - 1) >> 20); }

}  // namespace

nlohmann::json MemoryFit::to_json() const { return {{"max_memory", max_memory}, {"floor", floor}, {"read_ahead", read_ahead}}; }

std::string MemoryFit::note(int threads) const {
  if (!below_floor()) return "";
  return "note: --max-memory " + mib(max_memory) + " MiB is below the " + mib(floor) + " MiB this job needs at the least with --threads " +
         std::to_string(threads) +
         " (store writer, HDF5 and the process, compressed chunks in flight, decoding threads, 4 MiB of chunks: "
         "docs/RESHARD.md); it runs in those. Give --max-memory " + mib(floor) + "M or more for a budget it keeps, or fewer --threads.";
}

Result<MemoryFit> memory_fit(const std::string& max_memory, uint64_t reserve, const SourceBlocks* read_ahead) {
  MemoryFit f;
  CKPT_ASSIGN_OR_RETURN(f.max_memory, parse_byte_size(max_memory, "--max-memory"));
  f.read_ahead = read_ahead ? read_ahead->capacity() : 0;
  f.floor = reserve - std::min(reserve, f.read_ahead) + kMinChunkBudgetBytes;
  return f;
}

}  // namespace ckpt

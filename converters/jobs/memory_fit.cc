#include "converters/jobs/memory_fit.h"

#include <algorithm>
#include <utility>

#include "formats/io/output_file.h"
#include "formats/io/source_blocks.h"
#include "reshard/executor.h"
#include "reshard/store_reshard.h"

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

MemoryFit memory_fit(uint64_t max_memory, uint64_t reserve, const SourceBlocks* read_ahead) {
  MemoryFit f;
  f.max_memory = max_memory;
  f.read_ahead = read_ahead ? read_ahead->capacity() : 0;
  f.floor = reserve - std::min(reserve, f.read_ahead) + kMinChunkBudgetBytes;
  return f;
}

uint64_t chunk_bytes_within(uint64_t max_memory, int threads, size_t max_src_elem, size_t min_out_elem, uint64_t reserve) {
  const uint64_t budget = max_memory > reserve + kMinChunkBudgetBytes ? max_memory - reserve : kMinChunkBudgetBytes;  // below: MemoryFit
  return exec_chunk_bytes(budget, threads, max_src_elem, min_out_elem);
}

uint64_t chunk_bytes_for_copy(uint64_t max_memory, int threads, const TensorSource& src, const std::vector<Piece>& out,
                              uint64_t reserve) {
  size_t max_src = 1, min_out = 8;
  for (const auto& p : src.pieces()) max_src = std::max(max_src, dtype_size(p.dtype));
  for (const auto& p : out) min_out = std::min(min_out, dtype_size(p.dtype));
  return chunk_bytes_within(max_memory, threads, max_src, min_out, reserve);
}

ReadAheadFit fit_read_ahead(uint64_t max_memory, uint64_t reserve, int copy_threads) {
  const uint64_t stages = static_cast<uint64_t>(copy_threads) * kCopyThreadReadAheadBytes;
  if (max_memory < reserve + stages + kChunkBudgetBesideReadAheadBytes + kReadAheadMinBytes) return {};
  const uint64_t room = max_memory - reserve - stages - kChunkBudgetBesideReadAheadBytes;
  const uint64_t ahead = std::min(kReadAheadMaxBytes, room / kSourceBlockBytes * kSourceBlockBytes);
  if (ahead < kReadAheadMinBytes) return {};
  return {std::make_shared<SourceBlocks>(ahead, kReadAheadBlocksPerFile), stages + ahead};
}

// Threads of the store writer's pool. Uncompressed pieces are copied file to file there: those
// copies wait on the disk and, in an idle VM, on the host for every new page-cache page, so twice
// --threads keeps more reads and writes in flight (3.08 GB reshard, idle VM: medians 5.63 -> 5.10 s;
// hot: no slower; docs/BENCHMARKS.md). Only when --max-memory holds the extra threads' buffers
// beside kChunkBudgetBeforeWriterExtrasBytes of chunks. Compressed pieces keep --threads (CPU-bound),
// and the chunks they hold in flight (raw + compressed, 2 x 4 MiB each; 2 x threads + 2 of them keep
// the pool busy) are counted: reserved when --max-memory holds them beside the same chunk budget,
// else 3 of them (--threads 4 at 64M peaked at 123 MiB with no bound); and the partial chunk each
// writing thread stages.
uint64_t fit_store_writer(uint64_t max_memory, int threads, store::StoreOptions& so, bool cold_source) {
  const uint64_t reserve = kStoreWriterReserveBytes;
  so.hash_threads = threads;
  if (so.codec != store::Codec::kNone) {
    const uint64_t per_chunk = 2 * so.chunk_bytes, want = (2 * static_cast<uint64_t>(threads) + 2) * per_chunk;
    so.chunk_memory = max_memory >= reserve + want + kChunkBudgetBeforeWriterExtrasBytes ? want : 3 * per_chunk;
    return reserve + so.chunk_memory + static_cast<uint64_t>(threads) * so.chunk_bytes;  // + a partial chunk per writing thread
  }
  const uint64_t extra = static_cast<uint64_t>(threads) * kCopyThreadBytes;
  if (max_memory < reserve + extra + kChunkBudgetBeforeWriterExtrasBytes) return reserve;
  so.hash_threads = 2 * threads;
  if (so.io == IoMode::kDirect || (so.io == IoMode::kAuto && cold_source)) {
    // A cold source under --io auto too: mapped reads of it fill new page-cache pages, slow in an
    // idle VM (3.08 GB reshard, idle: 4.5 s mapped, 3.6-3.7 s direct; docs/BENCHMARKS.md).
    ReadAheadFit fit = fit_read_ahead(max_memory, reserve, so.hash_threads);
    if (fit.blocks) {
      so.read_ahead = std::move(fit.blocks);
      return reserve + fit.bytes;
    }
  }
  return reserve + extra;
}

}  // namespace ckpt

#include "converters/jobs/memory_fit.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "formats/io/output_file.h"
#include "formats/io/source_blocks.h"
#include "formats/io/write_pool.h"
#include "reshard/executor.h"
#include "reshard/store_reshard.h"

namespace ckpt {

namespace {

std::string mib(uint64_t bytes) { return std::to_string((bytes + (uint64_t{1} << 20) - 1) >> 20); }

}  // namespace

nlohmann::json MemoryFit::to_json() const {
  return {{"max_memory", max_memory}, {"floor", floor}, {"read_ahead", read_ahead}, {"write_pool", write_pool}};
}

std::string MemoryFit::note(int threads) const {
  if (!below_floor()) return "";
  return "note: --max-memory " + mib(max_memory) + " MiB is below the " + mib(floor) + " MiB this job needs at the least with --threads " +
         std::to_string(threads) +
         " (store writer, HDF5 and the process, compressed chunks in flight, decoding threads, 4 MiB of chunks: "
         "docs/RESHARD.md); it runs in those. Give --max-memory " + mib(floor) + "M or more for a budget it keeps, or fewer --threads.";
}

MemoryFit memory_fit(uint64_t max_memory, uint64_t reserve, const SourceBlocks* read_ahead, const WritePool* write_pool) {
  MemoryFit f;
  f.max_memory = max_memory;
  f.read_ahead = read_ahead ? read_ahead->capacity() : 0;
  f.write_pool = write_pool ? write_pool->memory() : 0;
  f.floor = reserve - std::min(reserve, f.read_ahead + f.write_pool) + kMinChunkBudgetBytes;
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
  // A cold source under --io auto reads direct too: mapped reads of it fill new page-cache pages,
  // slow in an idle VM (3.08 GB reshard, idle: 4.5 s mapped, 3.6-3.7 s direct; docs/BENCHMARKS.md).
  CopyIoFit fit = fit_copy_io(max_memory, reserve, extra, so.hash_threads, so.io,
                              so.io == IoMode::kDirect || (so.io == IoMode::kAuto && cold_source));
  so.read_ahead = std::move(fit.read_ahead);
  so.write_pool = std::move(fit.write_pool);
  return reserve + fit.bytes;
}

std::shared_ptr<WritePool> make_write_pool(uint64_t room, IoMode io) {
  // CKPT_WRITE_REQUEST_MIB (1..64): another request size, for measuring it (docs/BENCHMARKS.md).
  const char* env = std::getenv("CKPT_WRITE_REQUEST_MIB");
  const long mib = env ? std::strtol(env, nullptr, 10) : 0;
  const uint64_t request = mib >= 1 && mib <= 64 ? static_cast<uint64_t>(mib) << 20 : kWriteRequestBytes;
  const uint64_t n = std::min<uint64_t>(kWritePoolMaxBuffers * kWriteRequestBytes / request, room / request);
  if (n < kWritePoolMinBuffers || io == IoMode::kBuffered) return nullptr;
  auto pool = std::make_shared<WritePool>(static_cast<int>(n), request);
  pool->set_auto(io == IoMode::kAuto);
  return pool;
}

uint64_t fit_write_pool(uint64_t room, store::StoreOptions& so) {
  so.write_pool = so.codec == store::Codec::kNone ? make_write_pool(room, so.io) : nullptr;
  return so.write_pool ? so.write_pool->memory() : 0;
}

CopyIoFit fit_copy_io(uint64_t max_memory, uint64_t reserve, uint64_t extra, int copy_threads, IoMode io, bool direct_reads) {
  CopyIoFit f;
  if (direct_reads) {
    // The read-ahead first, up to kReadAheadBesideWritePoolBytes; the write pool out of the rest.
    const uint64_t stages = static_cast<uint64_t>(copy_threads) * kCopyThreadReadAheadBytes;
    const uint64_t base = reserve + stages + kChunkBudgetBesideReadAheadBytes + kReadAheadBesideWritePoolBytes;
    f.write_pool = make_write_pool(max_memory > base ? max_memory - base : 0, io);
    const uint64_t pool = f.write_pool ? f.write_pool->memory() : 0;
    ReadAheadFit ra = fit_read_ahead(max_memory, reserve + pool, copy_threads);
    if (ra.blocks) {
      f.read_ahead = std::move(ra.blocks);
      f.bytes = pool + ra.bytes;
      return f;
    }
    f.write_pool.reset();
  }
  const uint64_t used = reserve + extra + kChunkBudgetBeforeWriterExtrasBytes;
  f.write_pool = make_write_pool(max_memory > used ? max_memory - used : 0, io);
  f.bytes = extra + (f.write_pool ? f.write_pool->memory() : 0);
  return f;
}

nlohmann::json io_report(IoMode io, const SourceBlocks* read_ahead, const WritePool* write_pool) {
  nlohmann::json j = {{"mode", io_mode_name(io)}, {"copy_reads", read_ahead ? "direct" : "mapped"}};
  if (!write_pool) {
    j["writes"] = io == IoMode::kBuffered ? "buffered" : "per file";
    return j;
  }
  const WritePool::Stats st = write_pool->stats();
  const WritePool::Choice c = write_pool->choice();
  j["requests"] = st.writes;
  j["buffer_waits"] = st.acquire_waits;     // copies that waited for a free buffer: the disk was the limit
  j["write_seconds"] = st.write_seconds;    // summed over the requests (several in flight at once)
  j["partial_requests"] = st.partial_writes;  // requests under request_bytes (a file's ends, gaps, blocks released early)
  j["released_blocks"] = st.holder_releases;  // blocks written before they were full: no buffer was free
  j["request_bytes"] = write_pool->request_bytes();
  j["in_flight"] = write_pool->buffers();
  j["writes"] = c.automatic && !c.decided ? "probing" : c.route == WritePool::Route::kBuffered ? "buffered" : "direct";
  if (c.automatic) {
    j["probe_bytes"] = write_pool->probe_bytes();
    j["buffered_probe_bytes"] = write_pool->buffered_probe_bytes();
    j["direct_gb_s"] = c.direct_bytes_per_s / 1e9;
    j["buffered_gb_s"] = c.buffered_bytes_per_s / 1e9;
    if (c.buffered_run_bytes_per_s > 0) j["buffered_run_gb_s"] = c.buffered_run_bytes_per_s / 1e9;
    if (c.switched) j["switched_to"] = "direct";
  }
  return j;
}

nlohmann::json store_io_report(const store::StoreOptions& so) { return io_report(so.io, so.read_ahead.get(), so.write_pool.get()); }

}  // namespace ckpt

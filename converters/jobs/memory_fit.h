// How a streaming job (reshard, from-hf, to-hf) fits --max-memory, the one home of its budgets.
//
// A job's fixed buffers are reserved out of the budget before its chunks are sized: the store
// writer, HDF5 and the process (48 MiB), a compressed output's chunks in flight, a compressed
// source's decoding threads, to-hf's own process (converters/jobs/hf_jobs.cc). Those plus the
// smallest chunk budget the executor is given (kMinChunkBudgetBytes) are the job's floor:
//  - at or above the floor, the peak RSS stays under --max-memory plus a few MiB
//    (tests/python/test_memory.py);
//  - below it the job runs at its floor, the least it can do (it is never refused: tiny budgets
//    are how tests force tiny chunks), and the CLI says so on stderr (note()); --json reports both.
// A compressed -> compressed reshard on --threads 2 has a floor of 114 MiB; an uncompressed one 52
// (docs/RESHARD.md lists the others). Budgets are bytes, parsed from the flag text at the edge
// (converters/jobs/job_flags.h). Thread safety: pure functions and plain values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/store/store_options.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

class SourceBlocks;
class WritePool;

// --max-memory when none is given ("256M").
inline constexpr uint64_t kDefaultMaxMemory = uint64_t{256} << 20;

// The executor's chunk budget (what its chunk buffers may take of --max-memory; exec_chunk_bytes
// in reshard/executor.h divides it over the chunks in flight):
//  - the least it is given, whatever --max-memory says (below the floor the job runs in it);
inline constexpr uint64_t kMinChunkBudgetBytes = uint64_t{4} << 20;
//  - what --max-memory must still leave for chunks before the store writer takes more than its
//    least (a second copy thread per --threads, or every compressed chunk that keeps its pool
//    busy): the chunks carry every byte not copied as a stored file range (casts, re-layouts,
//    compressed pieces), so they keep 64 MiB;
inline constexpr uint64_t kChunkBudgetBeforeWriterExtrasBytes = uint64_t{64} << 20;
//  - what must stay for chunks beside the direct copies' read-ahead. A read-ahead is only set up
//    where pieces are copied as stored file ranges (read through it), so the chunks carry little
//    there and half of the budget above does; the rest of --max-memory reads ahead, which is what
//    direct copies run on (the disk rewards reads in flight: docs/RESHARD.md "Read-ahead").
inline constexpr uint64_t kChunkBudgetBesideReadAheadBytes = uint64_t{32} << 20;

// The direct copies' read-ahead (formats/io/source_blocks.h): none below kReadAheadMinBytes (too
// few blocks in flight to beat a window at a time), at most kReadAheadMaxBytes, up to
// kReadAheadBlocksPerFile blocks (kSourceBlockBytes each) ahead in each source file.
inline constexpr uint64_t kReadAheadMinBytes = uint64_t{64} << 20;
inline constexpr uint64_t kReadAheadMaxBytes = uint64_t{512} << 20;
inline constexpr int kReadAheadBlocksPerFile = 8;
// ... and what it keeps before a write pool (fit_write_pool) takes any of the budget.
inline constexpr uint64_t kReadAheadBesideWritePoolBytes = uint64_t{128} << 20;

struct MemoryFit {
  uint64_t max_memory = 0;  // bytes of --max-memory
  uint64_t floor = 0;       // the job's fixed buffers + kMinChunkBudgetBytes
  uint64_t read_ahead = 0;  // of max_memory: direct copies' source read-ahead (formats/io/source_blocks.h), 0: none
  uint64_t write_pool = 0;  // of max_memory: direct writes' buffers in flight (formats/io/write_pool.h), 0: none

  bool below_floor() const { return max_memory < floor; }
  nlohmann::json to_json() const;  // {"max_memory", "floor", "read_ahead", "write_pool"}: bytes
  // Below the floor: one line for stderr saying what was asked, what the job needs at the least
  // with `threads`, and what to change; "" otherwise.
  std::string note(int threads) const;
};

// `max_memory` (bytes of --max-memory) against `reserve`, the job's fixed bytes; `read_ahead`'s
// capacity, part of them (fit_read_ahead: what the budget left over), is reported, not part of
// the floor.
// `write_pool`'s buffers likewise (sized from what the budget left: not part of the floor).
MemoryFit memory_fit(uint64_t max_memory, uint64_t reserve, const SourceBlocks* read_ahead = nullptr,
                     const WritePool* write_pool = nullptr);

// The executor chunk size that keeps its buffers within `max_memory` less `reserve` bytes (never
// less than kMinChunkBudgetBytes), for `threads` workers, the widest source and narrowest output
// element.
uint64_t chunk_bytes_within(uint64_t max_memory, int threads, size_t max_src_elem, size_t min_out_elem,
                            uint64_t reserve = 0);
// The same for copying `src`'s pieces into `out` pieces (the widest source element, the narrowest
// output one).
uint64_t chunk_bytes_for_copy(uint64_t max_memory, int threads, const TensorSource& src, const std::vector<Piece>& out,
                              uint64_t reserve = 0);

// Direct copies by `copy_threads` threads reading their sources through one SourceBlocks: what
// `max_memory` leaves beside `reserve`, the threads' stages and kChunkBudgetBesideReadAheadBytes is
// read ahead, within [kReadAheadMinBytes, kReadAheadMaxBytes]; `bytes` = stages + read-ahead, to
// add to the job's reserve. No blocks when less than kReadAheadMinBytes is left.
struct ReadAheadFit {
  std::shared_ptr<SourceBlocks> blocks;
  uint64_t bytes = 0;
};
ReadAheadFit fit_read_ahead(uint64_t max_memory, uint64_t reserve, int copy_threads);

// How a job's native store writer fits `max_memory` beside the executor's chunk buffers: sets
// so.hash_threads (the writer's pool) and so.chunk_memory (compressed chunks in flight) for
// `threads`; returns the bytes of --max-memory to reserve for the writer, HDF5 and the process.
// Uncompressed stores copy their sources with direct reads through so.read_ahead (SourceBlocks)
// when so.io is kDirect, or kAuto and `cold_source` (the source mostly out of the page cache:
// JobSource::cold), and the budget leaves room for it.
// Uncompressed stores written direct (--io direct, or auto) also get so.write_pool when the budget
// holds at least kWritePoolMinBuffers of its buffers beside the rest (fit_write_pool), counted in
// the bytes returned.
uint64_t fit_store_writer(uint64_t max_memory, int threads, store::StoreOptions& so, bool cold_source = false);

// The direct writes' pool (formats/io/write_pool.h): as many buffers of kWriteRequestBytes as
// `room` bytes hold, at most kWritePoolMaxBuffers (each in flight at once); null below
// kWritePoolMinBuffers or for --io buffered. Under --io auto the pool chooses per run between
// direct and buffered writes (WritePool::set_auto).
inline constexpr uint64_t kWritePoolMinBuffers = 2;
inline constexpr uint64_t kWritePoolMaxBuffers = 6;
std::shared_ptr<WritePool> make_write_pool(uint64_t room, IoMode io);
// The same for a store: none for a compressed one; sets so.write_pool, returns its bytes.
uint64_t fit_write_pool(uint64_t room, store::StoreOptions& so);

// How a job that copies file ranges into its outputs (the store writer, to-hf's safetensors
// shards) reads and writes them within `max_memory` beside `reserve`: with `direct_reads` (--io
// direct, or auto from a cold source) a read-ahead for `copy_threads` and a write pool out of what
// it leaves beyond kReadAheadBesideWritePoolBytes; else (or when no read-ahead fits) the copy
// threads' own buffers (`extra` bytes) and, unless --io buffered, a write pool out of what is left
// beside kChunkBudgetBeforeWriterExtrasBytes of chunks. `bytes`: what they take, to add to the
// reserve.
struct CopyIoFit {
  std::shared_ptr<SourceBlocks> read_ahead;
  std::shared_ptr<WritePool> write_pool;
  uint64_t bytes = 0;
};
CopyIoFit fit_copy_io(uint64_t max_memory, uint64_t reserve, uint64_t extra, int copy_threads, IoMode io, bool direct_reads);

// How a store job's data went to the disk, for --json: {"mode": --io, "copy_reads": "direct" |
// "mapped", "writes": "direct" | "buffered" | "per file" (no pool: each file as --io resolves for
// it) | "probing" (auto, the run ended before both probes), and with a pool "requests",
// "request_bytes", "in_flight"; under auto "probe_bytes", "direct_gb_s", "buffered_gb_s" (what the
// probes measured)}.
nlohmann::json io_report(IoMode io, const SourceBlocks* read_ahead, const WritePool* write_pool);
nlohmann::json store_io_report(const store::StoreOptions& so);

}  // namespace ckpt

#include "converters/jobs/reshard_job.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "converters/jobs/memory_fit.h"
#include "converters/jobs/open_checkpoint.h"
#include "converters/jobs/source_check_job.h"
#include "converters/model/llama_config.h"
#include "converters/model/llama_sharding.h"
#include "converters/profile/profile_view.h"
#include "formats/base/byte_size.h"
#include "formats/base/fs_util.h"
#include "formats/base/int_list.h"
#include "formats/store/run_dir.h"
#include "formats/store/store_options.h"
#include "formats/store/store_reader.h"
#include "reshard/dist/comm.h"
#include "reshard/executor.h"
#include "reshard/source_verify.h"
#include "reshard/store_reshard.h"

namespace ckpt {

Result<Layout> LayoutValues::make(int64_t num_layers) const {
  if (tp < 1 || pp < 1 || dp < 1)
    return Status::InvalidArgument("layout flags: give --tp N --pp N --dp N (each >= 1), optionally --pp-layers and --zero");
  std::vector<int> per;
  if (!pp_layers.empty()) {
    CKPT_ASSIGN_OR_RETURN(per, parse_int_list(pp_layers, "--pp-layers"));
  }
  return Layout::make(tp, pp, dp, zero < 0 ? 0 : zero, static_cast<int>(num_layers), per);
}

Result<uint64_t> chunk_bytes_within(const std::string& max_memory, int threads, size_t max_src_elem,
                                    size_t min_out_elem, uint64_t reserve) {
  CKPT_ASSIGN_OR_RETURN(uint64_t mem, parse_byte_size(max_memory, "--max-memory"));
  const uint64_t budget = mem > reserve + kMinChunkBudgetBytes ? mem - reserve : kMinChunkBudgetBytes;  // below: MemoryFit
  return exec_chunk_bytes(budget, threads, max_src_elem, min_out_elem);
}

bool cold_source(const std::string& path, IoMode io) {
  if (io != IoMode::kAuto) return false;
  auto dir = store::resolve_checkpoint(path);  // a native store's run dir: its current checkpoint
  return page_cache_share(dir.ok() ? *dir : path) < 0.5;
}

ReadAheadFit fit_read_ahead(uint64_t mem, uint64_t reserve, int copy_threads) {
  constexpr uint64_t kChunkBudgetBytes = uint64_t{32} << 20;  // extent copies need few chunks
  constexpr uint64_t kMinBytes = uint64_t{64} << 20, kMaxBytes = uint64_t{512} << 20;
  constexpr int kDepth = 8;  // blocks of 8 MiB ahead per source file
  const uint64_t stages = static_cast<uint64_t>(copy_threads) * kCopyThreadReadAheadBytes;
  if (mem < reserve + stages + kChunkBudgetBytes + kMinBytes) return {};
  const uint64_t room = mem - reserve - stages - kChunkBudgetBytes;
  const uint64_t ahead = std::min(kMaxBytes, room / kSourceBlockBytes * kSourceBlockBytes);
  if (ahead < kMinBytes) return {};
  return {std::make_shared<SourceBlocks>(ahead, kDepth), stages + ahead};
}

// Threads of the store writer's pool. Uncompressed pieces are copied file to file there: those
// copies wait on the disk and, in an idle VM, on the host for every new page-cache page, so twice
// --threads keeps more reads and writes in flight (3.08 GB reshard, idle VM: medians 5.63 -> 5.10 s;
// hot: no slower; docs/BENCHMARKS.md, issue 15 session 13). Only when --max-memory holds the extra
// threads' buffers beside a 64 MiB chunk budget. Compressed pieces keep --threads (CPU-bound), and
// the chunks they hold in flight (raw + compressed, 2 x 4 MiB each; 2 x threads + 2 of them keep
// the pool busy) are counted: reserved when --max-memory holds them beside a 64 MiB chunk budget,
// else 3 of them (--threads 4 at 64M peaked at 123 MiB before, issue 15); and the partial chunk
// each writing thread stages.
Result<uint64_t> fit_store_writer(const std::string& max_memory, int threads, store::StoreOptions& so, bool cold_source) {
  CKPT_ASSIGN_OR_RETURN(const uint64_t mem, parse_byte_size(max_memory, "--max-memory"));
  constexpr uint64_t kChunkBudgetBytes = uint64_t{64} << 20;
  uint64_t reserve = kStoreWriterReserveBytes;
  so.hash_threads = threads;
  if (so.codec != store::Codec::kNone) {
    const uint64_t per_chunk = 2 * so.chunk_bytes, want = (2 * static_cast<uint64_t>(threads) + 2) * per_chunk;
    so.chunk_memory = mem >= reserve + want + kChunkBudgetBytes ? want : 3 * per_chunk;
    return reserve + so.chunk_memory + static_cast<uint64_t>(threads) * so.chunk_bytes;  // + a partial chunk per writing thread
  }
  const uint64_t extra = static_cast<uint64_t>(threads) * kCopyThreadBytes;
  if (mem < reserve + extra + kChunkBudgetBytes) return reserve;
  so.hash_threads = 2 * threads;
  if (so.io == IoMode::kDirect || (so.io == IoMode::kAuto && cold_source)) {
    // A cold source under --io auto too: mapped reads of it fill new page-cache pages, slow in an
    // idle VM (3.08 GB reshard, idle: 4.5 s mapped, 3.6-3.7 s direct; issue 15 session 17).
    ReadAheadFit fit = fit_read_ahead(mem, reserve, so.hash_threads);
    if (fit.blocks) {
      so.read_ahead = std::move(fit.blocks);
      return reserve + fit.bytes;
    }
  }
  return reserve + extra;
}

uint64_t source_decode_reserve(const TensorSource& src, int threads) { return src.read_memory(threads); }

namespace {

// SRC as opened: a native store (checksummed, re-verifiable) or another TensorSource.
struct OpenedSource {
  std::unique_ptr<store::StoreReader> store;
  std::unique_ptr<TensorSource> other;
  TensorSource& get() { return store ? static_cast<TensorSource&>(*store) : *other; }
};

// A native store (opened as such: its checksums are re-verified), or any other kind
// open_checkpoint reads (Megatron, DCP, HF: they carry their model config in metadata).
Result<OpenedSource> open_reshard_source(const std::string& path) {
  OpenedSource s;
  if (!is_native_store(path)) {
    auto m = open_checkpoint(path);
    if (!m.ok()) return m.take_status().with_context("opening SRC");
    s.other = std::move(m).value();
  } else {
    auto reader = store::StoreReader::open(path);
    if (!reader.ok()) return reader.take_status().with_context("opening SRC");
    s.store = std::move(reader).value();
  }
  return s;
}

Result<Layout> target_layout(const ReshardRequest& r, const LlamaConfig& cfg, const nlohmann::json& src_meta) {
  Layout l;
  if (!r.layout_file.empty()) {
    if (r.layout.given())
      return Status::InvalidArgument("--layout FILE excludes --tp/--pp/--dp/--zero/--pp-layers");
    CKPT_ASSIGN_OR_RETURN(l, Layout::from_file(r.layout_file));
  } else {
    if (!r.layout.given() && r.profile.given() && src_meta.contains("layout"))
      return Layout::from_json(src_meta["layout"]);  // a profile conversion keeping the layout
    if (!r.layout.given()) return Status::InvalidArgument("give --layout FILE, or --tp N --pp N --dp N (each >= 1)");
    CKPT_ASSIGN_OR_RETURN(l, r.layout.make(cfg.num_hidden_layers));
    if (src_meta.contains("layout")) l.keep_source_settings(src_meta["layout"]);
  }
  return l;
}

// The model config, target layout and executor options of a reshard of `src`.
Status prepare(const ReshardRequest& r, TensorSource& src, LlamaConfig& cfg, Layout& layout, ExecOptions& eo, uint64_t reserve) {
  const nlohmann::json& meta = src.metadata();
  if (!meta.contains("model_config"))
    return Status::Error("NoModelConfig",
                         "SRC '" + src.describe() + "' has no model_config metadata: cannot derive sharding rules");
  auto c = LlamaConfig::from_json(meta["model_config"]);
  if (!c.ok()) return c.take_status().with_context("model_config of '" + src.describe() + "'");
  cfg = *c;
  CKPT_ASSIGN_OR_RETURN(layout, target_layout(r, cfg, meta));
  // Buffer budget: the rest after what the store writer, HDF5 and the process itself need.
  eo.threads = r.threads;
  size_t max_src = 1;
  for (const auto& p : src.pieces()) max_src = std::max(max_src, dtype_size(p.dtype));
  CKPT_ASSIGN_OR_RETURN(eo.max_chunk_bytes, chunk_bytes_within(r.max_memory, r.threads, max_src, 1, reserve));
  return Status::Ok();
}

// A conversion's transpose / cast tiles: three per executor thread.
uint64_t profile_tiles_reserve(int threads) {
  return uint64_t{3} * (static_cast<uint64_t>(threads) + 1) * kProfileTileBytes;
}

// The profile views of a conversion job, and the chunk size re-sized for the view's dtypes and
// its transpose / cast tiles.
Result<std::unique_ptr<ProfileConversion>> prepare_profile_job(const ReshardRequest& r, TensorSource& src,
                                                               const LlamaConfig& cfg, Layout& layout, ExecOptions& eo,
                                                               uint64_t reserve) {
  const bool root = !r.dist || r.dist->rank() == 0;
  CKPT_ASSIGN_OR_RETURN(auto conv, ProfileConversion::prepare(src, r.profile, cfg, layout, root, kProfileTileBytes));
  size_t max_src = 1, min_out = 8;
  for (const auto& p : conv->source().pieces()) {
    max_src = std::max(max_src, dtype_size(p.dtype));
    min_out = std::min(min_out, dtype_size(p.dtype));
  }
  // Staged transposes (reshard/staged_read.h) hold the chunk's canonical bytes in SRC's dtypes.
  for (const auto& p : src.pieces()) max_src = std::max(max_src, dtype_size(p.dtype));
  CKPT_ASSIGN_OR_RETURN(eo.max_chunk_bytes, chunk_bytes_within(r.max_memory, r.threads, max_src, min_out,
                                                               reserve + profile_tiles_reserve(r.threads)));
  return conv;
}

// Whether CopyVerify can check SRC from the copies' reads: every piece stored uncompressed, and
// copied as stored (no profile views, whose pieces are computed, not copied from file ranges: the
// check would re-read all of SRC after the copy, where the child process overlaps it).
bool check_from_copy(const ReshardRequest& r) {
  auto dir = store::resolve_checkpoint(r.src);
  if (!dir.ok()) return false;
  auto m = store::load_manifest(*dir);
  return m.ok() && copy_verifiable(*m) && !needs_profile_views(m->metadata, r.profile);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<ReshardOutcome> run_reshard_job(const ReshardRequest& r) {
  CKPT_ASSIGN_OR_RETURN(store::StoreOptions sopts, store::parse_compress_spec(r.compress, "--compress"));
  CKPT_ASSIGN_OR_RETURN(sopts, store::parse_digest_spec(r.digest, "--digest", sopts));
  CKPT_ASSIGN_OR_RETURN(sopts.io, parse_io_mode(r.io, "--io"));
  CKPT_ASSIGN_OR_RETURN(uint64_t reserve, fit_store_writer(r.max_memory, r.threads, sopts, !r.dry_run && cold_source(r.src, sopts.io)));

  // SRC checked by its format's own checks (converters/jobs/source_check_job.h): overlapped with the
  // reshard in a child process forked before this process opens SRC; under mpirun inline on rank 0
  // before committing; where the copies read SRC direct (--io direct, or a cold SRC under --io
  // auto) and an uncompressed native SRC is copied as stored, from the copy's own reads
  // (CopyVerify: SRC read once).
  const bool skip_check = r.no_verify || r.dry_run || (r.dist && r.dist->rank() != 0);
  const bool from_copy = !skip_check && !r.dist && sopts.read_ahead && check_from_copy(r);
  JobSourceCheck check;
  check.start(r.src, sopts.io, r.threads, skip_check, /*in_child=*/!r.dist && !from_copy);

  CKPT_ASSIGN_OR_RETURN(OpenedSource opened, open_reshard_source(r.src));
  if (opened.store) opened.store->set_decode_threads(r.threads);  // compressed SRC: chunks decoded on --threads
  TensorSource& src = opened.get();
  LlamaConfig cfg;
  ReshardOutcome out;
  ExecOptions eo;
  reserve += source_decode_reserve(src, r.threads);
  CKPT_ASSIGN_OR_RETURN(out.memory, memory_fit(r.max_memory, reserve, sopts.read_ahead.get()));
  CKPT_RETURN_IF_ERROR(prepare(r, src, cfg, out.layout, eo, reserve));
  LlamaShardingRules llama_rules(cfg);
  out.src_description = src.describe();
  out.processes = r.dist ? r.dist->size() : 1;
  // Profile conversion (issue 14): plan from the target profile's view of SRC.
  std::unique_ptr<ProfileConversion> conv;
  if (needs_profile_views(src.metadata(), r.profile)) {
    CKPT_ASSIGN_OR_RETURN(conv, prepare_profile_job(r, src, cfg, out.layout, eo, reserve));
    out.memory.floor += profile_tiles_reserve(r.threads);
  }
  TensorSource& plan_src = conv ? conv->source() : src;
  const ShardingRules& rules = conv ? conv->rules() : static_cast<const ShardingRules&>(llama_rules);

  const auto t0 = std::chrono::steady_clock::now();
  CKPT_ASSIGN_OR_RETURN(out.plan, make_plan(plan_src.tensors(), plan_src.pieces(), plan_src.metadata(), out.layout, rules, eo));
  out.plan_seconds = seconds_since(t0);
  if (r.dry_run) return out;

  StoreExecOptions so;
  if (conv) {
    so.process_note = [&conv] { return conv->process_note(); };
    so.amend_metadata = [&conv](const std::vector<std::string>& notes, nlohmann::json& md) { return conv->amend(notes, md); };
  }
  so.exec = eo;
  so.store = sopts;
  so.exec.progress = r.progress;
  if (from_copy) check.from_copy(src, *sopts.read_ahead);
  if (!skip_check) so.before_commit = check.before_commit(src);
  CKPT_RETURN_IF_ERROR(execute_plan_to_store(plan_src, out.plan, r.dst, so, r.dist));
  out.seconds = seconds_since(t0);
  out.source_check = check.to_json();
  out.source_check.erase("scheme");  // reshard's JSON as before: how (+ bytes_from_copy, bytes_reread)
  out.source_check.erase("note");
  if (conv) {
    out.profile = conv->target().name;
    out.from_profile = conv->from().name;
    out.exactness = conv->report();
  }
  return out;
}

}  // namespace ckpt

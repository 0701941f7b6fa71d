#include "converters/jobs/reshard_job.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "converters/jobs/memory_fit.h"
#include "converters/model/llama_sharding.h"
#include "converters/profile/profile_view.h"
#include "converters/quant/quant_sharding.h"
#include "converters/quant/requantize.h"
#include "converters/source/job_source.h"
#include "converters/source/source_check_job.h"
#include "reshard/dist/comm.h"
#include "reshard/executor.h"
#include "reshard/store_reshard.h"

namespace ckpt {

Result<Layout> reshard_target_layout(const ReshardRequest& r, const LlamaConfig& cfg, const nlohmann::json& src_meta) {
  if (r.layout_file) {
    if (r.layout.given())
      return Status::InvalidArgument("--layout FILE excludes --tp/--pp/--dp/--zero/--pp-layers/--ep/--etp");
    return *r.layout_file;
  }
  if (!r.layout.given() && r.profile.given() && src_meta.contains("layout"))
    return Layout::from_json(src_meta["layout"]);  // a profile conversion keeping the layout
  if (!r.layout.given()) return Status::InvalidArgument("give --layout FILE, or --tp N --pp N --dp N (each >= 1)");
  CKPT_ASSIGN_OR_RETURN(Layout l, r.layout.make(cfg.num_hidden_layers));
  if (src_meta.contains("layout")) l.keep_source_settings(src_meta["layout"]);
  return l;
}

uint64_t source_decode_reserve(const TensorSource& src, int threads) { return src.read_memory(threads); }

namespace {

// A reshard planned: SRC located and opened once, DST's store options fitted to --max-memory, its
// check started, the model, target layout, profile views, chunk size and plan. run_reshard_job
// executes it.
struct PlannedReshard {
  JobSource located;
  store::StoreOptions store;  // the request's, with the writer's share of --max-memory fitted
  uint64_t reserve = 0;       // bytes of --max-memory beside the executor's chunks
  JobSourceCheck check;
  bool skip_check = false;  // --no-verify, --dry-run, or another rank's to check
  bool from_copy = false;   // checked from the copies' own direct reads (CopyVerify)
  std::unique_ptr<TensorSource> src;
  std::unique_ptr<ShardingRules> model_rules;  // the LLaMA rules ...
  std::unique_ptr<ShardingRules> llama_rules;  // ... or, for a quantized SRC, them keeping weights and scales together
  std::unique_ptr<Requantized> requant;        // --requantize: SRC re-blocked (converters/quant/requantize.h)
  std::unique_ptr<ProfileConversion> conv;  // the profile views, when the job goes through them
  ExecOptions exec;
  std::chrono::steady_clock::time_point t0;  // the plan's start
  ReshardOutcome out;

  TensorSource& plan_source() { return conv ? conv->source() : requant ? *requant->view : *src; }
  const ShardingRules& rules() const { return conv ? conv->rules() : *llama_rules; }
};

// SRC located once; DST's writer fitted (direct copies read ahead from a cold SRC); SRC's check
// started before this process opens SRC (its child forks first), then SRC opened once, as stored
// (a store in a profile goes through the profile views, ProfileConversion, not its canonical
// view). SRC's check: overlapped with the reshard in a child process; under mpirun inline on rank
// 0 before committing; where the copies read SRC direct (--io direct, or a cold SRC under --io
// auto) and an uncompressed native SRC is copied as stored, from the copies' own reads
// (CopyVerify: SRC read once).
Status open_reshard_source(const ReshardRequest& r, PlannedReshard& p) {
  p.located = JobSource::locate(r.src, r.source_profile);
  p.store = r.store;
  p.reserve = fit_store_writer(r.max_memory, r.threads, p.store, !r.dry_run && p.located.cold(p.store.io));
  p.skip_check = r.no_verify || r.dry_run || (r.dist && r.dist->rank() != 0);
  p.from_copy = !p.skip_check && !r.dist && p.store.read_ahead && p.located.copy_checkable(r.profile);
  p.check.start(p.located.dir, p.store.io, r.threads, p.skip_check, /*in_child=*/!r.dist && !p.from_copy);
  auto src = p.located.open(/*as_stored=*/true);
  if (!src.ok()) return src.take_status().with_context("opening SRC");
  p.src = std::move(src).value();
  p.src->set_read_threads(r.threads);  // a compressed SRC: chunks decoded on --threads
  return Status::Ok();
}

// A conversion's transpose / cast tiles: three per executor thread.
uint64_t profile_tiles_reserve(int threads) {
  return uint64_t{3} * (static_cast<uint64_t>(threads) + 1) * kProfileTileBytes;
}

// The model config, target layout, sharding rules and chunk size of the reshard; with the profile
// views the chunk size is fitted to the views' dtypes and their transpose / cast tiles.
Status plan_model_and_chunks(const ReshardRequest& r, PlannedReshard& p) {
  TensorSource& src = *p.src;
  const nlohmann::json& meta = src.metadata();
  if (!meta.contains("model_config"))
    return Status::Error("NoModelConfig",
                         "SRC '" + src.describe() + "' has no model_config metadata: cannot derive sharding rules");
  auto c = LlamaConfig::from_json(meta["model_config"]);
  if (!c.ok()) return c.take_status().with_context("model_config of '" + src.describe() + "'");
  const LlamaConfig& cfg = *c;
  CKPT_ASSIGN_OR_RETURN(p.out.layout, reshard_target_layout(r, cfg, meta));
  p.exec.threads = r.threads;
  size_t max_src = 1, min_out = 1;
  for (const auto& piece : src.pieces()) max_src = std::max(max_src, dtype_size(piece.dtype));
  p.exec.max_chunk_bytes = chunk_bytes_within(r.max_memory, r.threads, max_src, min_out, p.reserve);
  p.llama_rules = std::make_unique<LlamaShardingRules>(cfg);
  CKPT_ASSIGN_OR_RETURN(QuantScheme scheme, find_quantized(src.tensors(), meta));
  if (scheme.any()) {  // converters/quant/quant_sharding.h
    p.model_rules = std::move(p.llama_rules);
    if (r.requantize) {
      CKPT_ASSIGN_OR_RETURN(p.requant, requantize_for_layout(src, scheme, *p.model_rules, p.out.layout));
      if (p.requant) scheme = p.requant->scheme;
    }
    p.llama_rules = std::make_unique<QuantShardingRules>(*p.model_rules, std::move(scheme));
  }
  if (!needs_profile_views(meta, r.profile)) return Status::Ok();
  const bool root = !r.dist || r.dist->rank() == 0;
  CKPT_ASSIGN_OR_RETURN(p.conv, ProfileConversion::prepare(src, r.profile, cfg, p.out.layout, root, kProfileTileBytes));
  min_out = 8;
  for (const auto& piece : p.conv->source().pieces()) {
    max_src = std::max(max_src, dtype_size(piece.dtype));
    min_out = std::min(min_out, dtype_size(piece.dtype));
  }
  // Staged transposes (reshard/staged_read.h) hold the chunk's canonical bytes in SRC's dtypes: max_src
  // counts SRC's pieces as above.
  const uint64_t tiles = profile_tiles_reserve(r.threads);
  p.exec.max_chunk_bytes = chunk_bytes_within(r.max_memory, r.threads, max_src, min_out, p.reserve + tiles);
  p.out.memory.floor += tiles;
  return Status::Ok();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// SRC located and opened once, and everything the run needs planned from it.
Status plan_reshard(const ReshardRequest& r, PlannedReshard& p) {
  CKPT_RETURN_IF_ERROR(open_reshard_source(r, p));
  p.reserve += source_decode_reserve(*p.src, r.threads);
  p.out.memory = memory_fit(r.max_memory, p.reserve, p.store.read_ahead.get(), p.store.write_pool.get());
  CKPT_RETURN_IF_ERROR(plan_model_and_chunks(r, p));
  p.out.src_description = p.src->describe();
  p.out.source = source_detected_of(*p.src);
  p.out.processes = r.dist ? r.dist->size() : 1;
  TensorSource& plan_src = p.plan_source();
  p.t0 = std::chrono::steady_clock::now();
  CKPT_ASSIGN_OR_RETURN(p.out.plan, make_plan(plan_src.tensors(), plan_src.pieces(), plan_src.metadata(), p.out.layout,
                                              p.rules(), p.exec));
  p.out.plan_seconds = seconds_since(p.t0);
  return Status::Ok();
}

// The planned reshard written to DST, SRC checked before the commit.
Status execute_reshard(const ReshardRequest& r, PlannedReshard& p) {
  StoreExecOptions so;
  ProfileConversion* conv = p.conv.get();
  if (conv) {
    so.process_note = [conv] { return conv->process_note(); };
    so.amend_metadata = [conv](const std::vector<std::string>& notes, nlohmann::json& md) { return conv->amend(notes, md); };
  }
  so.exec = p.exec;
  so.store = p.store;
  so.exec.progress = r.progress;
  if (p.from_copy) p.check.from_copy(*p.src, *p.store.read_ahead);
  if (!p.skip_check) so.before_commit = p.check.before_commit(*p.src);
  CKPT_RETURN_IF_ERROR(execute_plan_to_store(p.plan_source(), p.out.plan, r.dst, so, r.dist));
  p.out.seconds = seconds_since(p.t0);
  p.out.io = store_io_report(p.store);
  p.out.source_check = p.check.to_json();
  p.out.source_check.erase("scheme");  // reshard's JSON names how only (+ bytes_from_copy, bytes_reread)
  p.out.source_check.erase("note");
  if (conv) {
    p.out.profile = conv->target().name;
    p.out.from_profile = conv->from().name;
    p.out.exactness = conv->report();
  }
  if (p.requant) p.out.exactness = p.requant->tracker->snapshot();
  return Status::Ok();
}

}  // namespace

Result<ReshardOutcome> run_reshard_job(const ReshardRequest& r) {
  PlannedReshard p;
  CKPT_RETURN_IF_ERROR(plan_reshard(r, p));
  if (!r.dry_run) CKPT_RETURN_IF_ERROR(execute_reshard(r, p));
  return std::move(p.out);
}

}  // namespace ckpt

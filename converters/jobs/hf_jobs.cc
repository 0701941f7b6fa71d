#include "converters/jobs/hf_jobs.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "converters/hf/hf_export.h"
#include "converters/hf/hf_files.h"
#include "converters/hf/hf_import.h"
#include "converters/hf/hf_moe_names.h"
#include "converters/jobs/reshard_job.h"
#include "converters/quant/dequant_view.h"
#include "converters/quant/quantize_view.h"
#include "converters/paddle/paddlenlp_write.h"
#include "converters/source/job_source.h"
#include "converters/source/source_check_job.h"
#include "formats/io/output_file.h"
#include "formats/store/store_options.h"
#include "formats/store/store_writer.h"
#include "formats/torch/dcp/dcp.h"
#include "reshard/dist/comm.h"

namespace ckpt {

namespace {

// to-hf's share of --max-memory beside its chunks: the process, HDF5, the copies' buffers.
constexpr uint64_t kToHfReserveBytes = uint64_t{24} << 20;

double hf_job_seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A quantized source (converters/quant/): replaced by its dequantized view (weights in `dtype`,
// bf16 when none), or with `keep` its payloads and scales named in `keep_as_stored`. What was done,
// for the outcome; null for a source without quantized tensors.
Result<nlohmann::json> quantized_export_source(std::unique_ptr<TensorSource>& src, bool keep, std::optional<DType> dtype,
                                               std::set<std::string>& keep_as_stored, ExactnessTracker* tracker,
                                               std::set<std::string>* stored_elsewhere = nullptr) {
  auto scheme = find_quantized(src->tensors(), src->metadata());
  if (!scheme.ok()) return scheme.take_status().with_file(src->describe());
  if (!scheme->any()) return nlohmann::json(nullptr);
  const DType dt = dtype.value_or(DType::kBF16);
  nlohmann::json j = {{"scheme", scheme->describe()}, {"tensors", scheme->tensors.size()}, {"dequantized", !keep},
                      {"stored_bytes", scheme->stored_bytes()}, {"dequantized_bytes", scheme->logical_bytes(dt)}};
  if (keep) {
    for (auto& n : scheme->stored_names()) keep_as_stored.insert(n);
    for (const auto& t : scheme->tensors)
      if (stored_elsewhere && t.payload != t.name) stored_elsewhere->insert(t.name);  // MXFP4: X_blocks for X
    return j;
  }
  TensorSource& inner = *src;
  CKPT_ASSIGN_OR_RETURN(auto view, dequant_view(inner, std::move(src), *scheme, dt, tracker));
  // Fused FP8 experts (`mlp.experts.gate_up_proj` + `_scale_inv`, whose blocks may straddle gate and
  // up) map onto the canonical stacked experts once dequantized: the MoE view on top of this one.
  const bool fused = std::any_of(view->tensors().begin(), view->tensors().end(),
                                 [](const TensorMeta& t) { return t.name.ends_with(".mlp.experts.gate_up_proj"); });
  if (fused) {
    CKPT_ASSIGN_OR_RETURN(view, hf_moe_canonical_source(std::move(view)));
  }
  src = std::move(view);
  return j;
}

// --quantize: `src` replaced by its quantizing view, whose payloads and scales are written as they are.
Result<nlohmann::json> quantizing_export_source(std::unique_ptr<TensorSource>& src, const std::string& flag,
                                                std::set<std::string>& keep_as_stored, std::set<std::string>& stored_elsewhere,
                                                ExactnessTracker* tracker) {
  CKPT_ASSIGN_OR_RETURN(QuantizeRequest q, parse_quantize_flag(flag));
  q.tracker = tracker;
  q.step = q.scheme == "mxfp4" ? std::string("quantize mxfp4 1x32")
                               : "quantize fp8-block " + std::to_string(q.block_rows) + "x" + std::to_string(q.block_cols);
  TensorSource& inner = *src;
  CKPT_ASSIGN_OR_RETURN(auto view, quantize_view(inner, std::move(src), q));
  src = std::move(view);
  CKPT_ASSIGN_OR_RETURN(QuantScheme scheme, find_quantized(src->tensors(), src->metadata()));
  for (auto& n : scheme.stored_names()) keep_as_stored.insert(n);
  for (const auto& t : scheme.tensors)
    if (t.payload != t.name) stored_elsewhere.insert(t.name);
  return nlohmann::json{{"scheme", scheme.describe()}, {"tensors", scheme.tensors.size()}, {"quantized", true},
                        {"stored_bytes", scheme.stored_bytes()},
                        {"rounding", q.scheme == "mxfp4" ? "gpt-oss: triton_kernels downcast_to_mxfp (scale rounded up)"
                                                         : "transformers FineGrainedFP8 (Fp8Quantize)"}};
}

Status hf_job_check_threads(int threads) {
  if (threads < 1 || threads > 64) return Status::InvalidArgument("--threads " + std::to_string(threads) + ": expected 1..64");
  return Status::Ok();
}

}  // namespace

nlohmann::json ToHfOutcome::to_json() const {
  nlohmann::json j = {{"out", out},         {"tensors", tensors}, {"bytes", bytes},     {"config", config},
          {"files", files},     {"skipped", skipped}, {"seconds", seconds}, {"memory", memory.to_json()},
          {"source_check", source_check}, {"io", io}, {"quantization", quantization}};
  if (!source.is_null()) j["source"] = source;
  if (!profile.empty()) j["profile"] = profile;
  return j;
}

Result<ToHfOutcome> run_to_hf_job(const ToHfRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  CKPT_RETURN_IF_ERROR(hf_job_check_threads(req.threads));
  HfExportOptions opts;
  opts.threads = req.threads;
  opts.fsync = req.fsync;
  opts.progress = req.progress;
  opts.io = req.io;
  opts.dtype = req.dtype;
  opts.max_shard_size = req.max_shard_size;
  // SRC's check: from the copies' own direct reads where they read SRC direct (a cold source, or
  // --io direct) and it is copied as stored (CopyVerify: SRC read once); else in a child process
  // forked before this process opens SRC.
  const JobSource located = JobSource::locate(req.src, req.source_profile);
  const bool direct_reads = opts.io == IoMode::kDirect || located.cold(opts.io);
  const bool check_copy = !req.no_verify && direct_reads && located.copy_checkable();
  JobSourceCheck check;
  check.start(located.dir, opts.io, req.threads, req.no_verify, /*in_child=*/!check_copy);
  CKPT_ASSIGN_OR_RETURN(auto src, located.open());
  ToHfOutcome out;
  ExactnessTracker quant_report;  // what dequantizing / quantizing changed (docs/QUANTIZATION.md)
  CKPT_ASSIGN_OR_RETURN(out.quantization,
                        quantized_export_source(src, req.keep_quantized, req.dtype, opts.keep_as_stored, &quant_report, &opts.stored_elsewhere));
  if (!req.quantize.empty()) {
    CKPT_ASSIGN_OR_RETURN(out.quantization,
                          quantizing_export_source(src, req.quantize, opts.keep_as_stored, opts.stored_elsewhere, &quant_report));
  }
  opts.before_commit = check.before_commit(*src);
  out.source = source_detected_of(*src);
  std::optional<PaddleNlpExport> paddle;  // --profile paddlenlp[-fused]: PaddleNLP's files
  if (!req.profile.empty() && req.profile != "hf") {
    CKPT_ASSIGN_OR_RETURN(paddle, paddlenlp_export_view(*src, req.profile, req.dtype));
    opts.dtype.reset();  // cast by the view
    opts.shard_metadata = {{"format", "np"}};
    opts.integer_weights = true;  // bf16 as U16, PaddleNLP's convention
    out.profile = paddle->profile;
  }
  TensorSource& written = paddle ? *paddle->view : *src;
  auto plan = plan_hf_export(written, req.src, opts);
  if (!plan.ok()) return plan.take_status().with_file(req.src);
  if (paddle) plan->config = paddle->config;
  // The process itself and a compressed source's decoding threads (the executor's) come out of the budget.
  const uint64_t decode = source_decode_reserve(written, req.threads);
  uint64_t reserve = kToHfReserveBytes + decode;
  // As reshard's store writer (fit_copy_io): copied file ranges read direct and ahead through one
  // SourceBlocks with --io direct, and with auto when the source is cold (mapped reads of it fill
  // new page-cache pages, slow in an idle VM); the shards' direct writes staged in a WritePool, several
  // large requests in flight across the shard files, and under auto its per-run choice. Not for a
  // compressed store, whose chunks are decoded, not copied: its writes go as --io says per file.
  if (decode == 0) {
    CopyIoFit fit = fit_copy_io(req.max_memory, reserve, 0, req.threads, opts.io, direct_reads);
    opts.read_ahead = std::move(fit.read_ahead);
    opts.write_pool = std::move(fit.write_pool);
    reserve += fit.bytes;
  }
  if (check_copy && opts.read_ahead) check.from_copy(*src, *opts.read_ahead);  // else inline at the end
  opts.max_chunk_bytes = chunk_bytes_for_copy(req.max_memory, req.threads, written, plan->pieces, reserve);
  out.memory = memory_fit(req.max_memory, reserve, opts.read_ahead.get(), opts.write_pool.get());
  CKPT_RETURN_IF_ERROR(run_hf_export(written, *plan, req.out, opts));
  if (!out.quantization.is_null()) out.quantization["exactness"] = quant_report.snapshot().to_json();
  out.io = io_report(opts.io, opts.read_ahead.get(), opts.write_pool.get());
  out.out = req.out;
  out.tensors = plan->tensors.size();
  out.bytes = plan->total_bytes;
  out.config = plan->config.has_value();
  for (const auto& [name, path] : plan->copy_files) out.files.push_back(name);
  for (const auto& [name, content] : plan->side_files)
    if (!plan->copy_files.count(name)) out.files.push_back(name);
  out.skipped = plan->skipped;
  out.seconds = hf_job_seconds_since(t0);
  out.source_check = check.to_json();
  return out;
}

nlohmann::json FromHfOutcome::to_json() const {
  nlohmann::json j = {{"out", out},           {"layout", layout},   {"tensors", tensors}, {"bytes", bytes},
                      {"side_files", side_files}, {"skipped", skipped}, {"seconds", seconds}, {"memory", memory.to_json()},
                      {"io", io}};
  if (!quantization.is_null()) j["quantization"] = quantization;
  if (!source.is_null()) j["source"] = source;
  if (!profile.empty()) {
    j["profile"] = profile;
    j["exactness"] = exactness.to_json();
  }
  return j;
}

namespace {

// from-hf with a profile: the reshard job from the HF directory (canonical names) into the
// profile's view, in one pass (converters/profile/profile_view_job.h); the layout defaults to tp=pp=dp=1.
Result<FromHfOutcome> run_from_hf_profile_job(const FromHfRequest& req, std::chrono::steady_clock::time_point t0) {
  ReshardRequest rr;
  rr.src = req.src;
  rr.source_profile = req.source_profile;
  rr.dst = req.out;
  rr.layout = req.layout.given() ? req.layout : LayoutValues{1, 1, 1, -1, {}};
  rr.store = req.store;
  rr.threads = req.threads;
  rr.max_memory = req.max_memory;
  rr.profile = req.profile;
  if (req.dtype) rr.profile.dtype = req.dtype;  // the profile's model dtypes, asked for
  rr.progress = req.progress;
  rr.dist = req.dist;
  rr.no_verify = req.no_verify;
  CKPT_ASSIGN_OR_RETURN(auto r, run_reshard_job(rr));
  FromHfOutcome out;
  out.out = req.out;
  out.layout = r.layout.to_string();
  out.bytes = r.plan.bytes_written;
  out.tensors = r.plan.tensors.size();
  out.profile = r.profile;
  out.exactness = r.exactness;
  out.source = r.source;
  out.memory = r.memory;
  out.io = r.io;
  out.seconds = hf_job_seconds_since(t0);
  return out;
}

// The HF names come in from a HuggingFace directory or file, or a DCP directory of an HF
// model's state_dict; tokenizer files beside it are carried.
Result<std::string> hf_side_files_dir(const JobSource& s) {
  std::error_code ec;
  const bool file = std::filesystem::is_regular_file(s.path, ec);
  const bool paddle = s.kind && std::string_view(s.kind->name) == "paddlenlp";
  if (!file && !paddle && !(s.kind && s.kind->detect == &is_hf_dir) && !torch::is_dcp_dir(s.path))
    return Status::InvalidArgument("'" + s.path + "' is not a HuggingFace directory (no model.safetensors[.index.json]) "
                                   "nor a DCP directory (.metadata)");
  auto dir = file ? std::filesystem::path(s.path).parent_path() : std::filesystem::path(s.path);
  return dir.empty() ? std::string(".") : dir.string();
}

}  // namespace

Result<FromHfOutcome> run_from_hf_job(const FromHfRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  CKPT_RETURN_IF_ERROR(hf_job_check_threads(req.threads));
  if (req.profile.given()) return run_from_hf_profile_job(req, t0);
  HfImportOptions opts;
  opts.threads = req.threads;
  opts.progress = req.progress;
  opts.dtype = req.dtype;
  store::StoreOptions so = req.store;
  const JobSource located = JobSource::locate(req.src, req.source_profile);
  CKPT_ASSIGN_OR_RETURN(opts.side_files_dir, hf_side_files_dir(located));
  JobSourceCheck check;  // a DCP's CRC-32 (safetensors has no checksums), forked before SRC is opened
  check.start(located.dir, so.io, req.threads, req.no_verify || (req.dist && req.dist->rank() != 0), !req.dist);
  CKPT_ASSIGN_OR_RETURN(auto src, located.open());
  FromHfOutcome out;
  ExactnessTracker quant_report;
  CKPT_ASSIGN_OR_RETURN(out.quantization, quantized_export_source(src, req.keep_quantized, req.dtype, opts.keep_as_stored, &quant_report));
  opts.before_commit = check.before_commit(*src);
  out.source = source_detected_of(*src);
  auto plan = plan_hf_import(*src, opts);
  if (!plan.ok()) return plan.take_status().with_file(req.src);
  // Part of the budget goes to the store writer (HDF5, copies, compressed chunks), as in `ckpt reshard`.
  const uint64_t reserve = fit_store_writer(req.max_memory, req.threads, so, located.cold(so.io));
  opts.max_chunk_bytes = chunk_bytes_for_copy(req.max_memory, req.threads, *src, plan->pieces, reserve);
  out.memory = memory_fit(req.max_memory, reserve, so.read_ahead.get(), so.write_pool.get());
  out.layout = "tp=1 pp=1 dp=1";
  if (req.layout.given()) {
    CKPT_ASSIGN_OR_RETURN(auto layout, req.layout.make(plan->config.num_hidden_layers));
    out.layout = layout.to_string();
    StoreExecOptions eo;
    eo.exec.threads = req.threads;
    eo.exec.max_chunk_bytes = opts.max_chunk_bytes;
    eo.store = so;
    eo.exec.progress = opts.progress;
    eo.before_commit = opts.before_commit;
    CKPT_RETURN_IF_ERROR(run_hf_import_to_layout(*src, *plan, layout, req.out, eo, req.dist));
  } else {
    store::StoreWriter sink(req.out, so);
    CKPT_RETURN_IF_ERROR(run_hf_import(*src, sink, *plan, opts));
  }
  out.out = req.out;
  out.tensors = plan->tensors.size();
  out.bytes = plan->total_bytes;
  if (plan->metadata.contains(kHfFilesKey))
    for (const auto& [name, v] : plan->metadata[kHfFilesKey].items()) out.side_files.push_back(name);
  out.skipped = plan->skipped;
  out.seconds = hf_job_seconds_since(t0);
  out.io = store_io_report(so);
  if (!out.quantization.is_null()) out.quantization["exactness"] = quant_report.snapshot().to_json();
  return out;
}

}  // namespace ckpt

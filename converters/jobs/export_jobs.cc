#include "converters/jobs/export_jobs.h"

#include "converters/dcp/dcp_export.h"
#include "converters/jobs/hf_jobs.h"
#include "converters/jobs/reshard_job.h"
#include "converters/megatron/dist/megatron_dist_export.h"
#include "converters/megatron/megatron_export.h"
#include "converters/source/job_source.h"
#include "converters/source/source_check_job.h"

namespace ckpt {

namespace {

// An export's share of --max-memory beside its chunks and write pool: the process, the zip
// writers' layout, the source's readers (as to-hf's).
constexpr uint64_t kExportReserveBytes = uint64_t{24} << 20;

// `value` of `flag` within [lo, hi], else kInvalidArgument naming the flag (the CLI's own range
// checks refuse these before a job runs; python's ckpt.export_* come here).
Status export_flag_in_range(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return Status::Ok();
  return Status::InvalidArgument(std::string(flag) + " " + std::to_string(value) + ": expected " + std::to_string(lo) + ".." +
                                 std::to_string(hi));
}

}  // namespace

nlohmann::json ExportDcpOutcome::to_json() const {
  return {{"out", out},     {"tensors", tensors}, {"chunks", chunks},          {"bytes", bytes},
          {"files", files}, {"skipped", skipped}, {"source_check", source_check}, {"memory", memory.to_json()}, {"io", io}};
}

Result<ExportDcpOutcome> run_export_dcp_job(const ExportDcpRequest& req) {
  CKPT_RETURN_IF_ERROR(export_flag_in_range("--threads", req.threads, 1, 64));
  CKPT_RETURN_IF_ERROR(export_flag_in_range("--files", req.files, 1, 4096));
  DcpExportOptions opts;
  opts.threads = req.threads;
  opts.fsync = req.fsync;
  opts.files = req.files;
  opts.source_chunks = req.source_chunks;
  opts.progress = req.progress;
  opts.dtype = req.dtype;
  const JobSource located = JobSource::locate(req.src, req.source_profile);
  JobSourceCheck check;  // forked before this process opens SRC
  check.start(located.dir, IoMode::kBuffered, opts.threads, req.no_verify);
  CKPT_ASSIGN_OR_RETURN(auto src, located.open());
  opts.before_commit = check.before_commit(*src);
  auto plan = plan_dcp_export(*src, req.src, opts);
  if (!plan.ok()) return plan.take_status().with_file(req.src);
  // The files' direct writes staged in a write pool, several large requests in flight (to-hf's
  // fit_copy_io, without its read-ahead: SRC is read through the page cache here).
  opts.io = req.io;
  const uint64_t decode = source_decode_reserve(*src, req.threads);
  CopyIoFit fit = fit_copy_io(req.max_memory, kExportReserveBytes + decode, 0, req.threads, req.io, /*direct_reads=*/false);
  opts.write_pool = std::move(fit.write_pool);
  const uint64_t reserve = kExportReserveBytes + decode + fit.bytes;
  opts.max_chunk_bytes = chunk_bytes_for_copy(req.max_memory, req.threads, *src, plan->pieces, reserve);
  ExportDcpOutcome out;
  out.memory = memory_fit(req.max_memory, reserve, nullptr, opts.write_pool.get());
  CKPT_RETURN_IF_ERROR(run_dcp_export(*src, *plan, req.out, opts));
  out.io = io_report(req.io, nullptr, opts.write_pool.get());
  out.out = req.out;
  out.tensors = plan->tensors.size();
  out.chunks = plan->pieces.size();
  out.bytes = plan->total_bytes;
  out.files = req.files;
  out.skipped = plan->skipped;
  out.source_check = check.to_json();
  return out;
}

Result<MegatronExportFormat> megatron_format_flag(const std::string& value) {
  for (auto f : {MegatronExportFormat::kSafetensors, MegatronExportFormat::kTorch, MegatronExportFormat::kTorchDist})
    if (value == megatron_format_name(f)) return f;
  return Status::InvalidArgument("--format '" + value + "': expected safetensors, torch or torch_dist");
}

const char* megatron_format_name(MegatronExportFormat f) {
  switch (f) {
    case MegatronExportFormat::kSafetensors: return "safetensors";
    case MegatronExportFormat::kTorch: return "torch";
    case MegatronExportFormat::kTorchDist: return "torch_dist";
  }
  return "?";
}

nlohmann::json ExportMegatronOutcome::to_json() const {
  return {{"out", out},       {"format", megatron_format_name(format)},
          {"tp", tp},         {"pp", pp},
          {"vpp", vpp},       {"iteration", iteration},
          {"dist_opt", dist_opt}, {"dp", dp},
          {"source_check", source_check}, {"io", io}};
}

Result<ExportMegatronOutcome> run_export_megatron_job(const ExportMegatronRequest& req) {
  CKPT_RETURN_IF_ERROR(export_flag_in_range("--tp", req.tp, 1, 1 << 16));
  CKPT_RETURN_IF_ERROR(export_flag_in_range("--pp", req.pp, 1, 1 << 16));
  CKPT_RETURN_IF_ERROR(export_flag_in_range("--vpp", req.vpp, 1, 1 << 16));
  CKPT_RETURN_IF_ERROR(export_flag_in_range("--vocab-divisor", req.vocab_divisor, 1, int64_t{1} << 20));
  CKPT_RETURN_IF_ERROR(export_flag_in_range("--iteration", req.iteration, 0, 9999999));
  MegatronExportOptions o;
  o.tp = req.tp;
  o.pp = req.pp;
  CKPT_RETURN_IF_ERROR(export_flag_in_range("--ep", req.ep, 1, 1 << 16));
  CKPT_RETURN_IF_ERROR(export_flag_in_range("--etp", req.etp, 0, 1 << 16));
  o.ep = req.ep;
  o.etp = req.etp;
  o.layers_per_stage = req.pp_layers;
  o.vpp = req.vpp;
  o.vocab_divisor = req.vocab_divisor;
  o.format = req.format == MegatronExportFormat::kTorch ? MegatronFileFormat::kTorch : MegatronFileFormat::kSafetensors;
  o.iteration = req.iteration;
  o.norms = req.local_norms ? MegatronNormNames::kLocal : MegatronNormNames::kTransformerEngine;
  o.progress = req.progress;
  o.dtype = req.dtype;
  o.dist_opt = MegatronDistOptOptions{req.dist_opt, req.dp, req.ddp_bucket_size, req.dist_opt_sharding};
  if (!req.megatron_version.empty()) o.megatron_version = req.megatron_version;
  if (!req.megatron_version.empty() && req.format != MegatronExportFormat::kTorchDist)
    return Status::InvalidArgument("--megatron-version applies to --format torch_dist (the legacy and safetensors "
                                   "layouts do not depend on it)");
  if (!req.dist_opt && (req.dp != 1 || req.ddp_bucket_size || req.dist_opt_sharding != "dp_reshardable"))
    return Status::InvalidArgument("--dp, --ddp-bucket-size and --dist-opt-sharding lay out the distributed "
                                   "optimizer: they need --dist-opt");
  if (req.dist_opt) {
    CKPT_RETURN_IF_ERROR(export_flag_in_range("--dp", req.dp, 1, int64_t{1} << 20));
    if (req.ddp_bucket_size) CKPT_RETURN_IF_ERROR(export_flag_in_range("--ddp-bucket-size", *req.ddp_bucket_size, 1, int64_t{1} << 40));
  }
  const JobSource located = JobSource::locate(req.src, req.source_profile);
  JobSourceCheck check;  // forked before this process opens SRC
  check.start(located.dir, IoMode::kBuffered, 2, req.no_verify);
  CKPT_ASSIGN_OR_RETURN(auto src, located.open());
  o.before_commit = check.before_commit(*src);
  const bool dist = req.format == MegatronExportFormat::kTorchDist;
  // The torch / torch_dist files' direct writes in a write pool, several large requests in flight
  // (--io auto's per-run choice), within the default budget beside the engine's chunks.
  const std::shared_ptr<WritePool> pool =
      req.format == MegatronExportFormat::kSafetensors
          ? nullptr
          : fit_copy_io(kDefaultMaxMemory, kExportReserveBytes + o.chunk_bytes * 2, 0, 2, IoMode::kAuto, false).write_pool;
  o.write_pool = pool.get();
  CKPT_RETURN_IF_ERROR(dist ? export_megatron_dist(*src, req.dst, o) : export_megatron(*src, req.dst, o));
  ExportMegatronOutcome out;
  out.out = req.dst;
  out.format = req.format;
  out.tp = req.tp;
  out.pp = req.pp;
  out.vpp = req.vpp;
  out.iteration = req.iteration;
  out.dist_opt = req.dist_opt;
  out.dp = req.dp;
  out.io = io_report(IoMode::kAuto, nullptr, pool.get());
  out.source_check = check.to_json();
  return out;
}

}  // namespace ckpt

#include "converters/jobs/export_deepspeed_job.h"

#include "converters/deepspeed/ds_universal_export.h"
#include "converters/jobs/reshard_job.h"
#include "converters/source/job_source.h"
#include "converters/source/source_check_job.h"

namespace ckpt {

namespace {

constexpr uint64_t kReserveBytes = uint64_t{24} << 20;  // the process, the writers, the source's readers

}  // namespace

nlohmann::json ExportDeepSpeedOutcome::to_json() const {
  return {{"out", out},   {"tag", tag},     {"params", params},         {"files", files},
          {"bytes", bytes}, {"step", step}, {"fresh_adam", fresh_adam}, {"source_check", source_check},
          {"memory", memory.to_json()}};
}

Result<ExportDeepSpeedOutcome> run_export_deepspeed_job(const ExportDeepSpeedRequest& req) {
  if (req.threads < 1 || req.threads > 64)
    return Status::InvalidArgument("--threads " + std::to_string(req.threads) + ": expected 1..64");
  if (req.step && (*req.step < 0 || *req.step > (int64_t{1} << 62)))
    return Status::InvalidArgument("--step " + std::to_string(*req.step) + ": expected 0..2^62");
  DsUniversalOptions o;
  o.weights_only = req.weights_only;
  o.int_step = req.int_step;
  o.step = req.step;
  o.threads = req.threads;
  o.fsync = req.fsync;
  o.io = req.io;
  o.progress = req.progress;
  const JobSource located = JobSource::locate(req.src);
  JobSourceCheck check;  // forked before this process opens SRC
  check.start(located.dir, IoMode::kBuffered, req.threads, req.no_verify);
  CKPT_ASSIGN_OR_RETURN(auto src, located.open());
  o.before_commit = check.before_commit(*src);
  auto plan = plan_ds_universal(*src, o);
  if (!plan.ok()) return plan.take_status().with_file(req.src);
  const uint64_t reserve = kReserveBytes + source_decode_reserve(*src, req.threads);
  o.max_chunk_bytes = chunk_bytes_for_copy(req.max_memory, req.threads, *src, plan->copy.pieces, reserve);
  ExportDeepSpeedOutcome out;
  out.memory = memory_fit(req.max_memory, reserve);
  CKPT_RETURN_IF_ERROR(run_ds_universal(*src, *plan, req.out, o));
  out.out = req.out;
  out.tag = plan->tag;
  out.params = plan->params.size();
  out.files = plan->params.size() * 4 + 4;
  out.bytes = plan->copy.total_bytes;
  out.step = plan->step;
  out.fresh_adam = plan->fresh_adam;
  out.source_check = check.to_json();
  return out;
}

}  // namespace ckpt

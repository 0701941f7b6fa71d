#include "converters/jobs/diff_job.h"

#include "converters/source/open_checkpoint.h"
#include "converters/source/source_check_job.h"

namespace ckpt {

nlohmann::json DiffOutcome::to_json() const {
  nlohmann::json j = report.to_json();
  j["a"] = a;
  j["b"] = b;
  j["source_check"] = source_check;
  return j;
}

Result<DiffOutcome> run_diff_job(const DiffRequest& req) {
  JobSourceCheck check_a, check_b;  // forked before this process opens A and B
  check_a.start(req.a, IoMode::kBuffered, 1, req.no_verify);
  check_b.start(req.b, IoMode::kBuffered, 1, req.no_verify);
  auto sa = req.a_profile.empty() ? open_checkpoint(req.a) : open_checkpoint_in_profile(req.a, req.a_profile);
  if (!sa.ok()) return sa.take_status().with_context("opening A");
  auto sb = req.b_profile.empty() ? open_checkpoint(req.b) : open_checkpoint_in_profile(req.b, req.b_profile);
  if (!sb.ok()) return sb.take_status().with_context("opening B");
  auto rep = diff_sources(**sa, **sb, req.options);
  // The checks' verdicts come first: a comparison of corrupt bytes says nothing.
  Status ca = check_a.finish(**sa);
  if (!ca.ok()) return std::move(ca).with_context("checking A '" + req.a + "'");
  Status cb = check_b.finish(**sb);
  if (!cb.ok()) return std::move(cb).with_context("checking B '" + req.b + "'");
  if (!rep.ok()) return rep.take_status();
  DiffOutcome out;
  out.report = std::move(*rep);
  out.a = req.a;
  out.b = req.b;
  out.source_check = {{"a", check_a.to_json()}, {"b", check_b.to_json()}};
  return out;
}

}  // namespace ckpt

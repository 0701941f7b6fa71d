// ReshardOutcome::to_json: what `ckpt reshard --json` / `ckpt convert --json` print and python's
// ckpt.reshard / ckpt.convert return.
#include "converters/jobs/reshard_job.h"

namespace ckpt {

nlohmann::json ReshardOutcome::to_json(const std::string& dst, bool dry_run) const {
  nlohmann::json j = plan.to_json();
  j["plan_seconds"] = plan_seconds;
  j["memory"] = memory.to_json();
  if (!source.is_null()) j["source"] = source;
  if (dry_run) return j;
  j["dst"] = dst;
  j["seconds"] = seconds;
  j["processes"] = processes;
  j["source_check"] = source_check;
  j["io"] = io;
  if (!profile.empty()) {
    j["profile"] = profile;
    j["from_profile"] = from_profile;
    j["exactness"] = exactness.to_json();
  } else if (!exactness.empty()) {  // --requantize (converters/quant/requantize.h)
    j["exactness"] = exactness.to_json();
  }
  return j;
}

}  // namespace ckpt

// One `ckpt diff A B` below the CLI (cli/cmd_diff.cc, python ckpt.diff): both checkpoints opened by
// open_checkpoint, each checked by its format's own checks while they are compared (a child
// process each, converters/source/source_check_job.h), then compared tensor by tensor in global view
// (reshard/diff.h). A corrupt side is an error naming it, never a verdict of "equal" or
// "different" about corrupt bytes; `no_verify` skips the checks.
// Thread safety: one job at a time per process (it forks).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "reshard/diff.h"

namespace ckpt {

struct DiffRequest {
  std::string a, b;
  DiffOptions options;
  bool no_verify = false;
  std::string a_profile = {}, b_profile = {};  // --source-profile / --b-source-profile: A / B stored in this profile
};

struct DiffOutcome {
  DiffReport report;
  nlohmann::json source_check;  // {"a": JobSourceCheck::to_json(), "b": ...}
  nlohmann::json to_json() const;  // the report's JSON with a, b and source_check
  std::string a, b;
};

Result<DiffOutcome> run_diff_job(const DiffRequest& req);

}  // namespace ckpt

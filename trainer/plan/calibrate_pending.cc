// TEMPORARY (issue 16, branch h-planner): a placeholder so `ckpt plan --calibrate` links before the
// real trainer::calibrate_device (branch h-emulate) lands. The lead DELETES THIS FILE at the merge.
#include "trainer/plan/calibrate.h"

namespace ckpt::trainer {

nlohmann::json Calibration::to_json() const { return nlohmann::json::object(); }

Result<Calibration> calibrate_device(const CalibrateOptions&) {
  return Status::Error("Unsupported", "ckpt plan --calibrate is not built in this binary (trainer::calibrate_device "
                                      "lands with issue 16's emulation branch)");
}

}  // namespace ckpt::trainer

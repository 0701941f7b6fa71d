#include "reshard/layout_flagscale.h"

namespace ckpt {

Result<Layout> layout_from_flagscale(const nlohmann::json&) {
  return Status::Unsupported("FlagScale-style layout files are not read yet");
}

}  // namespace ckpt

// ckpt.open(path) and the Checkpoint object (to be written: issue 17).
#include "python/bindings.h"

namespace ckpt::py {

void bind_checkpoint(nanobind::module_&) {}

}  // namespace ckpt::py

// The commands as Python functions with structured results (to be written: issue 17).
#include "python/bindings.h"

namespace ckpt::py {

void bind_commands(nanobind::module_&) {}

}  // namespace ckpt::py

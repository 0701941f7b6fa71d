// The parts of the `ckpt._ckpt` extension, each bound by its own file:
//   py_errors.cc        exception classes (py_errors.h)
//   checkpoint_bind.cc  ckpt.open(), the Checkpoint object: tensors, read, state_dict
//   commands_bind.cc    the commands as functions: verify, diff, reshard, to_hf, from_hf, convert, plan
#pragma once

#include <nanobind/nanobind.h>

namespace ckpt::py {

void bind_checkpoint(nanobind::module_& m);
void bind_commands(nanobind::module_& m);

}  // namespace ckpt::py

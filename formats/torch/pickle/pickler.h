// The pickler: writes a PyObj tree (formats/torch/pickle/py_object.h) as a protocol-2 pickle that
// Python's pickle and torch.load(weights_only=True) read back (records as GLOBAL + REDUCE/NEWOBJ +
// BUILD; kStorage as BINPERSID of torch's ('storage', cls, key, location, numel) tuple; kTensor as
// torch._utils._rebuild_tensor_v2 / _rebuild_parameter). Shared objects are memoized.
// Pure function; thread safe.
#pragma once

#include <string>

#include "formats/base/status.h"
#include "formats/torch/pickle/py_object.h"

namespace ckpt::torch {

Result<std::string> pickle_dumps(const PyObj* root);

}  // namespace ckpt::torch

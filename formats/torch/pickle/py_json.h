// A JSON value as a Python object tree for the pickler (formats/torch/pickle/py_object.h): what
// json.loads would give. Objects become dicts (in nlohmann::json's key order, sorted), arrays
// lists, null None, integers int, other numbers float, strings str, booleans bool. An unsigned
// integer above INT64_MAX (a PyObj int holds 64 bits) becomes a float; binary or discarded None.
#pragma once

#include <nlohmann/json.hpp>

#include "formats/torch/pickle/py_object.h"

namespace ckpt::torch {

const PyObj* json_to_pyobj(PyArena& a, const nlohmann::json& j);

}  // namespace ckpt::torch

// nlohmann::json -> Python objects (dict, list, str, int, float, bool, None), for the structured
// results of the commands (the same fields as the CLI's --json) and metadata. Needs the GIL.
#pragma once

#include <nanobind/nanobind.h>

#include <nlohmann/json.hpp>

namespace ckpt::py {

nanobind::object json_to_py(const nlohmann::json& j);

}  // namespace ckpt::py

// The general (pipelines) form of a Layout: validation, JSON and text, used by reshard/layout/layout.cc
// (the accessors for both forms are defined in layout_general.cc too). Pure functions; thread safe.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "reshard/layout/layout.h"

namespace ckpt {

Status validate_general(const Layout& l);
nlohmann::json general_to_json(const Layout& l);
// {"pipelines": [...], "zero", "vocab_divisor", "profile", "num_layers", "rank_order"}: errors BadLayout.
Result<Layout> general_from_json(const nlohmann::json& j);
std::string general_to_string(const Layout& l);

}  // namespace ckpt

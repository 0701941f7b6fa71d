// The general (pipelines) form of a Layout: validation, JSON and text, used by reshard/layout/layout.cc
// (the accessors for both forms are defined in layout_general.cc too). Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "reshard/layout/layout.h"

namespace ckpt {

Status validate_general(const Layout& l);
// The experts of a stage view (tp x dp ranks) regrouped as etp x ep x edp: BadLayout "<ctx>ep=E x etp=X does not
// divide the N ranks ..." unless ep * etp divides tp * dp. The symmetric form's rule, and each stage's of the general form.
Status check_expert_group(int64_t tp, int64_t dp, int64_t ep, int64_t etp, const std::string& ctx);
nlohmann::json general_to_json(const Layout& l);
// {"pipelines": [...], "zero", "vocab_divisor", "profile", "num_layers", "rank_order"}: errors BadLayout.
Result<Layout> general_from_json(const nlohmann::json& j);
std::string general_to_string(const Layout& l);

}  // namespace ckpt

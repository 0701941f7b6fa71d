// FlagScale-style heterogeneous configs as layout files: hetero_process_meshes (flattened
// [tp, cp, dp, pp] per mesh), hetero_device_types (one per mesh) and hetero_pipeline_layer_split
// (layers per pipeline stage), mapped onto the general Layout (reshard/layout/layout.h): every mesh's
// stages get its tp and device type, its dp is the number of pipelines (all meshes must agree).
// Pure function; thread safe.
#pragma once

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "reshard/layout/layout.h"

namespace ckpt {

// Errors: BadLayout naming the key and what was expected.
Result<Layout> layout_from_flagscale(const nlohmann::json& j);

}  // namespace ckpt

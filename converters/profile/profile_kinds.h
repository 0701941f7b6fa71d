// The tensor kinds a profile names (converters/profile/profile.h) and which of them a packing uses.
// Shared by the parser (profile_json.cc) and profile_tensors (profile_tensors.cc).
// Constant tables and pure functions; thread safe.
#pragma once

#include <string>
#include <vector>

#include "converters/profile/profile.h"

namespace ckpt::profile_kinds {

struct KindInfo {
  const char* kind;
  bool per_layer;  // the pattern holds "{i}"
  bool bias;       // optional (only models with attention_bias / mlp_bias use it)
};

// Every kind, in the order the docs list them.
const std::vector<KindInfo>& all_kinds();
const KindInfo* find_kind(const std::string& kind);

// The kinds the profile's packings use: the weight kinds (always needed) and the bias kinds
// (needed only by models with biases). A kind outside both lists contradicts the packings.
std::vector<std::string> weight_kinds(QkvPacking qkv, MlpPacking mlp);
std::vector<std::string> attention_bias_kinds(QkvPacking qkv);
std::vector<std::string> mlp_bias_kinds(MlpPacking mlp);

}  // namespace ckpt::profile_kinds

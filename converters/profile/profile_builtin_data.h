// The built-in profiles' JSON text: profiles/*.json, turned into a generated .cc by CMake
// (CMakeLists.txt, "Built-in vendor profiles"). Read through builtin_profile (converters/profile/profile.h).
// Constant data; thread safe.
#pragma once

#include <cstddef>

namespace ckpt::profile_builtin_detail {

struct BuiltinProfileText {
  const char* name;  // the file name without .json (= the profile's "name")
  const char* json;  // the file's text
};

extern const BuiltinProfileText kBuiltinProfiles[];
extern const size_t kNumBuiltinProfiles;

}  // namespace ckpt::profile_builtin_detail

// UTF-8 validation (RFC 3629): the rule of safetensors header strings and pickle str objects.
// Pure function; thread safe.
#pragma once

#include <string_view>

namespace ckpt {

// True when `s` is well-formed UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool is_valid_utf8(std::string_view s);

}  // namespace ckpt

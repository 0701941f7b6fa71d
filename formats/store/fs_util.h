// Old home of the file-system helpers, now formats/fs_util.h (namespace ckpt). Kept only for
// converters/megatron_layout.cc, which another change rewrites; remove it once that lands.
#pragma once

#include "formats/fs_util.h"

namespace ckpt::store {

using ckpt::read_small_file;

}  // namespace ckpt::store

// libFuzzer target: the whole safetensors header parser (length prefix, UTF-8, JSON grammar,
// offsets, sizes) on arbitrary bytes. Must never crash, hang or allocate without bound.
#include <cstddef>
#include <cstdint>

#include "formats/safetensors/st_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)ckpt::safetensors::parse_file_bytes(data, size);
  return 0;
}

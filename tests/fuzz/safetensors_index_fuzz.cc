// libFuzzer target: the model.safetensors.index.json parser on arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "formats/safetensors/st_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)ckpt::safetensors::parse_index(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

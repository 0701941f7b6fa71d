// libFuzzer target: the .pdparams parser (formats/paddle/pdparams.h: the restricted unpickler with
// array data kept by reference, then every value checked to be a plain numpy array) on arbitrary
// bytes. Must never crash, hang, run anything or allocate without bound.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "formats/paddle/pdparams.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)ckpt::paddle::parse_pdparams(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

// libFuzzer target: the native store's manifest.json parser (bounded JSON reader, then the
// manifest's type checks and validate_manifest's geometry) on arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "formats/store/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (auto m = ckpt::store::parse_manifest(std::string(reinterpret_cast<const char*>(data), size)); m.ok()) (void)validate_manifest(*m);
  return 0;
}

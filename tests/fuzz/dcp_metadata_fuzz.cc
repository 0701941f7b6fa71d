// libFuzzer target: the DCP .metadata parser (restricted unpickler, then the Metadata records and
// every rule of formats/torch/dcp/dcp.h) on arbitrary bytes. Must never crash, hang or allocate
// without bound, and never execute anything.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "formats/torch/dcp/dcp.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)ckpt::torch::parse_dcp_metadata(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

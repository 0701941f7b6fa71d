// libFuzzer target: the restricted unpickler (opcodes, memo, marks, allow-list, tensor rebuilds,
// bounds) on arbitrary bytes. Must never crash, hang, run anything or allocate without bound.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "formats/torch/pickle/unpickler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)ckpt::torch::unpickle(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

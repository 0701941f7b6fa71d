// libFuzzer target: profile files (converters/profile/profile.h) on arbitrary bytes; a parsed profile's
// JSON round trip and its tensors for a small model are exercised too.
#include <cstddef>
#include <cstdint>
#include <string>

#include "converters/profile/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size), nullptr, false);
  if (j.is_discarded()) return 0;
  if (auto p = ckpt::profile_from_json(j, "fuzz"); p.ok()) {
    (void)ckpt::profile_from_json(p->to_json(), "fuzz round trip");
    ckpt::LlamaConfig c;
    c.vocab_size = 10, c.hidden_size = 4, c.intermediate_size = 4, c.num_hidden_layers = 1;
    c.num_attention_heads = 2, c.num_key_value_heads = 2, c.head_dim = 2;
    (void)ckpt::profile_tensors(*p, c, {}, 2);
  }
  return 0;
}

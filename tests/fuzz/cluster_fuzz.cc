// libFuzzer target: cluster files (reshard/dist/cluster.h: device types, ranks or nodes, links) on
// arbitrary bytes; a parsed cluster's links and JSON round trip are exercised too.
#include <cstddef>
#include <cstdint>
#include <string>

#include "reshard/dist/cluster.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size), nullptr, false);
  if (j.is_discarded()) return 0;
  if (auto c = ckpt::Cluster::from_json(j); c.ok() && c->world_size() > 0)
    (void)c->slowest_link({0, c->world_size() - 1}), (void)ckpt::Cluster::from_json(c->to_json());
  return 0;
}

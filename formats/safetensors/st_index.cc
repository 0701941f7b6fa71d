#include "formats/safetensors/st_index.h"

#include <set>

#include "formats/base/checked.h"

namespace ckpt::safetensors {

namespace {
using json = nlohmann::json;
Status bad(const char* code, const std::string& msg) { return Status::Error(code, "safetensors index: " + msg); }

Result<ShardIndex> index_from_json(const json& j) {
  if (!j.is_object()) return bad("IndexInvalid", std::string("expected a JSON object, got ") + j.type_name());
  ShardIndex idx;
  if (j.contains("metadata")) {
    const auto& m = j["metadata"];
    if (m.is_null()) {
    } else if (!m.is_object()) {
      return bad("IndexInvalid", std::string("\"metadata\" is ") + m.type_name() + ", expected an object");
    } else {
      if (m.contains("total_size") && !m["total_size"].is_number_unsigned() && !m["total_size"].is_null())
        return bad("IndexInvalid", "metadata.total_size is " + m["total_size"].dump().substr(0, 40) + ", expected a non-negative integer");
      idx.metadata = m;
    }
  }
  if (!j.contains("weight_map")) return bad("IndexInvalid", "missing \"weight_map\"");
  const auto& wm = j["weight_map"];
  if (!wm.is_object()) return bad("IndexInvalid", std::string("\"weight_map\" is ") + wm.type_name() + ", expected an object");
  std::set<std::string> files;
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    if (it.key().empty()) return bad("IndexInvalid", "weight_map has an empty tensor name");
    if (!it.value().is_string())
      return bad("IndexInvalid", "weight_map['" + it.key() + "'] is " + it.value().type_name() + ", expected a file name").with_tensor(it.key());
    std::string f = it.value().get<std::string>();
    bool ok = !f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos && f.find('\\') == std::string::npos &&
              f.find('\0') == std::string::npos && f.size() > 12 && f.compare(f.size() - 12, 12, ".safetensors") == 0 &&
              !(f.size() >= 2 && f[1] == ':');
    if (!ok)
      return bad("IndexBadFileName", "weight_map['" + it.key() + "'] = \"" + f.substr(0, 200) +
                                         "\": expected a plain file name ending in .safetensors in the index's directory "
                                         "(no directory part, root or '..')")
          .with_tensor(it.key());
    idx.weight_map[it.key()] = f;
    files.insert(f);
  }
  idx.files.assign(files.begin(), files.end());
  return idx;
}

}  // namespace

Result<ShardIndex> parse_index(std::string_view text) {
  CKPT_ASSIGN_OR_RETURN(json j, parse_json(text, kIndexJsonLimits, "safetensors index"));
  return index_from_json(j);
}

Result<ShardIndex> read_index(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(json j, read_json_file(path, kIndexJsonLimits, "safetensors index"));
  auto r = index_from_json(j);
  if (!r.ok()) return r.take_status().with_file(path);
  return r;
}

std::string index_to_json(uint64_t total_size, const std::map<std::string, std::string>& weight_map) {
  json j;
  j["metadata"] = {{"total_size", total_size}};
  j["weight_map"] = json::object();
  for (const auto& [k, v] : weight_map) j["weight_map"][k] = v;
  return j.dump(2) + "\n";
}

std::string hf_shard_file_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

std::vector<size_t> assign_shards(const std::vector<uint64_t>& sizes, uint64_t max_shard_size, size_t* num_shards) {
  // HF's splitter: a tensor above the limit gets a shard of its own (appended to the list at that
  // point); otherwise it closes the current shard when it would tip it over the limit.
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t cur = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > max_shard_size) {
      shards.push_back({i});
      continue;
    }
    if (!current.empty() && cur + sizes[i] > max_shard_size) {
      shards.push_back(std::move(current));
      current.clear();
      cur = 0;
    }
    current.push_back(i);
    cur += sizes[i];
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  std::vector<size_t> out(sizes.size());
  for (size_t s = 0; s < shards.size(); ++s)
    for (size_t i : shards[s]) out[i] = s;
  if (num_shards) *num_shards = shards.size();
  return out;
}

}  // namespace ckpt::safetensors

#include "formats/torch/pickle/py_json.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::torch {

const PyObj* json_to_pyobj(PyArena& a, const nlohmann::json& j) {
  using T = nlohmann::json::value_t;
  switch (j.type()) {
    case T::boolean:
      return a.boolean(j.get<bool>());
    case T::number_integer:
      return a.integer(j.get<int64_t>());
    case T::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return a.real(static_cast<double>(u));
      return a.integer(static_cast<int64_t>(u));
    }
    case T::number_float:
      return a.real(j.get<double>());
    case T::string:
      return a.str(j.get<std::string>());
    case T::array: {
      std::vector<const PyObj*> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(json_to_pyobj(a, e));
      return a.list(std::move(items));
    }
    case T::object: {
      std::vector<std::pair<const PyObj*, const PyObj*>> entries;
      entries.reserve(j.size());
      for (const auto& [k, v] : j.items()) entries.emplace_back(a.str(k), json_to_pyobj(a, v));
      return a.dict(std::move(entries));
    }
    default:  // null, binary, discarded
      return a.none();
  }
}

}  // namespace ckpt::torch

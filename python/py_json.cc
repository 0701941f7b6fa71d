#include "python/py_json.h"

#include <string>

namespace ckpt::py {

namespace nb = nanobind;

nb::object json_to_py(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return nb::none();
    case nlohmann::json::value_t::boolean:
      return nb::bool_(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return nb::int_(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return nb::int_(j.get<uint64_t>());
    case nlohmann::json::value_t::number_float:
      return nb::float_(j.get<double>());
    case nlohmann::json::value_t::string: {
      const auto& s = j.get_ref<const std::string&>();
      return nb::str(s.data(), s.size());
    }
    case nlohmann::json::value_t::array: {
      nb::list l;
      for (const auto& e : j) l.append(json_to_py(e));
      return l;
    }
    case nlohmann::json::value_t::object: {
      nb::dict d;
      for (const auto& [k, v] : j.items()) d[nb::str(k.data(), k.size())] = json_to_py(v);
      return d;
    }
    default:  // binary, discarded: not produced by ckpt
      return nb::none();
  }
}

}  // namespace ckpt::py

#include "formats/base/int_list.h"

#include <cctype>

#include "formats/base/checked.h"

namespace ckpt {

Result<std::vector<int>> parse_int_list(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    if (tok.empty() || tok.size() > 9)
      return Status::InvalidArgument(flag + ": '" + s + "' is not a comma-separated list of positive integers");
    int v = 0;
    for (char c : tok) {
      if (!std::isdigit(static_cast<unsigned char>(c)))
        return Status::InvalidArgument(flag + ": '" + s + "' is not a comma-separated list of positive integers");
      v = v * 10 + (c - '0');
    }
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

}  // namespace ckpt

#include "reshard/flags.h"

#include <cctype>

#include "formats/checked.h"

namespace ckpt {

Result<uint64_t> parse_byte_size(const std::string& s, const std::string& flag) {
  auto bad = [&] {
    return Status::InvalidArgument(flag + ": '" + s + "' is not a size (examples: 1048576, 64K, 256M, 4G)");
  };
  size_t i = 0;
  uint64_t v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    auto m = checked_mul(v, uint64_t{10});
    if (!m) return bad();
    auto a = checked_add(*m, static_cast<uint64_t>(s[i] - '0'));
    if (!a) return bad();
    v = *a;
    ++i;
  }
  if (i == 0) return bad();
  std::string suf;
  for (; i < s.size(); ++i) suf += static_cast<char>(std::toupper(static_cast<unsigned char>(s[i])));
  if (suf.size() > 1 && suf.back() == 'B') suf.pop_back();
  if (suf.size() > 1 && suf.back() == 'I') suf.pop_back();
  uint64_t mult = 1;
  if (suf.empty() || suf == "B") mult = 1;
  else if (suf == "K") mult = 1ull << 10;
  else if (suf == "M") mult = 1ull << 20;
  else if (suf == "G") mult = 1ull << 30;
  else if (suf == "T") mult = 1ull << 40;
  else return bad();
  auto r = checked_mul(v, mult);
  if (!r) return bad();
  return *r;
}

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

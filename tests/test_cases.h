// How many random cases a property test runs: `normal` in the default build, about a quarter
// (at least `min_sanitized`) under AddressSanitizer, where each case costs several times more and
// the same properties are checked for memory errors rather than for coverage; CKPT_LONG=1 runs
// `long_run` cases (nightly / by hand).
#pragma once

#include <algorithm>
#include <cstdlib>

namespace ckpt::testing {

inline int property_cases(int normal, int long_run, int min_sanitized = 4) {
  if (std::getenv("CKPT_LONG")) return long_run;
#if defined(__SANITIZE_ADDRESS__)
  return std::max(min_sanitized, normal / 4);
#else
  (void)min_sanitized;
  return normal;
#endif
}

}  // namespace ckpt::testing

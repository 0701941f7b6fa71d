// How many random cases a property test runs: `normal` in the default build, an eighth (at least
// `min_sanitized`) under AddressSanitizer (scripts/test.sh builds it at -O0), where each case costs ten times more and
// the same properties are checked for memory errors rather than for coverage; CKPT_LONG=1 runs
// `long_run` cases (nightly / by hand).
#pragma once

#include <algorithm>
#include <cstdlib>

// CKPT_TEST_SANITIZED: built with AddressSanitizer, by g++ (__SANITIZE_ADDRESS__) or clang
// (__has_feature; scripts/test.sh's sanitized build is clang's).
#if defined(__SANITIZE_ADDRESS__)
#define CKPT_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CKPT_TEST_SANITIZED 1
#endif
#endif

namespace ckpt::testing {

inline int property_cases(int normal, int long_run, int min_sanitized = 4) {
  if (std::getenv("CKPT_LONG")) return long_run;
#if defined(CKPT_TEST_SANITIZED)
  return std::max(min_sanitized, normal / 8);
#else
  (void)min_sanitized;
  return normal;
#endif
}

}  // namespace ckpt::testing

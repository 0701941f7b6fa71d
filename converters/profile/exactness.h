// The exactness report of a profile conversion (docs/PROFILES.md "Transforms and the
// exactness report"): for every lossy step, per tensor, how many elements went through it, how
// many changed and by how much at most.
//  - Steps: "cast F32->F16" (a narrowing cast; widening casts and same-dtype copies are exact and
//    not reported), "dropped padding rows" (padding rows of the source that are not all zero).
//  - A narrowing cast rounds to nearest even exactly as cast_elements (formats/dtype/dtype.h), then
//    compares each result with its input: changed = the values differ (NaN stays NaN: unchanged),
//    max_abs = max |out - in|, max_rel = max |out - in| / |in| over inputs != 0 (computed in
//    double; +-Inf inputs stay +-Inf and count as unchanged). clamped = finite inputs above the
//    target's max finite that --saturate clamped to +-max (their error is in max_abs/max_rel).
//  - Without saturate such an input fails the cast (CastOverflow naming the tensor and the
//    count); a cast that would produce NaN from a non-NaN input fails (CastNaN).
// Reports merge (sums and maxima), so the processes of an mpirun conversion reduce theirs.
// ExactnessReport is a value; ExactnessTracker is a thread-safe accumulator.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/dtype/dtype.h"

namespace ckpt {

struct ExactnessEntry {
  std::string tensor;     // canonical (HF) name
  std::string stored_as;  // the tensor of the target profile holding it ("" = same name)
  std::string step;       // "cast F32->F16", "dropped padding rows"
  uint64_t elements = 0, changed = 0, clamped = 0;
  double max_abs = 0, max_rel = 0;

  void merge(const ExactnessEntry& o);  // sums and maxima (same tensor and step)
  nlohmann::json to_json() const;
};

class ExactnessReport {
 public:
  // Adds `e` to the entry of the same (tensor, step), or as a new entry.
  void add(const ExactnessEntry& e);
  void merge(const ExactnessReport& o);
  // Entries sorted by (tensor, step).
  std::vector<ExactnessEntry> entries() const;
  bool empty() const { return entries_.empty(); }
  // True when no entry changed or clamped anything.
  bool exact() const;

  // {"exact": bool, "steps": [{tensor, stored_as, step, elements, changed, clamped, max_abs,
  // max_rel}, ...]}
  nlohmann::json to_json() const;
  // Errors BadExactnessReport naming `origin` (a process's report under mpirun, a manifest).
  static Result<ExactnessReport> from_json(const nlohmann::json& j, const std::string& origin);
  // A table for people: one line per entry with changes, then totals per step.
  std::string to_string() const;

 private:
  std::map<std::pair<std::string, std::string>, ExactnessEntry> entries_;
};

// A report filled by several threads (the executor's workers reading a profile view).
class ExactnessTracker {
 public:
  void add(const ExactnessEntry& e) {
    std::lock_guard<std::mutex> lock(mu_);
    report_.add(e);
  }
  ExactnessReport snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return report_;
  }

 private:
  mutable std::mutex mu_;
  ExactnessReport report_;
};

// True when every value of `from` is a value of `to` (same dtype, or a widening float cast), so
// the cast needs no statistics.
bool cast_is_exact(DType from, DType to);

// "cast F32->F16".
std::string cast_step_name(DType from, DType to);

// Casts `n` elements like cast_elements(src, from, dst, to, n, opts) and, when the cast is not
// exact, adds its statistics to `e` (elements, changed, clamped, max_abs, max_rel; the caller
// sets tensor and step). Errors are cast_elements' (CastOverflow with the count) plus CastNaN for
// a NaN made from a non-NaN input; the caller adds the tensor's name.
Status tracked_cast(const void* src, DType from, void* dst, DType to, size_t n, const CastOptions& opts,
                    ExactnessEntry& e);

}  // namespace ckpt

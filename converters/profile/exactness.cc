#include "converters/profile/exactness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace ckpt {

void ExactnessEntry::merge(const ExactnessEntry& o) {
  elements += o.elements;
  changed += o.changed;
  clamped += o.clamped;
  max_abs = std::max(max_abs, o.max_abs);
  max_rel = std::max(max_rel, o.max_rel);
  if (stored_as.empty()) stored_as = o.stored_as;
}

nlohmann::json ExactnessEntry::to_json() const {
  return {{"tensor", tensor}, {"stored_as", stored_as}, {"step", step},     {"elements", elements},
          {"changed", changed}, {"clamped", clamped},     {"max_abs", max_abs}, {"max_rel", max_rel}};
}

void ExactnessReport::add(const ExactnessEntry& e) {
  auto [it, fresh] = entries_.try_emplace({e.tensor, e.step}, e);
  if (!fresh) it->second.merge(e);
}

void ExactnessReport::merge(const ExactnessReport& o) {
  for (const auto& [k, e] : o.entries_) add(e);
}

std::vector<ExactnessEntry> ExactnessReport::entries() const {
  std::vector<ExactnessEntry> v;
  v.reserve(entries_.size());
  for (const auto& [k, e] : entries_) v.push_back(e);
  return v;
}

bool ExactnessReport::exact() const {
  for (const auto& [k, e] : entries_)
    if (e.changed > 0 || e.clamped > 0) return false;
  return true;
}

nlohmann::json ExactnessReport::to_json() const {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& [k, e] : entries_) steps.push_back(e.to_json());
  return {{"exact", exact()}, {"steps", std::move(steps)}};
}

namespace {

Status bad_report(const std::string& origin, const std::string& msg) {
  return Status::Error("BadExactnessReport", "exactness report of " + origin + ": " + msg);
}

}  // namespace

Result<ExactnessReport> ExactnessReport::from_json(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object() || !j.contains("steps") || !j["steps"].is_array())
    return bad_report(origin, "expected an object with a 'steps' array");
  ExactnessReport r;
  for (const auto& s : j["steps"]) {
    ExactnessEntry e;
    if (!s.is_object()) return bad_report(origin, "a step is not an object");
    for (const char* k : {"tensor", "stored_as", "step"})
      if (!s.contains(k) || !s[k].is_string()) return bad_report(origin, std::string("step key '") + k + "' must be a string");
    for (const char* k : {"elements", "changed", "clamped"})
      if (!s.contains(k) || !s[k].is_number_unsigned()) return bad_report(origin, std::string("step key '") + k + "' must be a count");
    for (const char* k : {"max_abs", "max_rel"})
      if (!s.contains(k) || !s[k].is_number()) return bad_report(origin, std::string("step key '") + k + "' must be a number");
    e.tensor = s["tensor"];
    e.stored_as = s["stored_as"];
    e.step = s["step"];
    e.elements = s["elements"];
    e.changed = s["changed"];
    e.clamped = s["clamped"];
    e.max_abs = s["max_abs"];
    e.max_rel = s["max_rel"];
    r.add(e);
  }
  return r;
}

std::string ExactnessReport::to_string() const {
  if (entries_.empty()) return "exactness: every step exact (no narrowing cast, no dropped padding)\n";
  std::map<std::string, ExactnessEntry> per_step;
  std::string lines;
  char buf[512];
  for (const auto& [k, e] : entries_) {
    ExactnessEntry& t = per_step[e.step];
    t.step = e.step;
    t.merge(e);
    if (e.changed == 0 && e.clamped == 0) continue;
    std::snprintf(buf, sizeof buf, "  %-48s %-22s %12llu of %12llu changed  max abs %.6g  max rel %.6g%s\n",
                  e.tensor.c_str(), e.step.c_str(), static_cast<unsigned long long>(e.changed),
                  static_cast<unsigned long long>(e.elements), e.max_abs, e.max_rel,
                  e.clamped ? ("  clamped " + std::to_string(e.clamped)).c_str() : "");
    lines += buf;
  }
  std::string out = exact() ? "exactness: exact (every value kept)\n" : "exactness: lossy steps\n";
  for (const auto& [s, t] : per_step) {
    std::snprintf(buf, sizeof buf, "  total %-42s %12llu of %12llu changed  max abs %.6g  max rel %.6g  clamped %llu\n",
                  s.c_str(), static_cast<unsigned long long>(t.changed), static_cast<unsigned long long>(t.elements),
                  t.max_abs, t.max_rel, static_cast<unsigned long long>(t.clamped));
    out += buf;
  }
  return out + lines;
}

namespace {

// (exponent bits, mantissa bits) of a float dtype; {0, 0} for others.
std::pair<int, int> exactness_float_bits(DType t) {
  switch (t) {
    case DType::kF16: return {5, 10};
    case DType::kBF16: return {8, 7};
    case DType::kF32: return {8, 23};
    case DType::kF64: return {11, 52};
    case DType::kF8E4M3: return {4, 3};
    case DType::kF8E5M2: return {5, 2};
    default: return {0, 0};
  }
}

std::string exactness_max_finite(DType t) {
  switch (t) {
    case DType::kF16: return "65504";
    case DType::kBF16: return "3.38953139e38";
    case DType::kF32: return "3.40282347e38";
    case DType::kF8E4M3: return "448";
    case DType::kF8E5M2: return "57344";
    case DType::kF8E8M0: return "1.70141183e38";
    case DType::kF4: return "6";
    default: return "(none)";
  }
}

constexpr size_t kTrackBlock = 2048;

// Compares one block of inputs `x` with their cast results `y` (both decoded exactly into T).
template <typename T>
void exactness_compare(const T* x, const T* y, size_t m, ExactnessEntry& e, uint64_t& made_nan) {
  uint64_t changed = 0;
  double max_abs = e.max_abs, max_rel = e.max_rel;
  for (size_t k = 0; k < m; ++k) {
    const T a = x[k], b = y[k];
    if (a == b) continue;
    if (a != a) continue;  // NaN in, NaN out
    if (b != b) {
      ++made_nan;
      continue;
    }
    ++changed;
    const double d = std::fabs(static_cast<double>(b) - static_cast<double>(a));
    max_abs = std::max(max_abs, d);
    if (a != 0) max_rel = std::max(max_rel, d / std::fabs(static_cast<double>(a)));
  }
  e.changed += changed;
  e.max_abs = max_abs;
  e.max_rel = max_rel;
}

}  // namespace

bool cast_is_exact(DType from, DType to) {
  if (from == to || !dtype_is_float(from) || !dtype_is_float(to)) return true;  // others: exact or an error
  const auto [fe, fm] = exactness_float_bits(from);
  const auto [te, tm] = exactness_float_bits(to);
  return te >= fe && tm >= fm;
}

std::string cast_step_name(DType from, DType to) {
  return "cast " + std::string(dtype_name(from)) + "->" + std::string(dtype_name(to));
}

Status tracked_cast(const void* src_v, DType from, void* dst_v, DType to, size_t n, const CastOptions& opts,
                    ExactnessEntry& e) {
  if (cast_is_exact(from, to)) return cast_elements(src_v, from, dst_v, to, n, opts);
  // Cast saturating (counting what overflowed), then compare block by block in f32 (or f64 when
  // the source is f64: every narrower float is exactly an f32).
  CastOptions sat = opts;
  sat.overflow = OverflowPolicy::kSaturate;
  const auto* src = static_cast<const uint8_t*>(src_v);
  auto* dst = static_cast<uint8_t*>(dst_v);
  const size_t fs = dtype_size(from), ts = dtype_size(to);
  const bool wide = from == DType::kF64;
  const DType tmp_t = wide ? DType::kF64 : DType::kF32;
  alignas(32) double xa[kTrackBlock], ya[kTrackBlock];
  uint64_t clamped = 0, made_nan = 0;
  for (size_t i = 0; i < n; i += kTrackBlock) {
    const size_t m = std::min(kTrackBlock, n - i);
    CastStats st;
    CKPT_RETURN_IF_ERROR(cast_elements(src + i * fs, from, dst + i * ts, to, m, sat, &st));
    clamped += st.overflowed;
    const void* x = src + i * fs;
    if (from != tmp_t) {
      CKPT_RETURN_IF_ERROR(cast_elements(x, from, xa, tmp_t, m));
      x = xa;
    }
    CKPT_RETURN_IF_ERROR(cast_elements(dst + i * ts, to, ya, tmp_t, m));
    if (wide)
      exactness_compare(static_cast<const double*>(x), ya, m, e, made_nan);
    else
      exactness_compare(static_cast<const float*>(x), reinterpret_cast<const float*>(ya), m, e, made_nan);
  }
  e.elements += n;
  e.clamped += clamped;
  if (made_nan > 0)
    return Status::Error("CastNaN", cast_step_name(from, to) + " of " + std::to_string(n) + " elements: " +
                                        std::to_string(made_nan) + " results are NaN from non-NaN inputs");
  if (clamped > 0 && opts.overflow == OverflowPolicy::kError)
    return Status::Error("CastOverflow", cast_step_name(from, to) + " of " + std::to_string(n) + " elements: " +
                                             std::to_string(clamped) + " finite values beyond the target's max finite " +
                                             exactness_max_finite(to) + " (--saturate clamps them and reports the count)");
  return Status::Ok();
}

}  // namespace ckpt

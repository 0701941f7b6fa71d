// Test tool: writes checkpoints step-00000001, step-00000002, ... into a run directory forever
// (or `max_steps`), updating `latest` after each commit, so that a test can SIGKILL it at random
// moments. Data is a pure function of (step, tensor, element) so the test can check content.
// Usage: store_crash_writer RUN_DIR [max_steps] [codec: none|shuffle+zstd]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "formats/base/fs_util.h"
#include "formats/store/run_dir.h"
#include "formats/store/store_writer.h"

using namespace ckpt;
using namespace ckpt::store;

// Value of element i of tensor t at step s (also used by the test).
static float crash_value(int64_t s, int t, int64_t i) { return static_cast<float>(s * 1000003 + t * 7919 + i % 100003); }

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s RUN_DIR [max_steps] [codec]\n", argv[0]);
    return 2;
  }
  const std::string run = argv[1];
  const int64_t max_steps = argc > 2 ? std::atoll(argv[2]) : INT64_MAX;
  StoreOptions opts;
  if (argc > 3) {
    auto c = codec_from_name(argv[3]);
    if (!c.ok()) return 2;
    opts.codec = *c;
  }
  // Resume after the newest complete step (like a trainer would).
  int64_t step = 1;
  if (auto r = resolve_checkpoint(run); r.ok()) step = std::atoll(r->substr(r->rfind("step-") + 5).c_str()) + 1;
  std::vector<TensorMeta> ts = {{"a", DType::kF32, {256, 1024}}, {"b", DType::kF32, {4096}}};  // 1 MiB + 16 KiB
  std::vector<Piece> ps = {{"a", Region{Box{{0, 0}, {128, 1024}}, 0, -1}, DType::kF32},
                           {"a", Region{Box{{128, 0}, {128, 1024}}, 0, 100000}, DType::kF32},
                           {"a", Region{Box{{128, 0}, {128, 1024}}, 100000, 131072}, DType::kF32},
                           {"b", Region{Box::whole({4096}), 0, -1}, DType::kF32}};
  for (; step <= max_steps; ++step) {
    const std::string name = step_dir_name(step);
    (void)remove_tree(run + "/" + name);  // a step dir from a crashed run that never got into latest
    StoreWriter w(run + "/" + name, opts);
    Status st = w.begin(ts, ps, {{"trainer", {{"step", step}}}});
    for (size_t k = 0; st.ok() && k < ps.size(); ++k) {
      const int t = ps[k].tensor == "a" ? 0 : 1;
      const Box& b = ps[k].region.box;
      const int64_t row0 = b.ndim() == 2 ? b.offset[0] * 1024 : 0;
      const int64_t begin = ps[k].region.is_flat() ? ps[k].region.flat_begin : 0;
      const int64_t n = ps[k].region.numel();
      std::vector<float> v(static_cast<size_t>(n));  // (n,) storage order
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = crash_value(step, t, row0 + begin + i);
      for (int64_t at = 0; st.ok() && at < n; at += 8192) st = w.write(k, v.data() + at, std::min<int64_t>(8192, n - at));
    }
    if (st.ok()) st = w.commit();
    if (st.ok()) st = write_latest(run, name);
    if (!st.ok()) {
      std::fprintf(stderr, "store_crash_writer: %s\n", st.to_string().c_str());
      return 1;
    }
    // Keep the run dir small: drop steps older than the previous one.
    if (step > 2) (void)remove_tree(run + "/" + step_dir_name(step - 2));
  }
  return 0;
}

// ckpt reshard SRC DST: re-splits a native-store checkpoint for another TP/PP/DP(ZeRO) layout
// (reshard/planner.h, reshard/store_reshard.h). Under mpirun the shard files are divided among
// the processes.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "converters/llama_config.h"
#include "converters/llama_sharding.h"
#include "converters/megatron_dir_source.h"
#include "formats/store/store_reader.h"
#include "reshard/dist.h"
#include "reshard/planner.h"
#include "reshard/store_reshard.h"

namespace ckpt::cli {
namespace {

struct ReshardArgs {
  std::string src, dst, layout_file, compress = "none";
  LayoutFlags layout;
  StreamFlags stream;
  bool dry_run = false, json = false, no_verify = false;
};

Result<Layout> target_layout(const ReshardArgs& a, const LlamaConfig& cfg, const nlohmann::json& src_meta) {
  Layout l;
  if (!a.layout_file.empty()) {
    if (a.layout.given())
      return Status::InvalidArgument("--layout FILE excludes --tp/--pp/--dp/--zero/--pp-layers");
    std::ifstream in(a.layout_file);
    if (!in) return Status::FromErrno("cannot open layout file", a.layout_file, errno);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str().size() > (16u << 20)) return Status::InvalidArgument("layout file '" + a.layout_file + "' is too large");
    auto j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded()) return Status::InvalidArgument("layout file '" + a.layout_file + "' is not valid JSON");
    auto r = Layout::from_json(j);
    if (!r.ok()) return r.take_status().with_file(a.layout_file);
    l = std::move(r).value();
  } else {
    if (!a.layout.given()) return Status::InvalidArgument("give --layout FILE, or --tp N --pp N --dp N (each >= 1)");
    CKPT_ASSIGN_OR_RETURN(l, a.layout.make(cfg.num_hidden_layers));
    // Keep the source's vocab divisor and profile unless a layout file says otherwise.
    if (src_meta.contains("layout") && src_meta["layout"].is_object()) {
      const auto& sl = src_meta["layout"];
      if (sl.contains("vocab_divisor") && sl["vocab_divisor"].is_number_integer() && sl["vocab_divisor"].get<int64_t>() >= 1)
        l.vocab_divisor = sl["vocab_divisor"].get<int64_t>();
      if (sl.contains("profile") && sl["profile"].is_string()) l.profile = sl["profile"].get<std::string>();
    }
  }
  return l;
}

// Re-hashes every SRC piece (the same check as StoreReader::verify) in a child process forked
// before this process touches SRC, so the hashing and its reads overlap the reshard on another
// core (HDF5 is not thread safe: a process, not a thread). The child dies with its parent.
class BackgroundVerify {
 public:
  ~BackgroundVerify() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  // Returns false when fork is not possible (the caller verifies inline).
  bool start(const std::string& src) {
    int p[2];
    if (pipe(p) != 0) return false;
    std::fflush(nullptr);
    pid_ = fork();
    if (pid_ < 0) {
      close(p[0]);
      close(p[1]);
      return false;
    }
    if (pid_ == 0) {
      close(p[0]);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      nlohmann::json out = {{"ok", true}};
      auto r = store::StoreReader::open(src);
      if (!r.ok()) {
        out = status_json(r.status(), "");
      } else {
        store::VerifyReport rep = (*r)->verify();
        if (!rep.ok())
          out = status_json(rep.failures.front().status,
                            "SRC piece " + std::to_string(rep.failures.front().piece) + " is corrupt (" +
                                std::to_string(rep.failures.size()) + " failing pieces); nothing was committed");
      }
      const std::string text = out.dump();
      size_t off = 0;
      while (off < text.size()) {
        ssize_t n = write(p[1], text.data() + off, text.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      _exit(0);
    }
    close(p[1]);
    fd_ = p[0];
    return true;
  }
  // Waits for the child's verdict.
  Status wait() {
    std::string text;
    char buf[4096];
    for (;;) {
      ssize_t n = read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (text.size() < (1u << 20)) text.append(buf, static_cast<size_t>(n));
    }
    close(fd_);
    fd_ = -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || j.is_discarded() || !j.is_object())
      return Status::Internal("the SRC verification process failed (status " + std::to_string(status) +
                              "); nothing was committed");
    if (j.value("ok", false)) return Status::Ok();
    Status st = Status::Error(static_cast<ErrorKind>(j.value("kind", static_cast<int>(ErrorKind::kInternal))),
                              j.value("code", std::string("Internal")), j.value("message", std::string()));
    if (!j.value("file", std::string()).empty()) st = std::move(st).with_file(j.value("file", std::string()));
    if (!j.value("tensor", std::string()).empty()) st = std::move(st).with_tensor(j.value("tensor", std::string()));
    const std::string ctx = j.value("context", std::string());
    return ctx.empty() ? st : std::move(st).with_context(ctx);
  }

 private:
  static nlohmann::json status_json(const Status& st, const std::string& context) {
    return {{"ok", false},          {"kind", static_cast<int>(st.kind())}, {"code", st.code()}, {"message", st.message()},
            {"file", st.file()},    {"tensor", st.tensor()},               {"context", context}};
  }
  pid_t pid_ = -1;
  int fd_ = -1;
};

// Draws "reshard [#####.....]  45%  1.20/2.70 GiB  812 MB/s" on stderr, at most ~10 times a second.
struct ProgressBar {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now(), last{};
  void operator()(uint64_t done, uint64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (done < total && now - last < std::chrono::milliseconds(100)) return;
    last = now;
    const double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int w = 30, fill = static_cast<int>(frac * w);
    std::string bar(static_cast<size_t>(fill), '#');
    bar += std::string(static_cast<size_t>(w - fill), '.');
    const double secs = std::chrono::duration<double>(now - start).count();
    std::fprintf(stderr, "\rreshard [%s] %3d%%  %.2f/%.2f GiB  %.0f MB/s", bar.c_str(), static_cast<int>(frac * 100),
                 done / 1073741824.0, total / 1073741824.0, secs > 0 ? done / 1e6 / secs : 0.0);
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }
};

int run_reshard(const ReshardArgs& a) {
  Dist* dist = std::getenv("OMPI_COMM_WORLD_SIZE") ? &Dist::get() : nullptr;
  const bool root = !dist || dist->rank() == 0;
  auto fail = [&](Status st) { return root ? report_error(st) : exit_code_for(st); };

  auto sopts = store::parse_compress_spec(a.compress, "--compress");
  if (!sopts.ok()) return fail(sopts.take_status());
  sopts->hash_threads = a.stream.threads;

  // SRC re-hash, overlapped with the reshard in a child process (single-process runs only; under
  // mpirun rank 0 re-hashes inline before committing).
  BackgroundVerify bg;
  bool bg_started = false;
  if (!a.no_verify && !a.dry_run && !dist && !is_megatron_dir(a.src)) bg_started = bg.start(a.src);

  // SRC: a native store (checksummed), or a Megatron-layout directory written by export-megatron
  // (packed QKV and fused gate/up are unpacked by its segment map).
  std::unique_ptr<store::StoreReader> store_src;
  std::unique_ptr<TensorSource> other_src;
  if (is_megatron_dir(a.src)) {
    auto m = open_megatron_dir(a.src);
    if (!m.ok()) return fail(m.take_status().with_context("opening SRC"));
    other_src = std::move(m).value();
  } else {
    auto reader = store::StoreReader::open(a.src);
    if (!reader.ok()) return fail(reader.take_status().with_context("opening SRC"));
    store_src = std::move(reader).value();
  }
  TensorSource& src = store_src ? static_cast<TensorSource&>(*store_src) : *other_src;
  const nlohmann::json& meta = src.metadata();
  if (!meta.contains("model_config"))
    return fail(Status::Error(ErrorKind::kUnsupported, "NoModelConfig",
                              "SRC '" + src.describe() + "' has no model_config metadata: cannot derive sharding rules"));
  auto cfg = LlamaConfig::from_json(meta["model_config"]);
  if (!cfg.ok()) return fail(cfg.take_status().with_context("model_config of '" + src.describe() + "'"));
  LlamaShardingRules rules(*cfg);
  auto layout = target_layout(a, *cfg, meta);
  if (!layout.ok()) return fail(layout.take_status());

  // Buffer budget: keep ~48 MiB for the store writer, HDF5 and the process itself.
  ExecOptions eo;
  eo.threads = a.stream.threads;
  size_t max_src = 1;
  for (const auto& p : src.pieces()) max_src = std::max(max_src, dtype_size(p.dtype));
  auto chunk = a.stream.chunk_bytes(max_src, 1, 48ull << 20);
  if (!chunk.ok()) return fail(chunk.take_status());
  eo.max_chunk_bytes = *chunk;

  const auto t0 = std::chrono::steady_clock::now();
  auto plan = make_plan(src.tensors(), src.pieces(), meta, *layout, rules, eo);
  if (!plan.ok()) return fail(plan.take_status());
  const double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (a.dry_run) {
    if (root) {
      if (a.json) {
        nlohmann::json j = plan->to_json();
        j["plan_seconds"] = plan_s;
        std::printf("%s\n", j.dump(2).c_str());
      } else {
        std::printf("%s", plan->to_string().c_str());
      }
    }
    return 0;
  }

  StoreExecOptions so;
  so.exec = eo;
  so.store = *sopts;
  ProgressBar bar;
  if (root && stderr_is_tty() && !a.json) so.exec.progress = [&bar](uint64_t d, uint64_t t) { bar(d, t); };
  if (bg_started)
    so.before_commit = [&bg]() -> Status { return bg.wait(); };
  else if (!a.no_verify && store_src)
    so.before_commit = [&store_src]() -> Status {
      store::VerifyReport rep = store_src->verify();
      if (!rep.ok())
        return std::move(rep.failures.front().status)
            .with_context("SRC piece " + std::to_string(rep.failures.front().piece) + " is corrupt (" +
                          std::to_string(rep.failures.size()) + " failing pieces); nothing was committed");
      return Status::Ok();
    };
  Status st = execute_plan_to_store(src, *plan, a.dst, so, dist);
  if (!st.ok()) return fail(st);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (root) {
    if (a.json) {
      nlohmann::json j = plan->to_json();
      j["dst"] = a.dst;
      j["seconds"] = secs;
      j["plan_seconds"] = plan_s;
      j["processes"] = dist ? dist->size() : 1;
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("resharded %s -> %s (%s): %zu pieces in %zu files, %.2f GiB written in %.2f s\n", src.describe().c_str(),
                  a.dst.c_str(), layout->to_string().c_str(), plan->pieces.size(), plan->files.size(),
                  plan->bytes_written / 1073741824.0, secs);
    }
  }
  return 0;
}

CommandAction setup_reshard(CLI::App& sub) {
  auto a = std::make_shared<ReshardArgs>();
  sub.add_option("SRC", a->src, "Source checkpoint: native store dir, run dir (follows `latest`), or a Megatron-layout dir (export-megatron)")->required();
  sub.add_option("DST", a->dst, "New checkpoint dir (must not exist)")->required();
  sub.add_option("--layout", a->layout_file, "Target layout JSON file (tp, pp, dp, zero, layers_per_stage, ...)");
  a->layout.add(sub, "ZeRO stage of the optimizer state: 0 (replicated) or 1 (flat shards over DP)");
  a->stream.add(sub);
  sub.add_flag("--dry-run", a->dry_run, "Print the plan (pieces, files, bytes) without writing");
  sub.add_option("--compress", a->compress, "Shard compression: none, zstd[:LEVEL], shuffle+zstd[:LEVEL]");
  sub.add_flag("--json", a->json, "Print the plan / result as JSON");
  sub.add_flag("--no-verify", a->no_verify, "Skip re-hashing SRC pieces before committing DST");
  sub.footer(
      "Output is written to DST.partial and renamed when complete. Under `mpirun -np K` the shard files are\n"
      "divided among the K processes; the result is byte-identical to a single process.");
  return [a] { return run_reshard(*a); };
}

}  // namespace

CKPT_REGISTER_COMMAND("reshard", "Re-split a checkpoint for another TP/PP/DP(ZeRO) layout", setup_reshard);

}  // namespace ckpt::cli

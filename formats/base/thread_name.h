// Names the calling thread (pthread_setname_np, at most 15 characters) the first time it runs a
// store task of a kind, so per-thread CPU time (`top -H`, /proc/self/task/*/comm, perf) shows
// which work a thread did: "ckpt-encode" (chunk compression), "ckpt-hash" (piece digests),
// "ckpt-decode" (chunk decompression). Pool threads only: never the caller's own thread.
// Thread safety: affects the calling thread only.
#pragma once

namespace ckpt::store {

void name_store_thread(const char* name);  // `name`: a string literal

}  // namespace ckpt::store

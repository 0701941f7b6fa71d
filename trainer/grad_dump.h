// `ckpt train --dump-grads DIR`: the gradients of one step in global view, written as a native
// store checkpoint (tensor names = parameter names, F32, one piece per tensor) so that `ckpt diff`
// compares the gradients of any two layouts. A test aid: every rank sends its gradient regions to
// rank 0 (Comm::gather), which assembles them through the engine (replicas are the same values;
// any one covers) and writes DIR atomically. Memory on rank 0: the whole model's gradients twice.
// Collective over `world`; call from the main thread.
#pragma once

#include <string>
#include <vector>

#include "converters/llama_config.h"
#include "formats/status.h"
#include "reshard/comm.h"
#include "trainer/zero_optimizer.h"

namespace ckpt::trainer {

Status dump_gradients(Comm& world, const LlamaConfig& cfg, const std::vector<GradRegion<float>>& mine,
                      const std::string& dir);

}  // namespace ckpt::trainer

// replan_source (trainer/plan/replan.h).
#include "trainer/plan/replan.h"

#include "formats/store/manifest.h"
#include "formats/store/run_dir.h"
#include "trainer/plan/plan_job.h"
#include "trainer/state/trainer_state.h"

namespace ckpt::trainer {

Result<ReplanSource> replan_source(const std::string& path) {
  ReplanSource r;
  CKPT_ASSIGN_OR_RETURN(r.checkpoint, store::resolve_checkpoint(path));
  CKPT_ASSIGN_OR_RETURN(store::Manifest m, store::load_manifest(r.checkpoint));
  const nlohmann::json& md = m.metadata;
  auto cfg = md.find("model_config");
  if (cfg == md.end())
    return Status::Error("NoModelConfig", "checkpoint '" + r.checkpoint + "' has no model_config metadata: give --model CONFIG");
  CKPT_ASSIGN_OR_RETURN(r.config, LlamaConfig::from_json(*cfg));
  CKPT_RETURN_IF_ERROR(check_plan_model(r.config, "ckpt plan --from"));
  auto tr = md.find("trainer");
  if (tr == md.end())
    return Status::Error("BadTrainerState", "checkpoint '" + r.checkpoint +
                                                "' has no trainer metadata (global batch, sequence length): not a `ckpt train` "
                                                "checkpoint");
  CKPT_ASSIGN_OR_RETURN(TrainerState st, TrainerState::from_json(*tr));
  r.global_batch = st.global_batch;
  r.seq_len = st.seq_len;
  r.step = st.step;
  if (auto l = md.find("layout"); l != md.end()) {
    CKPT_ASSIGN_OR_RETURN(r.layout, Layout::from_json(*l));
  }
  return r;
}

}  // namespace ckpt::trainer

#include "model/weight_dtype.h"

#include "core/bf16.h"
#include "model/moe_ffn.h"

namespace mf {
namespace {

// the parameters project()/embed_rows()/the experts' inference path read in any dtype
std::vector<at::Tensor> bf16_capable(TransformerLMImpl& m) {
  std::vector<at::Tensor> out{m.model->embed_tokens->weight};
  if (m.lm_head) out.push_back(m.lm_head->weight);
  auto add_bank = [&](const std::shared_ptr<ExpertBank>& bank) {
    if (bank) out.insert(out.end(), {bank->gate_up_proj, bank->down_proj});
  };
  for (auto& block : m.model->blocks) {
    auto& a = *block->self_attn;
    out.insert(out.end(), {a.q_proj->weight, a.k_proj->weight, a.v_proj->weight, a.o_proj->weight});
    if (auto* swiglu = dynamic_cast<SwiGLU*>(block->mlp.get())) {
      out.insert(out.end(), {swiglu->gate_proj->weight, swiglu->up_proj->weight, swiglu->down_proj->weight});
    } else if (auto* gelu = dynamic_cast<GeluMLP*>(block->mlp.get())) {
      out.insert(out.end(), {gelu->fc1->weight, gelu->fc2->weight});
    } else if (auto* moe = dynamic_cast<MoEFeedForward*>(block->mlp.get()); moe && !moe->extended()) {
      add_bank(moe->experts);
      add_bank(moe->shared_experts);
    }
  }
  return out;
}

}  // namespace

at::ScalarType parse_weight_dtype(const std::string& name) {
  if (name == "f32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "int8") return at::kChar;
  throw ConfigError("--dtype '" + name + "': the weights are held in f32, bf16 or int8");
}

std::string weight_dtype_name(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? "bf16"
         : dtype == at::kChar   ? "int8"
         : dtype == at::kFloat  ? "f32"
                                : c10::toString(dtype);
}

HeldWeights hold_weights(TransformerLMImpl& model, at::ScalarType dtype, bool values) {
  HeldWeights h;
  int64_t all = 0;
  for (auto& p : model.parameters()) all += p.numel();
  if (dtype == at::kFloat) return {0, 0, all};
  TORCH_CHECK(held_narrow(dtype), "weights are held in float32, bfloat16 or int8, not ", c10::toString(dtype));
  at::NoGradGuard no_grad;
  for (auto& w : bf16_capable(model)) {
    if (w.scalar_type() == dtype || (dtype == at::kChar && !q8_holds(w))) continue;
    auto held = dtype == at::kChar ? q8_empty(w.sizes(), w.options()) : at::empty(w.sizes(), w.options().dtype(dtype));
    if (values) copy_weights(held, w.contiguous());
    if (dtype == at::kChar) w.set_requires_grad(false);  // LibTorch: only a float tensor takes a gradient
    w.set_data(held);
    ++h.tensors;
    h.parameters += w.numel();
  }
  h.kept = all - h.parameters;
  return h;
}

}  // namespace mf

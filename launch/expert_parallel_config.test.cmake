# policy.expert_parallel_config: `troupe validate` refuses policy.moe.expert_parallel where it cannot
# split (exit 2, naming the key and the value): E not dividing the experts, E not dividing the learner
# ranks, a dense model, weight_sync.transport: nccl beside divided learners; a layout that splits
# validates (also with learner.shard: gradients and parameters, policy.lora, distill.teacher and streamed
# parts, rollout.async_chunks > 1, and with learner.shard: parameters beside each of those and all three),
# and on policy.device cpu_fenced and cuda.
set(dir ${WORK}/expert_parallel_config)
file(MAKE_DIRECTORY ${dir})
file(WRITE ${dir}/moe.yaml "envs:\n  - name: arithmetic\ncluster:\n  learners: 2\npolicy:\n  moe:\n    expert_parallel: 2\n  model:\n    num_experts: 4\n    num_experts_per_tok: 2\n")
execute_process(COMMAND ${TROUPE} validate ${dir}/moe.yaml RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "validate of EP 2 over 4 experts and 2 learners exited ${rc}: ${err}")
endif()
function(refused what sets pattern)
  execute_process(COMMAND ${TROUPE} validate ${dir}/moe.yaml ${sets} RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${pattern}")
    message(FATAL_ERROR "${what}: expected exit 2 and '${pattern}', got rc=${rc} stderr=${err}")
  endif()
endfunction()
refused("E not dividing the experts" "--set;policy.model.num_experts=5"
        "error: policy.moe.expert_parallel: 2 does not divide policy.model.num_experts = 5")
refused("E not dividing the learners" "--set;cluster.learners=3"
        "error: policy.moe.expert_parallel: 2 does not divide cluster.learners = 3")
refused("a dense model" "--set;policy.model.num_experts=0"
        "error: policy.moe.expert_parallel: 2 splits MoE experts, but policy.model is dense \\(num_experts = 0\\)")
refused("divided learners with weight_sync.transport: nccl" "--set;policy.device=cpu_fenced;--set;weight_sync.transport=nccl"
        "error: weight_sync.transport: nccl broadcasts learner 0's whole weights, but with policy.moe.expert_parallel 2")
function(accepted what sets)
  execute_process(COMMAND ${TROUPE} validate ${dir}/moe.yaml ${sets} RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "EP 2 ${what} exited ${rc}: ${err}")
  endif()
endfunction()
accepted("with learner.shard: gradients" "--set;learner.shard=gradients")
accepted("with learner.shard: parameters" "--set;learner.shard=parameters")
accepted("with policy.lora (adapters on the routed experts too)" "--set;policy.lora.rank=4;--set;policy.lora.targets=all_linear")
accepted("with distill.teacher (top-k pass)" "--set;distill.teacher=teacher;--set;distill.topk=4;--set;cluster.scorers=1")
accepted("with streamed parts" "--set;rollout.async=true;--set;rollout.async_chunks=2;--set;rollout.prompts_per_step=4")
accepted("with learner.shard: parameters beside policy.lora"
         "--set;learner.shard=parameters;--set;policy.lora.rank=4;--set;policy.lora.targets=all_linear")
accepted("with learner.shard: parameters beside distill.teacher (top-k pass)"
         "--set;learner.shard=parameters;--set;distill.teacher=teacher;--set;distill.topk=4;--set;cluster.scorers=1")
accepted("with learner.shard: parameters beside streamed parts"
         "--set;learner.shard=parameters;--set;rollout.async=true;--set;rollout.async_chunks=2;--set;rollout.prompts_per_step=4")
accepted("with learner.shard: parameters beside all three"
         "--set;learner.shard=parameters;--set;policy.lora.rank=4;--set;distill.teacher=teacher;--set;cluster.scorers=1;--set;rollout.async=true;--set;rollout.async_chunks=2;--set;rollout.prompts_per_step=4")
accepted("on policy.device: cpu_fenced" "--set;policy.device=cpu_fenced")
accepted("with weight_sync.transport: nccl where every learner holds every expert"
         "--set;policy.device=cpu_fenced;--set;weight_sync.transport=nccl;--set;learner.shard=optimizer")
# policy.device: cuda passes the check (validate never starts a GPU); a build without CUDA refuses the
# device itself, never expert parallelism beside it.
execute_process(COMMAND ${TROUPE} validate ${dir}/moe.yaml --set policy.device=cuda RESULT_VARIABLE rc ERROR_VARIABLE err)
if(err MATCHES "policy.moe.expert_parallel" OR
   NOT (rc EQUAL 0 OR (rc EQUAL 2 AND err MATCHES "policy.device: this build of troupe has no CUDA")))
  message(FATAL_ERROR "EP 2 on policy.device: cuda: expected it to validate, got rc=${rc} stderr=${err}")
endif()

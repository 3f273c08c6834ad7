#!/bin/bash
# local 2-node experiment: two raylets on this machine, each a fake GPU + `cpu`
# (as run on 2026-12-02, except the stop at the end: see there)
X=/tmp/mnode-exp; E=/root/.cache/p40fleet-test/lab-env-646fc11ec639fdd6/bin
NODES=${NODES:-2}
export PATH=$E:$PATH PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=$X/hf XDG_CACHE_HOME=$X/cache TMPDIR=$X/tmp RAY_TMPDIR=$X PYTHONPATH=$X/verl
mkdir -p $X/ray
RES=${RES-'--num-gpus=1 --resources={"cpu":1}'}
ray start --head --port=36379 --num-cpus=2 $RES --include-dashboard=false --object-store-memory=300000000 --disable-usage-stats --temp-dir=$X/ray > $X/ray-head.log 2>&1; echo head=$?
for i in $(seq 2 $NODES); do
PYTHONPATH=${WPP-$PYTHONPATH} ray start --address=127.0.0.1:36379 --num-cpus=2 $RES --object-store-memory=300000000 --disable-usage-stats > $X/ray-w$i.log 2>&1; echo worker$i=$?
done
export RAY_ADDRESS=127.0.0.1:36379
M=$X/models/tiny-qwen2; D=$X/data/gsm8k-lab
B=$NODES
start=$(date +%s)
timeout ${LIM-600} python -m verl.trainer.main_ppo data.train_files=$D/train.parquet data.val_files=$D/test.parquet actor_rollout_ref.model.path=$M critic.model.path=$M \
 +actor_rollout_ref.rollout.micro_batch_size=16 actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.dtype=float32 \
 +actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32 +actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32 +actor_rollout_ref.ref.fsdp_config.model_dtype=fp32 +critic.model.fsdp_config.mixed_precision.param_dtype=fp32 \
 +actor_rollout_ref.model.override_config._attn_implementation=sdpa actor_rollout_ref.model.use_remove_padding=False actor_rollout_ref.actor.use_torch_compile=False 'trainer.logger=[console]' \
 trainer.total_training_steps=1 data.max_prompt_length=64 data.max_response_length=16 data.truncation=left data.dataloader_num_workers=0 data.train_batch_size=$B data.val_batch_size=$B actor_rollout_ref.actor.ppo_mini_batch_size=$B actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 critic.ppo_micro_batch_size_per_gpu=1 trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1 trainer.default_local_dir=$X/s/checkpoints hydra.run.dir=$X/s/hydra \
 trainer.nnodes=$NODES trainer.n_gpus_per_node=1 trainer.device=cpu "$@" > $X/trainer.log 2>&1
echo rc=$? run_s=$(($(date +%s)-start))
# NOT `ray stop --force`: it kills every Ray process the caller may signal on the machine (as root
# on the lab controller: the lab hosts' raylets too, whose PIDs are visible there). Stop only
# this experiment's nodes (every one runs under the head's temp dir $X/ray).
for pid in $(pgrep -f -- "--temp-dir=$X/ray|$X/ray/session"); do kill "$pid"; done

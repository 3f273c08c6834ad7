# /tmp/mx/gloo_if: GLOO_SOCKET_IFNAME for every worker (runtime_env env_vars)
V=/home/verl/miniconda3/envs/verl-p40/bin
X=""; [ -s /tmp/mx/gloo_if ] && X=",\"env_vars\":{\"GLOO_SOCKET_IFNAME\":\"$(cat /tmp/mx/gloo_if)\"}"
J="{\"runtime_env\":{\"py_modules\":[\"/tmp/mx/verl/verl\"]$X}}"
echo "job config: $J"
mkdir -p /tmp/mx/s; chown verl:verl /tmp/mx/s
t0=$(date +%s)
runuser -u verl -- env -i HOME=/home/verl PATH=$V:/usr/bin:/bin PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=/tmp/mx/hf XDG_CACHE_HOME=/tmp/mx/cache TMPDIR=/tmp/mx RAY_TMPDIR=/tmp/mx PYTHONPATH=/tmp/mx/verl P40FLEET_RAY_ADDRESS=10.231.5.11:26379 RAY_JOB_CONFIG_JSON_ENV_VAR="$J" timeout 420 /home/verl/launch-ppo.sh trainer.total_training_steps=1 data.max_prompt_length=64 data.max_response_length=16 data.truncation=left data.dataloader_num_workers=0 data.train_batch_size=2 data.val_batch_size=2 actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 critic.ppo_micro_batch_size_per_gpu=1 trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1 trainer.default_local_dir=/tmp/mx/s/checkpoints hydra.run.dir=/tmp/mx/s/hydra trainer.nnodes=2 trainer.n_gpus_per_node=1 trainer.device=cpu > /tmp/mx/trainer.log 2>&1
echo "rc=$? run_s=$(($(date +%s)-t0))"
grep -ao "training/global_step:[0-9]*\|timing_s/step:[0-9.]*" /tmp/mx/trainer.log | sort -u
grep -ao "(WorkerDict pid=[0-9]*[^)]*)" /tmp/mx/trainer.log | sort | uniq -c
grep -an "Error\|rror:\|gloo\|Gloo\|connect" /tmp/mx/trainer.log | grep -v Warning | tail -12 | cut -c1-400
grep -an 'File "' /tmp/mx/trainer.log | tail -6 | cut -c1-300
cp /tmp/mx/trainer.log /tmp/mx/trainer-$(date +%s).log

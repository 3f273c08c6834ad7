V=/home/verl/miniconda3/envs/verl-p40/bin
ip -o -4 addr | awk '{print $2, $4}'; hostname; getent hosts lab1 lab2 $(hostname)
rm -rf /tmp/mx; install -d -o verl -g verl /tmp/mx
# /tmp/mx/rules.json: p40fleet.verl_patches.lab_cpu_ruleset_json('v0.5.0') (written here inline)
# /tmp/mx/verl_patch.py: files/verl_patch.py (written here inline)
chmod a+r /tmp/mx/*
E="env -i HOME=/home/verl PATH=$V:/usr/bin:/bin OMP_NUM_THREADS=1 RAY_USAGE_STATS_ENABLED=0 TMPDIR=/tmp/mx"
runuser -u verl -- $E bash -c "mkdir -p /tmp/mx/verl && cp -a /home/verl/verl/verl /tmp/mx/verl/verl && python /tmp/mx/verl_patch.py --rules /tmp/mx/rules.json --checkout /tmp/mx/verl | tail -1"
cd /tmp/mx && runuser -u verl -- $E timeout 300 ray start --head --port=26379 --num-cpus=2 --num-gpus=1 '--resources={"cpu":1}' --node-ip-address=10.231.5.11 --include-dashboard=false --object-store-memory=300000000 --disable-usage-stats --temp-dir=/tmp/mx/ray 2>&1 | tail -3

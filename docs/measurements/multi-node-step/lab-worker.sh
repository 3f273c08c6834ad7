V=/home/verl/miniconda3/envs/verl-p40/bin
ip -o -4 addr | awk '{print $2, $4}'
cd /tmp && runuser -u verl -- env -i HOME=/home/verl PATH=$V:/usr/bin:/bin OMP_NUM_THREADS=1 RAY_USAGE_STATS_ENABLED=0 timeout 300 ray start --address=10.231.5.11:26379 --num-cpus=2 --num-gpus=1 '--resources={"cpu":1}' --node-ip-address=10.231.5.12 --object-store-memory=300000000 --disable-usage-stats 2>&1 | tail -3

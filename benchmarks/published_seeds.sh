#!/usr/bin/env bash
# Wu et al. 2021's recipe as published (configs/multi30k_wu2021.yaml), one process per seed, side by side on one
# machine: on a GPU the 8000 updates of this 4+4-layer model are bound by kernel launches, so the seeds share it well.
#
#   bash benchmarks/published_seeds.sh RUNS_DIR DEADLINE_SECONDS SEED...
#
# Each seed trains into RUNS_DIR/seedN (console in RUNS_DIR/seedN.log). A run still going at DEADLINE_SECONDS gets
# SIGTERM, saves a checkpoint and can go on with --resume_from_checkpoint last. Validation scores loss only (fairseq
# validates loss an epoch; no greedy decoding of the validation split); the test is beam 5 on the averaged last 10.
# Then `python -m benchmarks.published_record` turns the folders into the record.
set -uo pipefail
runs=$1 deadline=$2
shift 2
mkdir -p "$runs"
for seed in "$@"; do
  OMP_NUM_THREADS=4 timeout -s TERM -k 120 "$deadline" python3 -m hf_vanilla train \
    --config configs/multi30k_wu2021.yaml --seed "$seed" --output_dir "$runs/seed$seed" \
    --predict_with_generate false --disable_tqdm true > "$runs/seed$seed.log" 2>&1 &
done
wait
for seed in "$@"; do
  echo "seed $seed: $(tail -n 2 "$runs/seed$seed.log" | tr '\n' ' ')"
done

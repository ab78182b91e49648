#!/usr/bin/env bash
# The GPU checks and benchmarks in one go, for a CUDA machine with torch and Triton installed
# (seqzoo itself need not be: it runs from this checkout). Results land in OUTDIR.
#   bash benchmarks/gpu_check.sh OUTDIR [tests|suite|bench|all]
# tests: the gpu-marked tests (every encoder on CUDA against the CPU and under autocast, the Triton
#        kernel against the reference and a float64 gradcheck on the GPU, beam search, training and
#        resuming on CUDA in fp32, bf16 and fp16).
# suite: every other test, on a machine where ``train.device: auto`` trains on the GPU
#        (with pytest-xdist's workers when it is installed).
# bench: QRNN vs cuDNN LSTM/GRU over the QRNN paper's Figure 4 grid (hidden 320, batch 8-256,
#        length 32-512; k = 1 and k = 2, k = 1 with TF32 and k = 1 in bf16 mixed precision), then
#        the MZU+DT at the PTB setting, eager and with its recurrent step through torch.compile.
set -u -o pipefail
out=${1:?usage: gpu_check.sh OUTDIR [tests|suite|bench|all]}
what=${2:-all}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee "$out/gpu.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$out/gpu.txt"
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
python3 setup.py -q build_ext --inplace >"$out/build.log" 2>&1 || echo "C kernel build failed: the CPU side pools with the reference"
if [[ $what == tests || $what == all ]]; then
    python3 -m pytest -q -p no:cacheprovider -m gpu -rs $workers tests 2>&1 | tee "$out/tests.log"
fi
if [[ $what == suite || $what == all ]]; then
    # 2 threads a worker: 8-15 workers of 16 threads each on 16 cores did not finish in 150-330 s on an H200 machine
    OMP_NUM_THREADS=2 python3 -m pytest -q -p no:cacheprovider -m "not gpu" -rf $workers tests 2>&1 | tee "$out/suite.log"
fi
if [[ $what == bench || $what == all ]]; then
    grid=$(python3 -c "print(','.join(f'{b}x{t}x320' for b in (8, 16, 32, 64, 128, 256) for t in (32, 64, 128, 256, 512)))")
    bench="python3 -m seqzoo.bench.encoders --device cuda --shapes $grid --json --repeats 10 --warmup 3"
    $bench --encoders lstm,gru,qrnn >"$out/bench_k1.jsonl"
    $bench --encoders lstm,qrnn --qrnn-window 2 >"$out/bench_k2.jsonl"
    $bench --encoders lstm,qrnn --tf32 >"$out/bench_k1_tf32.jsonl"
    $bench --encoders lstm,qrnn --precision bf16 >"$out/bench_k1_bf16.jsonl"
    for f in bench_k1 bench_k2 bench_k1_tf32 bench_k1_bf16; do
        python3 benchmarks/speedup_grid.py "$out/$f.jsonl" --png "$out/$f.png" | tee "$out/$f.txt"
    done
    python3 -m seqzoo.bench.mzu --device cuda --repeats 3 --json | tee "$out/mzu.jsonl"
    python3 -m seqzoo.bench.mzu --device cuda --repeats 3 --json --compile-step | tee "$out/mzu_compile.jsonl"
fi

# Benchmarks on the chip, one process each (each opens the chip: ~15 s); logs come back in $OUT.
. .ci/device/setup.sh || exit 1
run() { local limit=$1; shift; echo "==== $* (limit ${limit}s) $(date +%T)"; timeout -s INT $limit python3 "$@" 2>&1 | grep -v Warning; }
{
for b in ${BENCH:-throughput pallas eager compiled_large compiled fused amp pinned demo cold}; do
  case $b in
    throughput) run 90 benchmarks/throughput.py --sizes 2048,4096,8192 ;;
    pallas) run 90 benchmarks/pallas.py ;;
    eager) run 90 benchmarks/eager_overhead.py ;;
    compiled_large) run 120 benchmarks/compiled.py --large --iters 5 ;;
    compiled) run 90 benchmarks/compiled.py ;;
    fused) run 300 benchmarks/fused.py --repeats 3 ;;
    amp) run 90 benchmarks/amp_optim.py --repeats 3 ;;
    pinned) run 60 benchmarks/pinned_transfer.py ;;
    demo) run 60 -m tpu_interactive.demo ;;
    cold) run 200 benchmarks/cold_start.py --runs 1 ;;
  esac
done
} 2>&1 | tee -a $OUT/bench.log

#!/bin/bash
# TODAY and BEFORE: checkouts of 2e4103d's code and of cbfc9f9; OUT: where the logs and JSON go. Needs the venv at /work/venv.
# Where issue 55's goals stand: bfloat16 and float32 alternating at each size (today's code, 2e4103d), and float32 at
# 8 x 128 against the code before the issue (cbfc9f9), 3 rounds each.
. /work/venv/bin/activate; export SDL_AUDIODRIVER=dummy SDL_VIDEODRIVER=dummy
out=${OUT:-results/benchmarks/issue55-goals-xeon-amx}; mkdir -p $out
bench() { # tree tag W T U D round
  (cd $1 && date +%T && python -m lab.benchmark --paths fast --workers $3 --steps $4 --updates $5 --set compute_dtype=$6 > $out/$2-$3x$4-$6-$7.log 2>&1; tail -1 $out/$2-$3x$4-$6-$7.log > $out/$2-$3x$4-$6-$7.json)
}
for r in 1 2 3; do
  bench "$TODAY" today 8 128 3 float32 $r
  bench "$BEFORE" cbfc9f9 8 128 3 float32 $r
  bench "$TODAY" today 8 128 3 bfloat16 $r
done
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then a=float32; b=bfloat16; else a=bfloat16; b=float32; fi
  bench "$TODAY" today 32 512 1 $a $r
  bench "$TODAY" today 32 512 1 $b $r
done
echo ALLDONE

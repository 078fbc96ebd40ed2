#!/usr/bin/env bash
# One model's rollout (bench.measure, compile=True's session, default cache) in a
# fresh process whose background builds fill the cache, a wait for those builds,
# then a second fresh process that loads their artifacts: the compiled step of the
# shipped path. Usage: MODEL=stormcast STEPS=11 OUT=dir cold_then_warm.sh
set -u
MODEL=${MODEL:-stormcast}
STEPS=${STEPS:-11}
WAIT=${WAIT:-420}
S="{\"model\":\"$MODEL\",\"mode\":\"auto\",\"cache\":\"cold\",\"size\":\"full\",\"device\":\"cuda\",\"steps\":$STEPS,\"fp32\":false,\"e2e_steps\":0,\"reference\":\"/tmp/none.pt\",\"precision\":\"tf32\",\"save_reference\":false}"
A=${EARTH2STUDIO_COMPILE_CACHE:-$HOME/.cache/earth2studio/compile}/aot
summary() {
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], {k: r[k] for k in ('first_step_s', 'steady_ms')}); [print(' ', x['region'], x['status'], x['executor'], x['cache_source'], x['compiled_ms'], x['eager_ms'], x['reason'], x['background']) for x in r['report']['regions']]" "$1"
}
date +%T
python3 -m earth2studio_compile.tools.bench.measure "$S" "$OUT/$MODEL-cold.json" 2>&1 | grep -v Warning | tail -5
summary "$OUT/$MODEL-cold.json"
start=$(date +%s)
while pgrep -f build_process > /dev/null && [ $(( $(date +%s) - start )) -lt "$WAIT" ]; do sleep 5; done
echo "builds ended or waited: $(( $(date +%s) - start )) s after the cold process; $(date +%T)"
mkdir -p "$OUT/logs"
for f in $(find "$A/.jobs" -name build.log); do cp "$f" "$OUT/logs/$MODEL-$(basename "$(dirname "$f")").log"; done
grep -h "Built\|ended\|failed\|Error" "$OUT"/logs/$MODEL-*.log | cut -c1-220
python3 -m earth2studio_compile.tools.bench.measure "$S" "$OUT/$MODEL-warm.json" 2>&1 | grep -v Warning | tail -5
summary "$OUT/$MODEL-warm.json"
date +%T

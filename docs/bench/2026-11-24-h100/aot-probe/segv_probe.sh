# Which processes can load an AOTInductor package on the GPU's torch 2.11? (exploration)
set -u
export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
P=docs/bench/2026-11-24-h100/aot-probe/aot_probe.py
python3 -c "
import torch
m = torch.nn.Sequential(torch.nn.Linear(8,8), torch.nn.ReLU()).cuda()
x = torch.randn(2,8,device='cuda')
ep = torch.export.export(m, (x,))
from torch._inductor import aoti_compile_and_package
for inso in (True, False):
    aoti_compile_and_package(ep, package_path=f'/tmp/tiny-{inso}.pt2', inductor_configs={'aot_inductor.package_constants_in_so': inso})
print('built tiny')
" 2>&1 | tail -2
load() {  # $1 package, $2 pre-import
  TORCHINDUCTOR_CACHE_DIR=/tmp/fresh-ind-$RANDOM timeout 120 python3 -X faulthandler -c "
import time; s0=time.perf_counter()
import torch
$2
t=time.perf_counter(); torch.zeros(1, device='cuda')
l = torch._C._aoti.AOTIModelPackageLoader('$1', 'model', False, 1, -1)
print('OK $1 [$2] loader', round(time.perf_counter()-t,3), 's, imports', round(t-s0,1), 's', len(l.get_constant_fqns()), 'constants')
" 2>&1 | grep -E "^OK|Fatal|Error" | head -2
}
load /tmp/tiny-True.pt2 "pass"
load /tmp/tiny-False.pt2 "pass"
load /tmp/tiny-False.pt2 "import torch._inductor"
python3 $P build fcn fp32 2>&1 | grep -E '_s"|Error'
load /tmp/aot-fcn-fp32.pt2 "pass"
load /tmp/aot-fcn-fp32.pt2 "import torch._inductor, torch._dynamo"
load /tmp/aot-fcn-fp32.pt2 "import earth2studio_compile.tools.zoo"
python3 $P load fcn fp32 2>&1 | tail -30

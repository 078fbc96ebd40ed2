# Does the AOTInductor loader need TORCHINDUCTOR_CACHE_DIR to exist? (exploration)
set -u
export PYTHONUNBUFFERED=1
python3 -c "
import torch
m = torch.nn.Sequential(torch.nn.Linear(8,8), torch.nn.ReLU()).cuda()
ep = torch.export.export(m, (torch.randn(2,8,device='cuda'),))
from torch._inductor import aoti_compile_and_package
aoti_compile_and_package(ep, package_path='/tmp/tiny-False.pt2', inductor_configs={'aot_inductor.package_constants_in_so': False})
" >/dev/null 2>&1
run() { timeout 120 python3 -X faulthandler -c "
import torch, time
torch.zeros(1, device='cuda'); t=time.perf_counter()
l = torch._C._aoti.AOTIModelPackageLoader('/tmp/tiny-False.pt2', 'model', False, 1, -1)
print('OK', round(time.perf_counter()-t, 3))" > /tmp/o.txt 2>&1; echo "rc=$? [$1] $(grep -c Fatal /tmp/o.txt) fatal $(grep OK /tmp/o.txt)"; }
d=/tmp/fresh-a-$RANDOM; export TORCHINDUCTOR_CACHE_DIR=$d; run "missing dir"
mkdir -p $d; run "dir exists"
unset TORCHINDUCTOR_CACHE_DIR; run "variable unset"
d=/tmp/fresh-b-$RANDOM/x/y; export TORCHINDUCTOR_CACHE_DIR=$d; mkdir -p $d; run "nested dir exists"

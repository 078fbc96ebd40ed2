# What must a process have imported before the AOTInductor package loader runs? (exploration)
set -u
export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
[ -f /tmp/tiny-False.pt2 ] || python3 -c "
import torch
m = torch.nn.Sequential(torch.nn.Linear(8,8), torch.nn.ReLU()).cuda()
ep = torch.export.export(m, (torch.randn(2,8,device='cuda'),))
from torch._inductor import aoti_compile_and_package
aoti_compile_and_package(ep, package_path='/tmp/tiny-False.pt2', inductor_configs={'aot_inductor.package_constants_in_so': False})
" >/dev/null 2>&1
for pre in "import numpy" "import numpy, torch; torch.tensor([1]).numpy()" "import earth2studio_compile" "import earth2studio" "import physicsnemo" "import torch_harmonics" "import zarr" "import xarray" "import earth2studio_compile.tools.zoo" "import torch; torch._C._aoti.AOTIModelPackageLoader.load_metadata_from_package('/tmp/tiny-False.pt2','model')"; do
TORCHINDUCTOR_CACHE_DIR=/tmp/fresh-ind-$RANDOM timeout 120 python3 -X faulthandler -c "
$pre
import torch, sys
torch.zeros(1, device='cuda')
l = torch._C._aoti.AOTIModelPackageLoader('/tmp/tiny-False.pt2', 'model', False, 1, -1)
print('OK after [$pre]', len(sys.modules), 'modules')
" > /tmp/o.txt 2>&1; echo "rc=$? [$pre] $(grep -c Fatal /tmp/o.txt) fatal $(grep OK /tmp/o.txt)"
done
python3 -c "import sys; import earth2studio_compile; import torch; print(sorted(m for m in sys.modules if m.startswith('torch._')) [:0])"
python3 -c "
import sys, torch; before=set(sys.modules)
import earth2studio_compile
print(sorted(m for m in set(sys.modules)-before if not m.startswith(('earth2studio','numpy','torch.','loguru','tqdm'))))" 2>&1 | tail -3

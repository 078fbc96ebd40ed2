# Which import makes the AOTInductor loader work on the GPU's torch 2.11? (exploration)
set -u
export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/site/earth2studio ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
[ -f /tmp/tiny-False.pt2 ] || echo "no tiny package"
for pre in "import earth2studio.models.px" "import physicsnemo.models.afno" "import physicsnemo.models.dlwp" "import torch_harmonics.examples" "import earth2studio.models.px, physicsnemo.models.afno" "import torch.distributed" "import torch._inductor.codecache, torch._inductor.graph" "from torch._inductor import aoti_load_package; import torch._inductor.package"; do
timeout 120 python3 -X faulthandler -c "
$pre
import torch, sys
torch.zeros(1, device='cuda')
l = torch._C._aoti.AOTIModelPackageLoader('/tmp/tiny-False.pt2', 'model', False, 1, -1)
print('OK', len(sys.modules))
" > /tmp/o.txt 2>&1; echo "rc=$? [$pre] $(grep -c Fatal /tmp/o.txt) fatal $(grep OK /tmp/o.txt)"
done

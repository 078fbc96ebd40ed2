"""The Song UNet's resampling convolutions (physicsnemo's ``Conv2d`` with
``up``/``down`` and ``resample_filter=[1, 1]``: depthwise, ``groups`` = channels,
stride 2), contiguous (NCHW) against channels-last (NHWC, Inductor's layout
optimization), TF32 on: does cuDNN's channels-last depthwise kernel explain the
compiled StormCast's convolutions (eager 530 ms a step, compiled 1351 ms)?

Written after the ninth session's device time; run in the tenth:
../2026-11-27-h100-tenth/resample-layout-12b5754.json.

    python3 resample_layout.py OUT.json
"""

import json
import sys

import torch
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
rows = []
for c, h, w in ((128, 512, 640), (256, 256, 320), (256, 128, 160), (256, 64, 80)):
    f = torch.ones(c, 1, 2, 2, device="cuda") / 4
    for op in ("down", "up"):
        for layout in ("nchw", "nhwc"):
            fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
            x = torch.randn(1, c, h, w, device="cuda").to(memory_format=fmt)
            weight = f.to(memory_format=fmt)

            def run(x=x, weight=weight, op=op, c=c):
                if op == "down":
                    return F.conv2d(x, weight, groups=c, stride=2)
                return F.conv_transpose2d(x, weight * 4, groups=c, stride=2)

            with torch.no_grad():
                for _ in range(3):
                    run()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
                for _ in range(20):
                    run()
                end.record()
                torch.cuda.synchronize()
            ms = start.elapsed_time(end) / 20
            rows.append(dict(op=op, c=c, h=h, w=w, layout=layout, ms=ms))
            print(rows[-1], flush=True)
            with open(sys.argv[1], "w") as out:
                json.dump(rows, out, indent=1)

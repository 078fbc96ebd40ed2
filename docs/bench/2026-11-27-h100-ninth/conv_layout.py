"""3x3 convolutions at StormCast's UNet sizes, TF32, contiguous (NCHW) against
channels-last (NHWC, Inductor's layout optimization for convolution graphs),
cudnn.benchmark off and on, then with TF32 off: does the layout or the
precision explain the compiled
StormCast's convolution time (eager 530 ms a step, compiled 1351 ms)?

    python3 conv_layout.py OUT.json
"""

import json
import sys

import torch

rows = []
for benchmark, tf32 in ((False, True), (True, True), (False, False)):
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    for c, h, w in ((128, 512, 640), (256, 256, 320), (256, 128, 160), (256, 64, 80)):
        conv = torch.nn.Conv2d(c, c, 3, padding=1).cuda()
        for layout in ("nchw", "nhwc"):
            fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
            m = conv.to(memory_format=fmt)
            x = torch.randn(1, c, h, w, device="cuda").to(memory_format=fmt)
            with torch.no_grad():
                for _ in range(3):
                    m(x)
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
                for _ in range(20):
                    m(x)
                end.record()
                torch.cuda.synchronize()
            ms = start.elapsed_time(end) / 20
            rows.append(
                dict(
                    benchmark=benchmark, tf32=tf32, c=c, h=h, w=w, layout=layout, ms=ms
                )
            )
            print(rows[-1], flush=True)
            json.dump(rows, open(sys.argv[1], "w"), indent=1)

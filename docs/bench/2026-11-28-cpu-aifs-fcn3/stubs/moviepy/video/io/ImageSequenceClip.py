"""Stub, NOT moviepy: makani.utils.visualize imports it for training videos only."""
class ImageSequenceClip:  # noqa: D101
    def __init__(self, *args, **kwargs):
        raise ImportError("moviepy stub")

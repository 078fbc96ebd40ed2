"""Stub, NOT wandb: makani imports it at module level for training-time logging only."""

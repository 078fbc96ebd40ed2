"""Runnable recipes: multi-process workflows with earth2studio-compile."""

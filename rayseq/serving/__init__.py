"""Serving: a Ray Serve + FastAPI chat endpoint over any rayseq checkpoint.

Depends on models + checkpoint only, never on ``rayseq.distributed`` (tests/test_import_layers.py forbids it): a
served model is a checkpoint read, not a training run.
"""
